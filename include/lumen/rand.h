/* lumen RAND: the Philox4x32-10 counter-based generator, bit-identical to cuRAND's Philox, and the
 * mapping from (seed, stream, element, run) to uniform floats in (0,1] that every backend's RAND
 * primitive reproduces (DESIGN.md §3). */
#ifndef LUMEN_RAND_H
#define LUMEN_RAND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Philox4x32-10 (Salmon et al., Random123): counter ctr[4], key key[2] -> out[4]. Word order is
 * cuRAND's uint4 (x, y, z, w) and uint2 (x, y). out may alias ctr. */
void lm_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* curand_uniform's conversion of a 32-bit word: (float)x * 2^-32 + 2^-33, in (0,1]. Identical for
 * every word on every evaluation method and contraction setting; 1.0f iff x >= 0xFFFFFF80. */
float lm_uniform_u32(uint32_t x);

/* lumen's RAND element mapping: key = (seed lo32, seed hi32); counter = (element>>2, stream,
 * run lo32, run hi32); lane = element & 3. Element indices must be < 2^34 (the group element>>2
 * fills one counter word); higher bits are ignored, so element wraps modulo 2^34.
 *
 * Equivalences (verified against cuRAND 10):
 * - cuRAND device API: curand_init(seed, subsequence = run, offset = (stream<<34) | element), then
 *   curand() / curand_uniform(), for stream < 2^30 (the offset is 64-bit). A CUDA kernel may use
 *   cuRAND's device Philox or an inline copy of this file.
 * - cuRAND host generator (curandCreateGeneratorHost, CURAND_RNG_PSEUDO_PHILOX4_32_10, any
 *   ordering) with seed `seed`: it emulates 65536 threads, one per subsequence, so its output at
 *   absolute index h = offset + i is the word at counter ((h>>2)>>16 in x|y, (h>>2) & 0xFFFF in z,
 *   0 in w), lane h & 3. Hence lm_rand_u32(seed, stream, element, run) is its word at
 *   h = (stream<<50) | ((element>>2)<<18) | (run<<2) | (element&3), for run < 2^16 and
 *   stream < 2^14. Consecutive elements are therefore NOT consecutive in the host generator's
 *   output beyond one 4-word group; only the first 4 words (counter 0) start both sequences. */
uint32_t lm_rand_u32(uint64_t seed, uint32_t stream, uint64_t element, uint64_t run);
float lm_rand_uniform(uint64_t seed, uint32_t stream, uint64_t element, uint64_t run);

/* out[i] = lm_rand_uniform(seed, stream, first + i, run) for i < n, computing each Philox block
 * once. out may be NULL when n == 0. */
void lm_rand_fill_uniform(uint64_t seed, uint32_t stream, uint64_t run, uint64_t first, float *out,
                          size_t n);

#ifdef __cplusplus
}
#endif

#endif /* LUMEN_RAND_H */
