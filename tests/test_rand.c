/* Tests for lumen's RAND (compiler/rand.c): Random123 known answers, bit-for-bit agreement with
 * cuRAND's host Philox generator (libcurand loaded with dlopen; the tests skip visibly without it),
 * the word-to-float conversion's range and edge words, and the block-wise fill. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lumen/rand.h"

/* ---- cuRAND host generator, loaded at run time (prototypes from curand.h, CUDA 13) ---------- */

#define CURAND_STATUS_OK 0
#define CURAND_RNG_PHILOX4_32_10 161 /* CURAND_RNG_PSEUDO_PHILOX4_32_10 */

typedef int (*curand_create_host_fn)(void **generator, int rng_type);
typedef int (*curand_set_seed_fn)(void *generator, unsigned long long seed);
typedef int (*curand_set_offset_fn)(void *generator, unsigned long long offset);
typedef int (*curand_generate_fn)(void *generator, unsigned int *out, size_t num);
typedef int (*curand_generate_uniform_fn)(void *generator, float *out, size_t num);
typedef int (*curand_destroy_fn)(void *generator);

struct curand_host {
    void *lib;
    void *gen;
    curand_create_host_fn create_host;
    curand_set_seed_fn set_seed;
    curand_set_offset_fn set_offset;
    curand_generate_fn generate;
    curand_generate_uniform_fn generate_uniform;
    curand_destroy_fn destroy;
};

static void *curand_try_open(char *tried, size_t tried_size)
{
    static const char *const names[] = {"libcurand.so.10", "libcurand.so"};
    const char *const roots[] = {getenv("LUMEN_CUDA_ROOT"), "/usr/local/cuda"};
    char paths[2 + 2 * 2 * 2][1024];
    size_t count = 0;
    for (size_t n = 0; n < 2; ++n) /* the dynamic loader's own search path first */
        snprintf(paths[count++], sizeof paths[0], "%s", names[n]);
    for (size_t r = 0; r < 2; ++r)
        for (size_t d = 0; d < 2 && roots[r] && roots[r][0]; ++d)
            for (size_t n = 0; n < 2; ++n)
                snprintf(paths[count++], sizeof paths[0], "%s/%s/%s", roots[r], d ? "lib" : "lib64",
                         names[n]);
    size_t used = 0;
    for (size_t i = 0; i < count; ++i) {
        void *lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (lib)
            return lib;
        const int wrote =
            snprintf(tried + used, tried_size - used, "%s%s", used ? ", " : "", paths[i]);
        if (wrote > 0 && (size_t)wrote < tried_size - used)
            used += (size_t)wrote;
    }
    return NULL;
}

static void *curand_symbol(void *lib, const char *name)
{
    void *sym = dlsym(lib, name);
    cr_assert_not_null(sym, "libcurand lacks %s", name);
    return sym;
}

/* Opens libcurand and a host Philox generator, or skips the calling test (never passes silently).
 */
static void curand_open_or_skip(struct curand_host *c)
{
    char tried[4096] = "";
    memset(c, 0, sizeof *c);
    c->lib = curand_try_open(tried, sizeof tried);
    if (!c->lib)
        cr_skip_test("libcurand not found: tried %s", tried);
    void *sym;
    sym = curand_symbol(c->lib, "curandCreateGeneratorHost");
    memcpy(&c->create_host, &sym, sizeof sym);
    sym = curand_symbol(c->lib, "curandSetPseudoRandomGeneratorSeed");
    memcpy(&c->set_seed, &sym, sizeof sym);
    sym = curand_symbol(c->lib, "curandSetGeneratorOffset");
    memcpy(&c->set_offset, &sym, sizeof sym);
    sym = curand_symbol(c->lib, "curandGenerate");
    memcpy(&c->generate, &sym, sizeof sym);
    sym = curand_symbol(c->lib, "curandGenerateUniform");
    memcpy(&c->generate_uniform, &sym, sizeof sym);
    sym = curand_symbol(c->lib, "curandDestroyGenerator");
    memcpy(&c->destroy, &sym, sizeof sym);
    int status = c->create_host(&c->gen, CURAND_RNG_PHILOX4_32_10);
    cr_assert_eq(status, CURAND_STATUS_OK, "curandCreateGeneratorHost(PHILOX4_32_10) failed: %d",
                 status);
}

static void curand_close(struct curand_host *c)
{
    if (c->gen)
        cr_expect_eq(c->destroy(c->gen), CURAND_STATUS_OK);
    /* the library stays loaded: unloading cuRAND is not what these tests are about */
}

/* The host generator's words and uniforms at absolute indices offset .. offset+n-1. */
static void curand_host_generate(struct curand_host *c, uint64_t seed, uint64_t offset, size_t n,
                                 uint32_t *words, float *uniforms)
{
    memset(words, 0xA5, n * sizeof *words); /* poison */
    memset(uniforms, 0xA5, n * sizeof *uniforms);
    cr_assert_eq(c->set_seed(c->gen, seed), CURAND_STATUS_OK);
    cr_assert_eq(c->set_offset(c->gen, offset), CURAND_STATUS_OK);
    cr_assert_eq(c->generate(c->gen, words, n), CURAND_STATUS_OK);
    cr_assert_eq(c->set_seed(c->gen, seed), CURAND_STATUS_OK);
    cr_assert_eq(c->set_offset(c->gen, offset), CURAND_STATUS_OK);
    cr_assert_eq(c->generate_uniform(c->gen, uniforms, n), CURAND_STATUS_OK);
}

/* ---- the host generator's layout, found empirically and documented in lumen/rand.h ----------
 * Absolute index h reads counter ((h>>2)>>16 in x|y, (h>>2) & 0xFFFF in z, 0 in w), lane h & 3:
 * in lumen's terms stream = h>>50, element = ((h>>18) mod 2^32)*4 + (h&3), run = (h>>2) & 0xFFFF.
 */

struct lm_coord {
    uint32_t stream;
    uint64_t element;
    uint64_t run;
};

static struct lm_coord host_index_to_lm(uint64_t h)
{
    struct lm_coord c;
    c.stream = (uint32_t)(h >> 50);
    c.element = (((h >> 18) & 0xFFFFFFFFu) << 2) | (h & 3u);
    c.run = (h >> 2) & 0xFFFFu;
    return c;
}

static uint64_t lm_to_host_index(uint32_t stream, uint64_t element, uint64_t run)
{
    cr_assert(stream < (1u << 14) && element < (UINT64_C(1) << 34) && run < (1u << 16),
              "coordinate outside what the host generator can address");
    return ((uint64_t)stream << 50) | ((element >> 2) << 18) | (run << 2) | (element & 3u);
}

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- Philox itself ------------------------------------------------------------------------- */

Test(rand, philox_matches_random123_known_answer_vectors)
{
    /* Random123 kat_vectors, philox4x32 10 rounds; also what cuRAND's curand_Philox4x32_10
     * returns for these inputs (checked with curand_philox4x32_x.h compiled for the host). */
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; ++i) {
        uint32_t out[4] = {0xA5A5A5A5u, 0xA5A5A5A5u, 0xA5A5A5A5u, 0xA5A5A5A5u};
        lm_philox4x32_10(kat[i].ctr, kat[i].key, out);
        for (int w = 0; w < 4; ++w)
            cr_expect_eq(out[w], kat[i].out[w],
                         "vector %zu word %d: got %08" PRIx32 " want %08" PRIx32, i, w, out[w],
                         kat[i].out[w]);
    }
}

Test(rand, philox_output_may_alias_counter)
{
    uint32_t ctr[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    const uint32_t key[2] = {0xa4093822, 0x299f31d0};
    lm_philox4x32_10(ctr, key, ctr);
    cr_expect(ctr[0] == 0xd16cfe09 && ctr[1] == 0x94fdcceb && ctr[2] == 0x5001e420 &&
              ctr[3] == 0x24126ea1);
}

Test(rand, rand_u32_reads_documented_counter_and_key_layout)
{
    /* key = seed halves; counter = (element>>2, stream, run lo, run hi); lane = element & 3;
     * elements wrap modulo 2^34. Covers what the host generator cannot reach (run >= 2^16,
     * streams >= 2^14); the device-API equivalence was checked with curand_kernel.h's
     * curand_init(seed, run, (stream<<34) | element) compiled for the host. */
    static const struct {
        uint64_t seed;
        uint32_t stream;
        uint64_t element, run;
    } cases[] = {
        {0x0123456789abcdefu, 0, 0, 0},
        {0xfedcba9876543210u, 0xffffffffu, (UINT64_C(1) << 34) - 1, UINT64_MAX},
        {42, 7, 0x2fffffffdu, UINT64_C(1) << 32},
        {UINT64_C(1) << 63, 0x10000u, 12345, 0x10001u},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const uint32_t key[2] = {(uint32_t)cases[i].seed, (uint32_t)(cases[i].seed >> 32)};
        const uint32_t ctr[4] = {(uint32_t)(cases[i].element >> 2), cases[i].stream,
                                 (uint32_t)cases[i].run, (uint32_t)(cases[i].run >> 32)};
        uint32_t block[4];
        lm_philox4x32_10(ctr, key, block);
        const uint32_t want = block[cases[i].element & 3u];
        cr_expect_eq(lm_rand_u32(cases[i].seed, cases[i].stream, cases[i].element, cases[i].run),
                     want, "case %zu", i);
        cr_expect_eq(lm_rand_u32(cases[i].seed, cases[i].stream,
                                 cases[i].element + (UINT64_C(1) << 34), cases[i].run),
                     want, "case %zu: element must wrap modulo 2^34", i);
        cr_expect_eq(float_bits(lm_rand_uniform(cases[i].seed, cases[i].stream, cases[i].element,
                                                cases[i].run)),
                     float_bits(lm_uniform_u32(want)), "case %zu", i);
    }
}

/* ---- against cuRAND's host generator ------------------------------------------------------- */

Test(rand, host_generator_words_and_uniforms_equal_lm_rand_at_mapped_coordinates)
{
    struct curand_host c;
    curand_open_or_skip(&c);
    static const uint64_t seeds[] = {
        0, 1, 0x5eed, UINT64_C(0x123456789abcdef0), UINT64_C(0xffffffff00000001), UINT64_MAX};
    static const struct {
        uint64_t offset;
        size_t n;
    } spans[] = {
        {0, 4099},                                              /* from counter 0 */
        {1, 5003},                                              /* unaligned start */
        {3, 7},                                                 /* short, crosses a group */
        {(UINT64_C(1) << 18) - 1001, 2003},                     /* run 0xFFFF -> element group 1 */
        {(UINT64_C(12345) << 18) + (777u << 2) + 2, 4097},      /* element group 12345, run 777 */
        {(UINT64_C(1) << 50) + 5, 3001},                        /* stream 1: counter word y = 1 */
        {(UINT64_C(5) << 50) + (UINT64_C(77) << 18) + 3, 2999}, /* stream 5, group 77 */
        {(UINT64_C(0x3fff) << 50) + (UINT64_C(0xfffffffe) << 18) + (65000u << 2) + 1,
         4001}, /* top stream, top groups */
    };
    size_t max_n = 0;
    for (size_t s = 0; s < sizeof spans / sizeof spans[0]; ++s)
        max_n = spans[s].n > max_n ? spans[s].n : max_n;
    uint32_t *words = malloc(max_n * sizeof *words), *want_words = malloc(max_n * sizeof *words);
    float *uniforms = malloc(max_n * sizeof *uniforms),
          *want_uniforms = malloc(max_n * sizeof *uniforms);
    cr_assert(words && want_words && uniforms && want_uniforms);

    for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; ++k) {
        for (size_t s = 0; s < sizeof spans / sizeof spans[0]; ++s) {
            const uint64_t offset = spans[s].offset;
            const size_t n = spans[s].n;
            curand_host_generate(&c, seeds[k], offset, n, words, uniforms);
            int stream_seen = 0;
            for (size_t i = 0; i < n; ++i) {
                const struct lm_coord at = host_index_to_lm(offset + i);
                stream_seen |= at.stream != 0;
                want_words[i] = lm_rand_u32(seeds[k], at.stream, at.element, at.run);
                want_uniforms[i] = lm_rand_uniform(seeds[k], at.stream, at.element, at.run);
            }
            cr_assert_eq(stream_seen, (offset >> 50) != 0);
            for (size_t i = 0; i < n; ++i) {
                if (words[i] != want_words[i] ||
                    float_bits(uniforms[i]) != float_bits(want_uniforms[i]))
                    cr_assert_fail("seed %" PRIx64 " offset %" PRIx64
                                   " index %zu: cuRAND %08" PRIx32 "/%a, lumen %08" PRIx32 "/%a",
                                   seeds[k], offset, i, words[i], (double)uniforms[i],
                                   want_words[i], (double)want_uniforms[i]);
            }
            cr_assert_eq(memcmp(words, want_words, n * sizeof *words), 0);
            cr_assert_eq(memcmp(uniforms, want_uniforms, n * sizeof *uniforms), 0);
        }
    }
    free(words);
    free(want_words);
    free(uniforms);
    free(want_uniforms);
    curand_close(&c);
}

Test(rand, stream_k_and_run_r_equal_host_generator_offset_k_shl_50_plus_r_shl_2)
{
    struct curand_host c;
    curand_open_or_skip(&c);
    static const uint32_t streams[] = {0, 1, 2, 3, 1000, 0x3fff};
    static const uint64_t groups[] = {0, 1, 5, UINT64_C(0xfffffffe), UINT64_C(0xffffffff)};
    static const uint64_t runs[] = {0, 1, 2, 65535};
    const uint64_t seed = UINT64_C(0xdeadbeefcafef00d);
    for (size_t s = 0; s < sizeof streams / sizeof streams[0]; ++s)
        for (size_t g = 0; g < sizeof groups / sizeof groups[0]; ++g)
            for (size_t r = 0; r < sizeof runs / sizeof runs[0]; ++r) {
                const uint64_t element = groups[g] << 2;
                uint32_t words[4];
                float uniforms[4];
                curand_host_generate(&c, seed, lm_to_host_index(streams[s], element, runs[r]), 4,
                                     words, uniforms);
                for (unsigned lane = 0; lane < 4; ++lane) {
                    cr_assert_eq(words[lane],
                                 lm_rand_u32(seed, streams[s], element + lane, runs[r]),
                                 "stream %" PRIu32 " element %" PRIu64 " run %" PRIu64, streams[s],
                                 element + lane, runs[r]);
                    cr_assert_eq(
                        float_bits(uniforms[lane]),
                        float_bits(lm_rand_uniform(seed, streams[s], element + lane, runs[r])));
                }
            }
    curand_close(&c);
}

Test(rand, host_uniforms_equal_lm_uniform_u32_of_host_words_including_edge_words)
{
    struct curand_host c;
    curand_open_or_skip(&c);
    /* Bulk: 2^18 (word, uniform) pairs. */
    const size_t n = (size_t)1 << 18;
    uint32_t *words = malloc(n * sizeof *words);
    float *uniforms = malloc(n * sizeof *uniforms);
    cr_assert(words && uniforms);
    curand_host_generate(&c, 0x0badc0de, 12345, n, words, uniforms);
    for (size_t i = 0; i < n; ++i)
        if (float_bits(uniforms[i]) != float_bits(lm_uniform_u32(words[i])))
            cr_assert_fail("word %08" PRIx32 ": cuRAND %a, lumen %a", words[i], (double)uniforms[i],
                           (double)lm_uniform_u32(words[i]));

    /* Edge words, located by a search over 2^28 host outputs for this seed. Each case asserts the
     * word really is an edge word, so a change upstream cannot turn the check into a no-op. */
    const uint64_t seed = UINT64_C(0x5eed1234abcd);
    static const struct {
        uint64_t offset;
        uint32_t lo, hi; /* the word lies in [lo, hi] */
        float uniform;
    } edges[] = {
        {52025184, 0xFFFFFF80u, 0xFFFFFFFFu, 1.0f}, /* rounds up to 1.0f */
        {90753442, 0xFFFFFF80u, 0xFFFFFFFFu, 1.0f},
        {165770702, 0xFFFFFF00u, 0xFFFFFF7Fu, 0x1.fffffep-1f}, /* largest value below 1 */
        {5392817, 0x10u, 0xFFu, 0.0f},                         /* tiny word: the 2^-33 term shows */
    };
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; ++e) {
        uint32_t w[9];
        float u[9];
        curand_host_generate(&c, seed, edges[e].offset - 4, 9, w, u);
        cr_assert(w[4] >= edges[e].lo && w[4] <= edges[e].hi, "edge %zu: word %08" PRIx32, e, w[4]);
        if (edges[e].uniform != 0.0f)
            cr_assert_eq(float_bits(u[4]), float_bits(edges[e].uniform), "edge %zu: %a", e,
                         (double)u[4]);
        for (int i = 0; i < 9; ++i) {
            cr_assert_eq(float_bits(u[i]), float_bits(lm_uniform_u32(w[i])), "edge %zu, i %d", e,
                         i);
            const struct lm_coord at = host_index_to_lm(edges[e].offset - 4 + (uint64_t)i);
            cr_assert_eq(w[i], lm_rand_u32(seed, at.stream, at.element, at.run));
        }
    }
    free(words);
    free(uniforms);
    curand_close(&c);
}

/* ---- the uniform conversion ---------------------------------------------------------------- */

Test(rand, uniform_u32_edge_words)
{
    cr_expect_eq(float_bits(lm_uniform_u32(0)), float_bits(0x1p-33f), "0 maps to 2^-33, not 0");
    cr_expect(lm_uniform_u32(0) > 0.0f);
    cr_expect_eq(float_bits(lm_uniform_u32(1)), float_bits(0x1.8p-32f));
    cr_expect_eq(float_bits(lm_uniform_u32(0xFFFFFFFFu)), float_bits(1.0f));
    cr_expect_eq(float_bits(lm_uniform_u32(0xFFFFFF80u)), float_bits(1.0f), "first word giving 1");
    cr_expect_eq(float_bits(lm_uniform_u32(0xFFFFFF7Fu)), float_bits(0x1.fffffep-1f));
    cr_expect_eq(float_bits(lm_uniform_u32(0x80000000u)), float_bits(0.5f));
    /* 0x80000080 is a tie in the word's rounding to float: ties-to-even goes down to 2^31. */
    cr_expect_eq(float_bits(lm_uniform_u32(0x80000080u)), float_bits(0.5f));
    cr_expect_eq(float_bits(lm_uniform_u32(0x80000180u)), float_bits(0x1.000004p-1f));
}

static void check_uniform_word(uint32_t x, float *previous)
{
    const float v = lm_uniform_u32(x);
    /* Independent path: the exact value float(x)*2^-32 + 2^-33 is representable in double, so
     * one rounding to float gives the correctly rounded result. */
    const double exact = (double)(float)x * 0x1p-32 + 0x1p-33;
    const float want = (float)exact;
    if (float_bits(v) != float_bits(want))
        cr_assert_fail("word %08" PRIx32 ": %a, want %a", x, (double)v, (double)want);
    if (!(v > 0.0f && v <= 1.0f))
        cr_assert_fail("word %08" PRIx32 ": %a outside (0,1]", x, (double)v);
    if ((v == 1.0f) != (x >= 0xFFFFFF80u))
        cr_assert_fail("word %08" PRIx32 ": 1.0f only for words >= 0xFFFFFF80, got %a", x,
                       (double)v);
    if (previous) {
        if (v < *previous)
            cr_assert_fail("word %08" PRIx32 ": not monotonic", x);
        *previous = v;
    }
}

Test(rand, uniform_u32_is_in_half_open_unit_interval_monotonic_and_one_only_at_the_top)
{
    const uint32_t span = 1u << 20;
    float previous = 0.0f;
    for (uint32_t x = 0; x < span; ++x) /* bottom: every word */
        check_uniform_word(x, &previous);
    previous = 0.0f;
    for (uint32_t x = 0xFFFFFFFFu - span + 1; x != 0; ++x) /* top: every word, up to 0xFFFFFFFF */
        check_uniform_word(x, &previous);
    for (int k = 1; k < 32; ++k) /* around each power of two, where float spacing changes */
        for (int64_t d = -600; d <= 600; ++d)
            check_uniform_word((uint32_t)((INT64_C(1) << k) + d), NULL);
    for (uint64_t x = 0; x <= 0xFFFFFFFFu; x += 65521) /* a prime stride across the rest */
        check_uniform_word((uint32_t)x, NULL);
}

/* ---- the block-wise fill ------------------------------------------------------------------- */

Test(rand, fill_uniform_matches_rand_uniform_for_unaligned_first_and_n)
{
    static const uint64_t firsts[] = {0,
                                      1,
                                      2,
                                      3,
                                      4,
                                      5,
                                      1021,
                                      (UINT64_C(1) << 32) + 3,
                                      (UINT64_C(1) << 34) - 6 /* wraps at 2^34 */};
    static const size_t ns[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 63, 1000, 1001};
    static const struct {
        uint64_t seed;
        uint32_t stream;
        uint64_t run;
    } keys[] = {
        {0, 0, 0}, {UINT64_C(0x123456789abcdef0), 3, 17}, {UINT64_MAX, 0xffffffffu, UINT64_MAX}};
    float out[1002];
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; ++k)
        for (size_t f = 0; f < sizeof firsts / sizeof firsts[0]; ++f)
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; ++j) {
                const size_t n = ns[j];
                memset(out, 0xA5, sizeof out); /* poison, and a guard word after the end */
                lm_rand_fill_uniform(keys[k].seed, keys[k].stream, keys[k].run, firsts[f], out, n);
                for (size_t i = 0; i < n; ++i) {
                    const float want =
                        lm_rand_uniform(keys[k].seed, keys[k].stream, firsts[f] + i, keys[k].run);
                    if (float_bits(out[i]) != float_bits(want))
                        cr_assert_fail("key %zu first %" PRIu64 " n %zu: index %zu differs", k,
                                       firsts[f], n, i);
                }
                cr_assert_eq(float_bits(out[n]), 0xA5A5A5A5u, "wrote past n = %zu", n);
            }
    lm_rand_fill_uniform(1, 2, 3, 4, NULL, 0); /* n == 0 never touches out */
}

Test(rand, fill_uniform_values_lie_in_unit_interval_with_mean_one_half)
{
    const size_t n = 200003;
    float *out = malloc(n * sizeof *out);
    cr_assert_not_null(out);
    memset(out, 0xA5, n * sizeof *out);
    lm_rand_fill_uniform(UINT64_C(0x9e3779b97f4a7c15), 11, 2, 7, out, n);
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        if (!(out[i] > 0.0f && out[i] <= 1.0f))
            cr_assert_fail("index %zu: %a outside (0,1]", i, (double)out[i]);
        sum += out[i];
    }
    /* Standard error of the mean is sqrt(1/12/n) ~ 6.5e-4; allow 6 of them (relative ~0.8%). */
    const double mean = sum / (double)n;
    cr_expect(mean > 0.5 - 0.0039 && mean < 0.5 + 0.0039, "mean %f", mean);
    free(out);
}
