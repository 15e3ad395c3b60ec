/* CPU implementation of lumen's RAND: Philox4x32-10 exactly as cuRAND computes it
 * (curand_philox4x32_x.h), curand_uniform's word-to-float conversion (curand_uniform.h), and the
 * (seed, stream, element, run) -> counter mapping documented in include/lumen/rand.h. */
#include "lumen/rand.h"

#include <float.h>

#define LM_PHILOX_W32_0 0x9E3779B9u /* key schedule increments (golden ratio, sqrt(3)-1) */
#define LM_PHILOX_W32_1 0xBB67AE85u
#define LM_PHILOX_M4X32_0 0xD2511F53u /* round multipliers */
#define LM_PHILOX_M4X32_1 0xCD9E8D57u
#define LM_PHILOX_ROUNDS 10

void lm_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t x = ctr[0], y = ctr[1], z = ctr[2], w = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < LM_PHILOX_ROUNDS; ++round) {
        if (round > 0) {
            k0 += LM_PHILOX_W32_0;
            k1 += LM_PHILOX_W32_1;
        }
        const uint64_t p0 = (uint64_t)LM_PHILOX_M4X32_0 * x;
        const uint64_t p1 = (uint64_t)LM_PHILOX_M4X32_1 * z;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        x = hi1 ^ y ^ k0;
        y = lo1;
        z = hi0 ^ w ^ k1;
        w = lo0;
    }
    out[0] = x;
    out[1] = y;
    out[2] = z;
    out[3] = w;
}

/* cuRAND computes, in float, x * CURAND_2POW32_INV + CURAND_2POW32_INV / 2, and the constant
 * 2.3283064e-10f is exactly 2^-32. The cast rounds the word to float once (to nearest even, like
 * cvt.rn.f32.u32); scaling by 2^-32 is exact, so FMA contraction cannot change the result; the sum
 * of the two floats is exact in double or wider, so a wider evaluation still rounds once. Where
 * FLT_EVAL_METHOD != 0 (x87) a cast may keep excess precision (gcc's GNU modes), so the two
 * roundings go through memory there. Checked for all 2^32 words against _curand_uniform. */
float lm_uniform_u32(uint32_t x)
{
#if FLT_EVAL_METHOD == 0
    const float word = (float)x;
    const float scaled = word * 0x1p-32f;
    return scaled + 0x1p-33f;
#else
    volatile float word = (float)x;
    const float scaled = word * 0x1p-32f;
    volatile float result = scaled + 0x1p-33f;
    return result;
#endif
}

static void lm_rand_counter(uint32_t stream, uint64_t group, uint64_t run, uint32_t ctr[4])
{
    ctr[0] = (uint32_t)group; /* element>>2; elements wrap modulo 2^34 */
    ctr[1] = stream;
    ctr[2] = (uint32_t)run;
    ctr[3] = (uint32_t)(run >> 32);
}

static void lm_rand_key(uint64_t seed, uint32_t key[2])
{
    key[0] = (uint32_t)seed;
    key[1] = (uint32_t)(seed >> 32);
}

uint32_t lm_rand_u32(uint64_t seed, uint32_t stream, uint64_t element, uint64_t run)
{
    uint32_t key[2], ctr[4], block[4];
    lm_rand_key(seed, key);
    lm_rand_counter(stream, element >> 2, run, ctr);
    lm_philox4x32_10(ctr, key, block);
    return block[element & 3u];
}

float lm_rand_uniform(uint64_t seed, uint32_t stream, uint64_t element, uint64_t run)
{
    return lm_uniform_u32(lm_rand_u32(seed, stream, element, run));
}

void lm_rand_fill_uniform(uint64_t seed, uint32_t stream, uint64_t run, uint64_t first, float *out,
                          size_t n)
{
    uint32_t key[2], ctr[4], block[4];
    lm_rand_key(seed, key);
    uint64_t element = first;
    size_t i = 0;
    while (i < n) {
        lm_rand_counter(stream, element >> 2, run, ctr);
        lm_philox4x32_10(ctr, key, block);
        for (unsigned lane = (unsigned)(element & 3u); lane < 4u && i < n; ++lane, ++i, ++element)
            out[i] = lm_uniform_u32(block[lane]);
    }
}
