/* compiler/render.c — the C-style renderer for every dialect (render.h): the per-language
 * table, the shared prelude helpers (floor division, the Philox uniform of rand.c), and the
 * walk over a kernel's blocks that prints loops, SSA locals and index expressions. Statements
 * used once in their own block are inlined into their user; dead ones are not printed. */
#include "render.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the per-language table */

static const char c_prelude[] =
    "/* lumen kernels: C dialect */\n"
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "#if defined(__clang__)\n"
    "#pragma STDC FP_CONTRACT OFF\n"
    "#endif\n"
    "/* local arrays on a cache line: the stack's offset differs by thread and process (the main\n"
    " * thread's is random), and an accumulator row of 16-byte alignment splits every other\n"
    " * 32-byte access across two lines (a 256^3 matmul: 0.43 to 0.52 ms from process to process) */\n"
    "#if defined(__GNUC__)\n"
    "#define LM_EXPORT __attribute__((visibility(\"default\")))\n"
    "#define LM_HELPER static inline __attribute__((unused, always_inline))\n"
    "#define LM_LOCAL __attribute__((aligned(64)))\n"
    "#else\n"
    "#define LM_EXPORT\n"
    "#define LM_HELPER static inline\n"
    "#define LM_LOCAL\n"
    "#endif\n"
    "/* a loop over SIMD lanes: vectorised whole, never unrolled first (a fully unrolled lane loop\n"
    " * leaves the vectoriser nothing to work on); its iterations are independent by construction\n"
    " * (compiler/lanes.c: each lane touches its own env's elements), which a long body's\n"
    " * accesses are too many for the vectoriser to prove */\n"
    "#if defined(__clang__)\n"
    "#define LM_LANES _Pragma(\"clang loop unroll(disable) vectorize(assume_safety)\")\n"
    "#elif defined(__GNUC__)\n"
    "#define LM_LANES _Pragma(\"GCC ivdep\")\n"
    "#else\n"
    "#define LM_LANES\n"
    "#endif\n"
    "/* a point loop of at most 16 accumulators inside a reduction (a 16-filter convolution):\n"
    " * vectorised eight wide. Left to clang at 16 wide (AVX-512), its one vector iteration kept\n"
    " * the accumulator arrays in memory, a store per FMA (render.c, narrow_point) */\n"
    "#if defined(__clang__)\n"
    "#define LM_NARROW _Pragma(\"clang loop vectorize_width(8)\")\n"
    "#else\n"
    "#define LM_NARROW\n"
    "#endif\n"
    "/* exp2 and log2 through expf and logf: C compilers vectorise those with libmvec and not\n"
    " * exp2f/log2f; the result differs from exp2f/log2f by a few ulp (|x ln2| * 2^-24 for exp2). */\n"
    "LM_HELPER float lm_exp2(float x) { return expf(x * 0.693147180559945309f); }\n"
    "LM_HELPER float lm_log2(float x) { return logf(x) * 1.44269504088896341f; }\n"
    "/* fmodf(a, b) for |b| a power of two >= 1, exactly: a / b is exact, trunc(a / b) * b is a\n"
    " * float no larger than |a|, their difference is fmod's result (representable, so exact) and\n"
    " * keeps a's sign as fmod does (-0 included); inf and NaN give NaN. Unlike fmodf it vectorises. */\n"
    "LM_HELPER float lm_fmod_p2(float a, float b) { return copysignf(a - truncf(a / b) * b, a); }\n"
    "/* the lowest set bit of a nonzero mask: the next lane of a sparse loop (compiler/lazy.c) */\n"
    "#if defined(__GNUC__)\n"
    "#define lm_ctz64(m) ((int64_t)__builtin_ctzll(m))\n"
    "#else\n"
    "LM_HELPER int64_t lm_ctz64(uint64_t m) { int64_t i = 0; for (; !(m & 1); m >>= 1) i++; return i; }\n"
    "#endif\n"
    "/* the search's vector variant (compiler/search/vec.c): a vec loop runs eight iterations at a\n"
    " * time as lm_v8 values, loaded and stored at any float alignment; a kernel the search measured\n"
    " * with FMAs opens with LM_CONTRACT (clang; gcc: an optimize pragma around the kernel) */\n"
    "#if defined(__GNUC__)\n"
    "typedef float lm_v8 __attribute__((vector_size(32), aligned(4), may_alias));\n"
    "#define lm_splat8(s) ((lm_v8){(s), (s), (s), (s), (s), (s), (s), (s)}) /* a pure scalar */\n"
    "#endif\n"
    "/* a 16 x 16 tile of floats transposed: d[c*ds + l] = s[l*ss + c] (render.c, tile_loop): rows\n"
    " * loaded whole, four rounds of two-vector shuffles (blocks of 8, 4, 2, 1 columns exchanged\n"
    " * with the row that far below), columns stored whole; element by element elsewhere */\n"
    "#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)\n"
    "typedef float lm_v16 __attribute__((vector_size(64), aligned(4), may_alias));\n"
    "#define LM_TR_ROUND(b, ...) \\\n"
    "  for (int i = 0; i < 16; i++) \\\n"
    "    if (!(i & b)) { \\\n"
    "      const lm_v16 lo = __builtin_shufflevector(r[i], r[i + b], __VA_ARGS__); \\\n"
    "      r[i + b] = __builtin_shufflevector(r[i], r[i + b], LM_TR_HI_##b); \\\n"
    "      r[i] = lo; \\\n"
    "    }\n"
    "#define LM_TR_HI_8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31\n"
    "#define LM_TR_HI_4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31\n"
    "#define LM_TR_HI_2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31\n"
    "#define LM_TR_HI_1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31\n"
    "LM_HELPER void lm_tr16(float *restrict d, int64_t ds, const float *restrict s, int64_t ss) {\n"
    "  lm_v16 r[16];\n"
    "  for (int i = 0; i < 16; i++) r[i] = *(const lm_v16 *)(s + i * ss);\n"
    "  LM_TR_ROUND(8, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)\n"
    "  LM_TR_ROUND(4, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)\n"
    "  LM_TR_ROUND(2, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)\n"
    "  LM_TR_ROUND(1, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)\n"
    "  for (int i = 0; i < 16; i++) *(lm_v16 *)(d + i * ds) = r[i];\n"
    "}\n"
    "#else\n"
    "LM_HELPER void lm_tr16(float *restrict d, int64_t ds, const float *restrict s, int64_t ss) {\n"
    "  for (int c = 0; c < 16; c++)\n"
    "    for (int l = 0; l < 16; l++) d[c * ds + l] = s[l * ss + c];\n"
    "}\n"
    "#endif\n"
    "#if defined(__clang__)\n"
    "#define LM_CONTRACT _Pragma(\"clang fp contract(fast)\")\n"
    "#else\n"
    "#define LM_CONTRACT\n"
    "#endif\n"
    "/* a contracting kernel's reduction into a few accumulators may also be summed in another\n"
    " * order (clang: vectorised, several partial sums), where in order it waits on each add\n"
    " * (render.c, latency_bound) */\n"
    "#if defined(__clang__)\n"
    "#define LM_REASSOC _Pragma(\"clang fp reassociate(on)\")\n"
    "#else\n"
    "#define LM_REASSOC\n"
    "#endif\n"
    "/* a graph that allows contraction has given up the reference's bits: its kernels also run\n"
    " * with subnormals flushed to zero (MXCSR FTZ and DAZ, restored on return). A subnormal\n"
    " * operand costs an x86 core a microcode assist; PPO's gradients drift into them as a policy\n"
    " * trains (MinAtar Breakout: iterations 0.354 s early, 0.374 s after 40 without, 0.359 s with) */\n"
    "#if defined(__SSE__) && (defined(__GNUC__) || defined(__clang__))\n"
    "#include <xmmintrin.h>\n"
    "#define LM_FLUSH_ON const unsigned lm_csr = _mm_getcsr(); _mm_setcsr(lm_csr | 0x8040u);\n"
    "#define LM_FLUSH_OFF _mm_setcsr(lm_csr);\n"
    "#else\n"
    "#define LM_FLUSH_ON\n"
    "#define LM_FLUSH_OFF\n"
    "#endif\n"
    "/* exp2 as lm_exp2_v8 below computes it, one value at a time (plain C, which the C compiler\n"
    " * vectorises inline): in kernels that allow contraction, which have given up the reference's\n"
    " * bits, and in a fused scan of such a graph, in place of lm_exp2's libmvec call (PPO's tanh:\n"
    " * 15% of a CartPole training profile) */\n"
    "LM_HELPER float lm_exp2_c(float x) {\n"
    "  LM_CONTRACT\n"
    "  union { float f; int32_t i; } t, s1, s2;\n"
    "  x = x > 160.0f ? 160.0f : x < -160.0f ? -160.0f : x;\n"
    "  t.f = x + 12582912.0f;\n"
    "  const float f = x - (t.f - 12582912.0f);\n"
    "  float p = f * 1.535336188319500e-4f + 1.339887440266574e-3f;\n"
    "  p = p * f + 9.618437357674640e-3f;\n"
    "  p = p * f + 5.550332471162809e-2f;\n"
    "  p = p * f + 2.402264791363012e-1f;\n"
    "  p = p * f + 6.931472028550421e-1f;\n"
    "  p = p * f + 1.0f;\n"
    "  const int32_t n = t.i - 0x4B400000, n1 = n >> 1, n2 = n - n1;\n"
    "  s1.i = (n1 + 127) << 23;\n"
    "  s2.i = (n2 + 127) << 23;\n"
    "  return p * s1.f * s2.f;\n"
    "}\n"
    "/* log2 one value at a time in plain C, for kernels that allow contraction (flushed\n"
    " * subnormals), in place of libm's logf: the C compiler's vector form of this computes the\n"
    " * same bits as its scalar form, where libmvec's logf and libm's differ by up to 4 ulp, so a\n"
    " * value does not depend on whether a vectorised loop's body or its remainder ran it (on how\n"
    " * many rows a batch has, and where a rank's part of it starts). x = 2^e m, m in [sqrt(1/2),\n"
    " * sqrt(2)), log(m) = t - t^2/2 + t^3 p(t) with t = m - 1 and Cephes' degree-8 p; within\n"
    " * 1.3 ulp of log2 (2^24 random floats); 0 and subnormals give -inf, x < 0 and NaN NaN. */\n"
    "LM_HELPER float lm_log2_c(float x) {\n"
    "  LM_CONTRACT\n"
    "  union { float f; int32_t i; } u, m;\n"
    "  u.f = x;\n"
    "  const int32_t bits = u.i & 0x7F800000;\n"
    "  m.i = (u.i & 0x007FFFFF) | 0x3F800000;\n"
    "  const int32_t big = m.f > 1.41421356f;\n"
    "  m.f = big ? m.f * 0.5f : m.f;\n"
    "  const float e = (float)((bits >> 23) - 127 + big);\n"
    "  const float t = m.f - 1.0f, z = t * t;\n"
    "  float p = 7.0376836292e-2f;\n"
    "  p = p * t - 1.1514610310e-1f;\n"
    "  p = p * t + 1.1676998740e-1f;\n"
    "  p = p * t - 1.2420140846e-1f;\n"
    "  p = p * t + 1.4249322787e-1f;\n"
    "  p = p * t - 1.6668057665e-1f;\n"
    "  p = p * t + 2.0000714765e-1f;\n"
    "  p = p * t - 2.4999993993e-1f;\n"
    "  p = p * t + 3.3333331174e-1f;\n"
    "  const float y = t * z * p - 0.5f * z; /* log(m) - t; log2(m) = (t + y) (1 + 0.4427...) */\n"
    "  float r = y * 0.44269504088896341f;\n"
    "  r += t * 0.44269504088896341f;\n"
    "  r += y;\n"
    "  r += t;\n"
    "  r += e;\n"
    "  return bits == 0 ? -INFINITY : x < 0.0f ? NAN : bits == 0x7F800000 ? x + x : r;\n"
    "}\n"
    "/* exp2 of eight lanes (a vec loop's tanh and softmax): 2^n p(f) with n = round(x), f = x - n\n"
    " * in [-1/2, 1/2] and p a degree-6 polynomial, within 6e-7 of exp2 (relative) where the result\n"
    " * is normal; 2^n goes on in two halves, so subnormal results and overflow to inf come out as\n"
    " * exp2's; x is clamped to [-160, 160] first (NaN stays NaN). 1.5 * 2^23 added rounds x. A\n"
    " * libmvec call in a loop of register tiles costs more: the tile's lanes spill around it. */\n"
    "#if defined(__GNUC__)\n"
    "#if defined(__clang__) /* inlined always, and entry points take pointers: no call passes a vector */\n"
    "#pragma clang diagnostic ignored \"-Wunknown-warning-option\"\n"
    "#endif\n"
    "#pragma GCC diagnostic ignored \"-Wpsabi\"\n"
    "typedef int32_t lm_i8 __attribute__((vector_size(32), aligned(4), may_alias));\n"
    "LM_HELPER lm_v8 lm_exp2_v8(lm_v8 x) {\n"
    "  LM_CONTRACT\n"
    "  const lm_v8 hi = lm_splat8(160.0f), lo = lm_splat8(-160.0f), magic = lm_splat8(12582912.0f);\n"
    "  lm_i8 m = x > hi;\n"
    "  x = (lm_v8)(((lm_i8)hi & m) | ((lm_i8)x & ~m));\n"
    "  m = x < lo;\n"
    "  x = (lm_v8)(((lm_i8)lo & m) | ((lm_i8)x & ~m));\n"
    "  lm_v8 t = x + magic, f = x - (t - magic);\n"
    "  lm_v8 p = f * 1.535336188319500e-4f + 1.339887440266574e-3f;\n"
    "  p = p * f + 9.618437357674640e-3f;\n"
    "  p = p * f + 5.550332471162809e-2f;\n"
    "  p = p * f + 2.402264791363012e-1f;\n"
    "  p = p * f + 6.931472028550421e-1f;\n"
    "  p = p * f + 1.0f;\n"
    "  lm_i8 n = (lm_i8)t - 0x4B400000, n1 = n >> 1, n2 = n - n1;\n"
    "  return p * (lm_v8)((n1 + 127) << 23) * (lm_v8)((n2 + 127) << 23);\n"
    "}\n"
    "#endif\n";

static const char cuda_prelude[] =
    "/* lumen kernels: CUDA dialect (NVRTC; compile with --fmad=false) */\n"
    "__device__ __forceinline__ float lm_add(float a, float b) { return a + b; }\n";

static const char opencl_prelude[] =
    "/* lumen kernels: OpenCL C 1.2 dialect */\n"
    "#pragma OPENCL FP_CONTRACT OFF\n";

/* Metal contracts a*b+c into an FMA even with fast math off (MTLMathModeSafe): only the
 * contract pragma keeps the reference's separate roundings. Compilers that do not know a
 * pragma ignore it. */
static const char msl_prelude[] =
    "/* lumen kernels: Metal Shading Language dialect (compile with fast math off) */\n"
    "#include <metal_stdlib>\n"
    "using namespace metal;\n"
    "#pragma METAL fp math_mode(safe)\n"
    "#pragma METAL fp contract(off)\n";

static const lm_dialect_info dialects[] = {
    [LM_DIALECT_C] = {
        .name = "c",
        .kernel_qual = "LM_EXPORT ",
        .func_qual = "LM_HELPER",
        .global_qual = "",
        .restrict_kw = "restrict",
        .i64 = "int64_t",
        .u32 = "uint32_t",
        .u64 = "uint64_t",
        .math = {"lm_log2", "lm_exp2", "sinf", "sqrtf", "fmodf", "fmaxf"},
        .inf = "INFINITY",
        .nan = "NAN",
        .barrier = NULL,
        .shared_qual = NULL,
        .global_id = NULL,
        .prelude = c_prelude,
    },
    [LM_DIALECT_CUDA] = {
        .name = "cuda",
        .kernel_qual = "extern \"C\" __global__ ",
        .func_qual = "__device__ __forceinline__",
        .global_qual = "",
        .restrict_kw = "__restrict__",
        .i64 = "long long",
        .u32 = "unsigned int",
        .u64 = "unsigned long long",
        .math = {"log2f", "exp2f", "sinf", "sqrtf", "fmodf", "fmaxf"},
        .inf = "__int_as_float(0x7f800000)",
        .nan = "__int_as_float(0x7fffffff)",
        .barrier = "__syncthreads();",
        .shared_qual = "__shared__",
        .global_id = "(long long)blockIdx.x * blockDim.x + threadIdx.x",
        .local_id = "threadIdx.x",
        .group_id = "blockIdx.x",
        .local_size = "blockDim.x",
        .prelude = cuda_prelude,
    },
    [LM_DIALECT_OPENCL] = {
        .name = "opencl",
        .kernel_qual = "__kernel ",
        .func_qual = "static inline",
        .global_qual = "__global ",
        .restrict_kw = "restrict",
        .i64 = "long",
        .u32 = "uint",
        .u64 = "ulong",
        .math = {"log2", "exp2", "sin", "sqrt", "fmod", "fmax"},
        .inf = "INFINITY",
        .nan = "NAN",
        .barrier = "barrier(CLK_LOCAL_MEM_FENCE);",
        .shared_qual = "__local",
        .global_id = "(long)get_global_id(0)",
        .local_id = "get_local_id(0)",
        .group_id = "get_group_id(0)",
        .local_size = "get_local_size(0)",
        .prelude = opencl_prelude,
    },
    [LM_DIALECT_MSL] = {
        .name = "msl",
        .kernel_qual = "kernel ",
        .func_qual = "static inline",
        .global_qual = "device ",
        .restrict_kw = "",
        .i64 = "long",
        .u32 = "uint",
        .u64 = "ulong",
        .math = {"metal::precise::log2", "metal::precise::exp2", "metal::precise::sin",
                 "metal::precise::sqrt", "metal::precise::fmod", "metal::precise::fmax"},
        .inf = "INFINITY",
        .nan = "NAN",
        .barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);",
        .shared_qual = "threadgroup",
        .global_id = "(long)tid", /* tid: the [[thread_position_in_grid]] parameter */
        .local_id = "lid",        /* [[thread_position_in_threadgroup]] */
        .group_id = "gidx",       /* [[threadgroup_position_in_grid]] */
        .local_size = "lsize",    /* [[threads_per_threadgroup]] */
        .prelude = msl_prelude,
    },
};
_Static_assert(LM_COUNTOF(dialects) == LM_DIALECT_COUNT, "one table row per dialect");

const lm_dialect_info *lm_dialect_get(lm_dialect d) {
  return (unsigned)d < LM_DIALECT_COUNT ? &dialects[d] : NULL;
}

const char *lm_dialect_name(lm_dialect d) {
  return (unsigned)d < LM_DIALECT_COUNT ? dialects[d].name : "unknown dialect";
}

const char *lm_render_entry_name(const lm_kernel *k, char *buf, size_t cap) {
  if (!cap) return buf;
  size_t n = 0;
  const char *s = k->name;
  size_t len = strnlen(s, sizeof k->name);
  if (len == 0 || (s[0] >= '0' && s[0] <= '9'))
    for (const char *p = "k_"; *p && n + 1 < cap; p++) buf[n++] = *p;
  for (size_t i = 0; i < len && n + 1 < cap; i++) {
    char c = s[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    buf[n++] = ok ? c : '_';
  }
  buf[n] = 0;
  return buf;
}

/* ---------------------------------------------------------------- prelude */

/* The helpers every dialect shares, spelled with the row's types. The Philox and the float
 * conversion follow compiler/rand.c step by step (integer rounding, so no evaluation method,
 * contraction or fast-math mode can change a bit). */
static void emit_helpers(lm_sb *sb, const lm_dialect_info *d) {
  const char *q = d->func_qual, *I = d->i64, *U = d->u32, *L = d->u64;
  lm_sb_printf(sb,
               "/* floor division and modulo (b > 0) of index expressions that may be negative */\n"
               "%s %s lm_floordiv(%s a, %s b) {\n"
               "  const %s q = a / b;\n"
               "  return (a %% b != 0 && a < 0) ? q - 1 : q;\n"
               "}\n"
               "%s %s lm_floormod(%s a, %s b) {\n"
               "  const %s m = a %% b;\n"
               "  return m < 0 ? m + b : m;\n"
               "}\n",
               q, I, I, I, I, q, I, I, I, I);
  lm_sb_printf(sb,
               "/* m rounded to float's 24 significant bits (to nearest, ties to even), in integers */\n"
               "%s %s lm_round24(%s m) {\n"
               "  int s = 0;\n"
               "  while ((m >> s) >= (%s)0x1000000) s++;\n"
               "  if (s == 0) return m;\n"
               "  const %s kept = m >> s, dropped = m & (((%s)1 << s) - 1), tie = (%s)1 << (s - 1);\n"
               "  return (kept + ((dropped > tie || (dropped == tie && (kept & 1))) ? 1 : 0)) << s;\n"
               "}\n",
               q, L, L, L, L, L, L);
  lm_sb_printf(sb,
               "/* lm_rand_uniform (compiler/rand.c): Philox4x32-10 with key = seed, counter =\n"
               " * (element >> 2, stream, run lo, run hi), word element & 3, mapped to (0,1] as\n"
               " * curand_uniform does: float(word) * 2^-32 + 2^-33, rounded to float */\n"
               "%s float lm_philox_uniform(%s seed, %s stream, %s element, %s run) {\n"
               "  %s x = (%s)(element >> 2), y = stream, z = (%s)run, w = (%s)(run >> 32);\n"
               "  %s k0 = (%s)seed, k1 = (%s)(seed >> 32);\n"
               "  for (int i = 0; i < 10; i++) {\n"
               "    if (i > 0) {\n"
               "      k0 += 0x9E3779B9u;\n"
               "      k1 += 0xBB67AE85u;\n"
               "    }\n"
               "    const %s p0 = (%s)0xD2511F53u * x, p1 = (%s)0xCD9E8D57u * z;\n"
               "    const %s nx = (%s)(p1 >> 32) ^ y ^ k0, nz = (%s)(p0 >> 32) ^ w ^ k1;\n"
               "    y = (%s)p1;\n"
               "    w = (%s)p0;\n"
               "    x = nx;\n"
               "    z = nz;\n"
               "  }\n"
               "  const %s lane = (%s)(element & 3), word = lane == 0 ? x : lane == 1 ? y : lane == 2 ? z : w;\n"
               "  const %s sum = lm_round24(2 * lm_round24(word) + 1);\n"
               "  return (float)sum * 1.16415322e-10f; /* 2^-33; sum has <= 24 bits: exact */\n"
               "}\n",
               q, L, U, L, L, U, U, U, U, U, U, U, L, L, L, U, U, U, U, U, U, U, L);
}

/* The C dialect draws RAND through the counter group and the word separately, so the four
 * draws of one group (an env's reset of four state values, say) compute one Philox block the
 * C compiler can share; helpers are always inlined and the word is picked by selects (no
 * switch), so a loop drawing one per iteration vectorises; the float conversion is IEEE single arithmetic with contraction off,
 * which is curand_uniform's float(word) * 2^-32 + 2^-33 exactly (as lm_round24's form). */
static const char c_philox[] =
    "LM_HELPER float lm_philox_u(uint64_t seed, uint32_t stream, uint64_t group, uint32_t lane, uint64_t run) {\n"
    "  uint32_t x = (uint32_t)group, y = stream, z = (uint32_t)run, w = (uint32_t)(run >> 32);\n"
    "  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);\n"
    "  for (int i = 0; i < 10; i++) {\n"
    "    if (i > 0) {\n"
    "      k0 += 0x9E3779B9u;\n"
    "      k1 += 0xBB67AE85u;\n"
    "    }\n"
    "    const uint64_t p0 = (uint64_t)0xD2511F53u * x, p1 = (uint64_t)0xCD9E8D57u * z;\n"
    "    const uint32_t nx = (uint32_t)(p1 >> 32) ^ y ^ k0, nz = (uint32_t)(p0 >> 32) ^ w ^ k1;\n"
    "    y = (uint32_t)p1;\n"
    "    w = (uint32_t)p0;\n"
    "    x = nx;\n"
    "    z = nz;\n"
    "  }\n"
    "  const uint32_t lo = (lane & 1) ? y : x, hi = (lane & 1) ? w : z, word = (lane & 2) ? hi : lo;\n"
    "  return (float)word * 2.3283064365386963e-10f + 1.16415321826934814e-10f;\n"
    "}\n";

static void emit_prelude(lm_sb *sb, const lm_dialect_info *d) {
  lm_sb_puts(sb, d->prelude);
  lm_sb_puts(sb, "\n");
  emit_helpers(sb, d);
  if (d == &dialects[LM_DIALECT_C]) lm_sb_puts(sb, c_philox);
}

/* ---------------------------------------------------------------- kernel analysis */


_Static_assert(LM_S_SQRT - LM_S_LOG2 == LM_MATH_SQRT - LM_MATH_LOG2 && LM_S_EXP2 - LM_S_LOG2 == LM_MATH_EXP2 &&
                   LM_S_SIN - LM_S_LOG2 == LM_MATH_SIN,
               "unary statements map onto lm_math in order");

static int is_update(uint8_t op) { return op == LM_S_ACC_SUM || op == LM_S_ACC_MAX; }
static int has_value(uint8_t op) {
  return op < LM_S_COUNT && op != LM_S_STORE && op != LM_S_BARRIER && !is_update(op);
}
/* Computes a value and changes nothing: may move within its block and be inlined. (A warp
 * reduction talks to the other threads of its warp: it stays where it is.) */
static int is_pure(uint8_t op) { return has_value(op) && op != LM_S_ACC && op != LM_S_WARP_SUM && op != LM_S_WARP_MAX; }

typedef struct rk {
  lm_exprs *x;
  const lm_plan *p;
  const lm_kernel *k;
  const lm_dialect_info *d;
  lm_dialect dia;
  int flat;         /* GPU dialects: the parallel loops are one flattened thread index */
  lm_expr *ext;     /* per loop: extent (for range proofs) */
  lm_xctx xc;
  lm_expr zero;
  uint8_t *live;    /* per statement */
  uint8_t *inl;     /* per statement: printed inside its user */
  uint32_t *uses;   /* per statement: reads by live statements */
  uint32_t *user;   /* per statement: its (last) reader */
  int32_t *blk;     /* per statement: loop of the block holding it, -1 root, -2 none */
  int reassoc;      /* printing inside a block under LM_REASSOC (latency_bound) */
  int32_t split_l;  /* the point loop printed as two loops (point_fission), -1 none */
  size_t split_from, split_to; /* the items of its body the loop being printed runs */
  int no_sr;        /* no running remainders: indices computed from the point (point_fission) */
  uint32_t *pos;    /* per statement: item index in that block */
  uint8_t *lseen;   /* per loop: reached from the root block */
  uint8_t *varuse;  /* per loop: variable printed */
  uint8_t *bufrd, *bufwr; /* per plan buffer */
  uint8_t *symuse;  /* per symbol */
  uint8_t *vary;    /* per statement: eight lanes of a vec loop (C dialect) */
  uint8_t *spec;    /* per statement: a guarded load read unconditionally (see choose_speculation) */
  uint32_t *lfill;  /* finite kernels, per local array: the value its one live lane store writes,
                     * else UINT32_MAX (fill_locals) */
  int32_t *lloop;   /* and the loop of that store */
  uint8_t *flagged; /* finite kernels, per statement: fin_flag's answer once known, 0 unknown,
                     * 1 no, 2 yes */
  /* C dialect: modulos by a symbolic divisor of an index that steps by the same amount each
   * iteration of an open loop, kept as a running remainder q<loop>_<n> (strength_reduce) */
  struct srmod {
    lm_expr mod, a0, d;
    int32_t loop;
    int used;
  } *sr;
  size_t nsr, srcap;
  char **symname;   /* per symbol: s_<sanitised name> */
  int use_r;
  int bad;
  /* the lane blocks' tail guards (env < E, see find_tails); with full set they print as 1 */
  lm_expr *tail;
  int ntail, tailcap, full;
  /* C dialect, a column loop printed in tiles (tile_loop): per statement, 1 + the tile a strided
   * global access reads or writes instead of its buffer, else 0; tile_j and tile_l the loops */
  uint8_t *tiled;
  int32_t tile_j, tile_l;
  int64_t tile_w;
  lm_expr tail_e;
  int64_t tail_l;
  char why[160];
} rk;

static void fail(rk *r, const char *fmt, ...) LM_PRINTF(2, 3);
static void fail(rk *r, const char *fmt, ...) {
  if (r->bad) return;
  r->bad = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->why, sizeof r->why, fmt, ap);
  va_end(ap);
}

static const lm_block *block_of(const lm_kernel *k, int32_t loop) {
  return loop < 0 ? &k->root : &k->loops[loop].body;
}

/* Records where every statement and loop sits; checks the tree is well formed. */
static void place(rk *r, int32_t loop, int depth) {
  const lm_kernel *k = r->k;
  const lm_block *b = block_of(k, loop);
  if (depth > (int)k->nloops) {
    fail(r, "loop nest deeper than the number of loops");
    return;
  }
  for (size_t i = 0; i < b->n && !r->bad; i++) {
    lm_item it = b->items[i];
    if (it.is_loop) {
      if (it.id >= k->nloops) fail(r, "block item names loop %u of %zu", it.id, k->nloops);
      else if (r->lseen[it.id]) fail(r, "loop %u appears twice", it.id);
      else if (k->loops[it.id].parent != loop) fail(r, "loop %u sits in the block of loop %d, not its parent", it.id, loop);
      else {
        r->lseen[it.id] = 1;
        place(r, (int32_t)it.id, depth + 1);
      }
    } else if (it.id >= k->nstmts) fail(r, "block item names statement %u of %zu", it.id, k->nstmts);
    else if (r->blk[it.id] != -2) fail(r, "statement %u appears twice", it.id);
    else {
      r->blk[it.id] = loop;
      r->pos[it.id] = (uint32_t)i;
    }
  }
}

static int buf_in_kernel(const lm_kernel *k, uint32_t buf) {
  for (size_t i = 0; i < k->nbufs; i++)
    if (k->bufs[i] == buf) return 1;
  return 0;
}

static void check_stmts(rk *r) {
  const lm_kernel *k = r->k;
  for (size_t i = 0; i < k->nstmts && !r->bad; i++) {
    const lm_stmt *s = &k->stmts[i];
    int ops = lm_sop_operands(s->op);
    if (s->op >= LM_S_COUNT) fail(r, "statement %zu: bad op %u", i, s->op);
    else if ((ops & LM_OPND_A) && (s->a >= k->nstmts || !has_value(k->stmts[s->a].op)))
      fail(r, "statement %zu: operand a = %u is not a value", i, s->a);
    else if ((ops & LM_OPND_B) && (s->b >= k->nstmts || !has_value(k->stmts[s->b].op)))
      fail(r, "statement %zu: operand b = %u is not a value", i, s->b);
    else if (is_update(s->op) && k->stmts[s->a].op != LM_S_ACC)
      fail(r, "statement %zu: updates %u, which is not an accumulator", i, s->a);
    else if ((s->op == LM_S_LOAD || s->op == LM_S_STORE) && s->local && s->buf >= k->nlocals)
      fail(r, "statement %zu: local array %u of %zu", i, s->buf, k->nlocals);
    else if ((s->op == LM_S_LOAD || s->op == LM_S_STORE) && !s->local &&
             (s->buf >= r->p->nbufs || !buf_in_kernel(k, s->buf)))
      fail(r, "statement %zu: buffer %u is not among the kernel's buffers", i, s->buf);
    else if ((s->op == LM_S_LOAD || s->op == LM_S_STORE || s->op == LM_S_RAND || s->op == LM_S_INDEX) &&
             (!s->idx || s->idx >= r->x->n))
      fail(r, "statement %zu: missing index expression", i);
    else if (s->valid >= r->x->n) fail(r, "statement %zu: bad validity expression", i);
  }
}

/* The operands statement s reads when printed: a padding that never holds (valid is 0) prints
 * as 0.0f and reads none. */
static int reads(const rk *r, const lm_stmt *s) {
  return s->op == LM_S_SELECT && s->valid && lm_x_is_const(r->x, s->valid, 0) ? 0 : lm_sop_operands(s->op);
}

/* Live: stores, what they read, and the updates of accumulators someone reads. */
static void liveness(rk *r) {
  const lm_kernel *k = r->k;
  for (size_t i = 0; i < k->nstmts; i++) r->live[i] = k->stmts[i].op == LM_S_STORE || k->stmts[i].op == LM_S_BARRIER;
  for (uint8_t changed = 1; changed;) {
    changed = 0;
    for (size_t i = 0; i < k->nstmts; i++) {
      const lm_stmt *s = &k->stmts[i];
      if (!r->live[i] && is_update(s->op) && r->live[s->a]) r->live[i] = changed = 1;
      if (!r->live[i]) continue;
      int ops = reads(r, s);
      if ((ops & LM_OPND_A) && !is_update(s->op) && !r->live[s->a]) r->live[s->a] = changed = 1;
      if ((ops & LM_OPND_B) && !r->live[s->b]) r->live[s->b] = changed = 1;
    }
  }
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (!r->live[i]) continue;
    if (r->blk[i] == -2) {
      fail(r, "statement %zu is used but sits in no block", i);
      return;
    }
    int ops = reads(r, s);
    if ((ops & LM_OPND_A) && !is_update(s->op)) r->uses[s->a]++, r->user[s->a] = (uint32_t)i;
    if (ops & LM_OPND_B) r->uses[s->b]++, r->user[s->b] = (uint32_t)i;
  }
}

/* Constants always print as literals; a pure statement read once, later in its own block with
 * nothing but pure statements in between, prints inside its reader. */
enum { INLINE_DISTANCE = 16 };

static int trivially_valid(rk *r, lm_expr valid) { return !valid || lm_x_is_const(r->x, valid, 1); }

/* C dialect: statement u picks its operand under a guard (a select that is not always or never
 * taken): an operand inlined there is evaluated only where the guard holds. */
static int guarded_pick(rk *r, uint32_t u) {
  const lm_stmt *s = &r->k->stmts[u];
  return r->dia == LM_DIALECT_C && s->op == LM_S_SELECT && !trivially_valid(r, s->valid) &&
         !lm_x_is_const(r->x, s->valid, 0);
}

static void choose_inline(rk *r) {
  const lm_kernel *k = r->k;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (!r->live[i] || !is_pure(s->op)) continue;
    if (s->op == LM_S_CONST) {
      r->inl[i] = 1;
      continue;
    }
    uint32_t u = r->user[i];
    if (r->uses[i] != 1 || r->blk[u] != r->blk[i] || r->pos[u] <= r->pos[i]) continue;
    if (s->op == LM_S_LOAD && guarded_pick(r, u)) continue; /* see choose_speculation */
    const lm_block *b = block_of(k, r->blk[i]);
    int ok = 1, between = 0;
    for (uint32_t j = r->pos[i] + 1; j < r->pos[u] && ok; j++) {
      lm_item it = b->items[j];
      ok = !it.is_loop && (!r->live[it.id] || is_pure(k->stmts[it.id].op));
      between += !it.is_loop && r->live[it.id] && k->stmts[it.id].op != LM_S_CONST;
    }
    /* a partial sum read far below where it is made stays a statement there: inlined, the
     * interleaved running sums of a jammed layer (compiler/lanes.c) would print as one whole
     * sum after another, and the C compiler would keep every shared term live across them */
    int partial = s->op == LM_S_ADD || s->op == LM_S_MAX;
    r->inl[i] = (uint8_t)(ok && (!partial || between <= INLINE_DISTANCE));
  }
}

/* C dialect: loads under a guard read unconditionally. A select's operand that is a load (the
 * IR reads it at every point, so it is inside its array) is not inlined into the select (see
 * choose_inline), and a guarded load of a local array whose index is inside the array at every
 * point of its loops, guard or not, is read into u<id> where it stands; the guard then picks
 * between that value and 0: the same value where the guard holds. Printed as `g ? l[i] : 0`
 * the C compiler must keep the load under the branch (it cannot tell the index stays inside the
 * array), and a lane loop holding such a pick does not vectorise: Space Invaders' state update,
 * whose 8 scalar columns are each picked from their own array under a column guard, ran scalar
 * over all 308 columns. */
static void choose_speculation(rk *r) {
  const lm_kernel *k = r->k;
  if (r->dia != LM_DIALECT_C) return;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (!r->live[i] || s->op != LM_S_LOAD || !s->local || r->vary[i] || s->buf >= k->nlocals ||
        trivially_valid(r, s->valid) || lm_x_is_const(r->x, s->valid, 0))
      continue;
    lm_expr last = lm_x_const(r->x, k->locals[s->buf] - 1);
    r->spec[i] = (uint8_t)(last && lm_x_prove_ge(r->x, s->idx, r->zero, &r->xc) &&
                           lm_x_prove_ge(r->x, last, s->idx, &r->xc));
  }
}

int lm_vector_loop_check(lm_exprs *x, const lm_kernel *k, int32_t l, uint8_t *vary, char *why, size_t cap) {
#define NO(...) return snprintf(why, cap, __VA_ARGS__), 0
  if (!vary) NO("vec loop %d: no per-statement array", l);
  if (l < 0 || (size_t)l >= k->nloops || l < k->npar) NO("loop %d is not a serial loop of the kernel", l);
  const lm_loop *lp = &k->loops[l];
  const lm_xnode *e = lm_x_node(x, lp->extent);
  if (e->op != LM_X_CONST || e->v < 8 || e->v % 8) NO("vec loop %d: extent is not a constant multiple of 8", l);
  const lm_block *b = &lp->body;
  for (size_t i = 0; i < b->n; i++) {
    if (b->items[i].is_loop) NO("vec loop %d: a loop inside", l);
    uint32_t id = b->items[i].id;
    const lm_stmt *s = &k->stmts[id];
    int64_t d = 0;
    int va = (lm_sop_operands(s->op) & LM_OPND_A) && s->a < k->nstmts && vary[s->a];
    int vb = (lm_sop_operands(s->op) & LM_OPND_B) && s->b < k->nstmts && vary[s->b];
    int valid_one = !s->valid || lm_x_is_const(x, s->valid, 1), v = 0;
    switch (s->op) {
    case LM_S_CONST: break;
    case LM_S_LOAD:
    case LM_S_STORE:
      if (!lm_x_step(x, s->idx, l, (int)k->nloops, &d) || (d != 0 && d != 1))
        NO("vec loop %d: statement %u's index does not step by 0 or 1", l, id);
      if (d && !valid_one) { /* a store's guard may hold for all lanes alike (the rows of a ragged tile) */
        int64_t dv = 1;
        if (s->op == LM_S_LOAD || !lm_x_step(x, s->valid, l, (int)k->nloops, &dv) || dv)
          NO("vec loop %d: statement %u is a guarded access", l, id);
      }
      if (s->op == LM_S_STORE && d != 1) NO("vec loop %d: store %u writes one element from every lane", l, id);
      v = d == 1;
      for (size_t j = 0; j < b->n; j++) { /* lanes write apart: a store's buffer is read only where it writes */
        const lm_stmt *o = &k->stmts[b->items[j].id];
        if (j == i || b->items[j].is_loop || o->buf != s->buf || o->local != s->local) continue;
        if (o->op == LM_S_STORE && (s->op == LM_S_STORE || o->idx != s->idx))
          NO("vec loop %d: statements %u and %u touch one buffer at two indices", l, id, b->items[j].id);
      }
      break;
    case LM_S_ADD:
    case LM_S_MUL: v = va || vb; break;
    case LM_S_RECIP:
    case LM_S_EXP2: v = va; break; /* lm_exp2_v8 */
    case LM_S_SELECT:
      if (s->valid && lm_x_is_const(x, s->valid, 0)) break; /* prints as 0 */
      if (va && !valid_one) NO("vec loop %d: statement %u selects lanes", l, id);
      v = va;
      break;
    case LM_S_RAND:
      if (!lm_x_step(x, s->idx, l, (int)k->nloops, &d) || d) NO("vec loop %d: draw %u differs by lane", l, id);
      break;
    case LM_S_INDEX:
      if (!lm_x_step(x, s->idx, l, (int)k->nloops, &d) || d) NO("vec loop %d: index value %u differs by lane", l, id);
      break;
    case LM_S_ACC_SUM:
    case LM_S_ACC_MAX:
    case LM_S_BARRIER:
    case LM_S_WARP_SUM:
    case LM_S_WARP_MAX: NO("vec loop %d: statement %u (op %u) is not per lane", l, id, s->op);
    default:
      if (va || vb) NO("vec loop %d: statement %u (op %u) has no vector form", l, id, s->op);
      break;
    }
    vary[id] = (uint8_t)v;
  }
  return 1;
#undef NO
}

/* ---------------------------------------------------------------- printing */

static void indent(lm_sb *sb, int n) {
  for (int i = 0; i < n; i++) lm_sb_puts(sb, "  ");
}

/* A float literal that reads back as exactly f. */
static void print_float(rk *r, lm_sb *sb, float f, int operand) {
  if (isnan(f)) {
    lm_sb_puts(sb, r->d->nan);
    return;
  }
  if (isinf(f)) {
    lm_sb_printf(sb, f > 0 ? "%s" : operand ? "(-%s)" : "-%s", r->d->inf);
    return;
  }
  char raw[48], out[56];
  snprintf(raw, sizeof raw, "%.9g", (double)f);
  /* locale-proof: whatever the radix character printed as, it becomes '.' */
  size_t n = 0;
  int dot = 0;
  for (const char *c = raw; *c && n + 4 < sizeof out; c++) {
    if ((*c >= '0' && *c <= '9') || *c == '-' || *c == '+' || *c == 'e') out[n++] = *c;
    else if (!dot) out[n++] = '.', dot = 1;
  }
  out[n] = 0;
  if (!strpbrk(out, ".e")) strcat(out, ".0");
  strcat(out, "f");
  lm_sb_printf(sb, operand && out[0] == '-' ? "(%s)" : "%s", out);
}

static int xprec(uint8_t op) {
  switch (op) {
  case LM_X_AND: return 1;
  case LM_X_LT: return 2;
  case LM_X_ADD: return 3;
  case LM_X_MUL:
  case LM_X_DIV:
  case LM_X_MOD: return 4;
  default: return 5;
  }
}

static int constish(const lm_exprs *x, lm_expr e) {
  return !lm_x_vars_used(x, e) && !lm_x_syms_used(x, e);
}

/* An integer constant; `wide` forces the 64-bit type (both operands are constants). */
static void print_int(rk *r, lm_sb *sb, int64_t v, int outer, int wide) {
  if (v == INT64_MIN) lm_sb_printf(sb, "((%s)(-9223372036854775807 - 1))", r->d->i64);
  else if (wide || v > INT32_MAX || v < -INT32_MAX) lm_sb_printf(sb, "((%s)%lld)", r->d->i64, (long long)v);
  else lm_sb_printf(sb, v < 0 && outer > 3 ? "(%lld)" : "%lld", (long long)v);
}

static void print_x(rk *r, lm_sb *sb, lm_expr e, int outer, int wide) {
  if (!e || e >= r->x->n) {
    fail(r, "bad index expression %u", e);
    return;
  }
  const lm_xnode nd = r->x->nodes[e]; /* a copy: proving may grow the arena */
  for (int i = 0; r->full && i < r->ntail; i++)
    if (e == r->tail[i]) {
      print_int(r, sb, 1, outer, wide);
      return;
    }
  switch (nd.op) {
  case LM_X_CONST: print_int(r, sb, nd.v, outer, wide); return;
  case LM_X_VAR:
    if (nd.v < 0 || (size_t)nd.v >= r->k->nloops) {
      fail(r, "index uses loop variable %lld of %zu", (long long)nd.v, r->k->nloops);
      return;
    }
    r->varuse[nd.v] = 1;
    lm_sb_printf(sb, "i%lld", (long long)nd.v);
    return;
  case LM_X_SYM:
    if (nd.v < 0 || (size_t)nd.v >= r->x->nsyms) {
      fail(r, "index uses symbol %lld of %zu", (long long)nd.v, r->x->nsyms);
      return;
    }
    r->symuse[nd.v] = 1;
    lm_sb_puts(sb, r->symname[nd.v]);
    return;
  default: break;
  }
  for (size_t i = 0; nd.op == LM_X_MOD && i < r->nsr; i++)
    if (r->sr[i].mod == e) { /* the running remainder of an open loop */
      r->sr[i].used = 1;
      lm_sb_printf(sb, "q%d_%zu", r->sr[i].loop, i);
      return;
    }
  if (nd.op >= LM_X_COUNT || !nd.a || !nd.b || nd.a >= r->x->n || nd.b >= r->x->n) {
    fail(r, "bad index expression %u (op %u)", e, nd.op);
    return;
  }
  int w = constish(r->x, nd.a) && constish(r->x, nd.b);
  if ((nd.op == LM_X_DIV || nd.op == LM_X_MOD) && !lm_x_prove_ge(r->x, nd.a, r->zero, &r->xc)) {
    lm_sb_puts(sb, nd.op == LM_X_DIV ? "lm_floordiv(" : "lm_floormod(");
    print_x(r, sb, nd.a, 0, w);
    lm_sb_puts(sb, ", ");
    print_x(r, sb, nd.b, 0, w);
    lm_sb_puts(sb, ")");
    return;
  }
  static const char *const sym[LM_X_COUNT] = {[LM_X_ADD] = " + ", [LM_X_MUL] = "*", [LM_X_DIV] = " / ",
                                              [LM_X_MOD] = " % ", [LM_X_LT] = " < ", [LM_X_AND] = " && "};
  int p = xprec(nd.op);
  if (p < outer) lm_sb_puts(sb, "(");
  const lm_xnode nb = r->x->nodes[nd.b];
  if (nd.op == LM_X_ADD && nb.op == LM_X_MUL && nb.b && nb.b < r->x->n && r->x->nodes[nb.b].op == LM_X_CONST &&
      r->x->nodes[nb.b].v == -1) {
    print_x(r, sb, nd.a, p, 0); /* a + b*(-1) reads a - b */
    lm_sb_puts(sb, " - ");
    print_x(r, sb, nb.a, p + 1, 0);
  } else if (nd.op == LM_X_ADD && nb.op == LM_X_CONST && nb.v < 0 && nb.v > -INT32_MAX && !w) {
    print_x(r, sb, nd.a, p, 0); /* a + (-c) reads a - c */
    lm_sb_printf(sb, " - %lld", -(long long)nb.v);
  } else {
    print_x(r, sb, nd.a, p, w);
    lm_sb_puts(sb, sym[nd.op]);
    print_x(r, sb, nd.b, p + 1, w);
  }
  if (p < outer) lm_sb_puts(sb, ")");
}

/* Float expressions print with C precedence: `need` is the least precedence the context takes
 * without parentheses (0: anywhere, e.g. a call argument; 1: an operand of +; 2: of *; 3: of
 * a unary or the right side of * and /). Ternaries and negative literals have 0, + has 1,
 * * and / have 2, calls, loads and locals 4. */
enum { PREC_TERNARY = 0, PREC_ADD = 1, PREC_MUL = 2, PREC_ATOM = 4 };

static void print_value(rk *r, lm_sb *sb, uint32_t id, int need);

/* b<buf>[idx], or l<buf>[idx] for a local array */
static void print_tile_at(rk *r, lm_sb *sb, int t);

static void print_load(rk *r, lm_sb *sb, const lm_stmt *s) {
  if (r->tiled && r->tiled[s - r->k->stmts]) {
    print_tile_at(r, sb, r->tiled[s - r->k->stmts] - 1);
    return;
  }
  if (s->local) lm_sb_printf(sb, "l%u[", s->buf);
  else {
    r->bufrd[s->buf] = 1;
    lm_sb_printf(sb, "b%u[", s->buf);
  }
  print_x(r, sb, s->idx, 0, 0);
  lm_sb_puts(sb, "]");
}

static void open_paren(lm_sb *sb, int prec, int need) {
  if (prec < need) lm_sb_puts(sb, "(");
}
static void close_paren(lm_sb *sb, int prec, int need) {
  if (prec < need) lm_sb_puts(sb, ")");
}

/* C dialect: the divisor is a constant whose magnitude is a power of two >= 1 (lm_fmod_p2). */
static int pow2_divisor(const rk *r, uint32_t b) {
  const lm_stmt *s = &r->k->stmts[b];
  if (r->dia != LM_DIALECT_C || s->op != LM_S_CONST) return 0;
  float f = fabsf(s->f);
  int e;
  return isfinite(f) && f >= 1.0f && frexpf(f, &e) == 0.5f;
}

/* lm_ne and lm_eq as the graph spells them (compiler/ops.c): ne = (a < b) + (b < a), eq =
 * 1 + -1 * ne, each part printed inside the next. Printed as one test, `a < b || b < a ? 1 : 0`
 * (and `? 0 : 1`), the value is the same, +0 or 1, NaN included (both tests false: ne 0, eq 1),
 * where the arithmetic form costs the C compiler two compares, two blends, an add and a
 * multiply-add per element: Breakout's step, which compares every state column with the ball's
 * cell, ran 14% faster. *a, *b: the operands of the first test. */
static int inl_op(const rk *r, uint32_t id, uint8_t op) { return r->inl[id] && r->k->stmts[id].op == op; }
static int inl_const(const rk *r, uint32_t id, float f) { return inl_op(r, id, LM_S_CONST) && r->k->stmts[id].f == f; }

static int ne_form(const rk *r, uint32_t id, uint32_t *a, uint32_t *b) {
  const lm_stmt *s = &r->k->stmts[id];
  if (s->op != LM_S_ADD || !inl_op(r, s->a, LM_S_LT) || !inl_op(r, s->b, LM_S_LT)) return 0;
  const lm_stmt *p = &r->k->stmts[s->a], *q = &r->k->stmts[s->b];
  if (p->a != q->b || p->b != q->a) return 0;
  *a = p->a, *b = p->b;
  return 1;
}

static int eq_form(const rk *r, uint32_t id, uint32_t *a, uint32_t *b) {
  const lm_stmt *s = &r->k->stmts[id];
  if (s->op != LM_S_ADD) return 0;
  uint32_t m = inl_const(r, s->a, 1.0f) ? s->b : inl_const(r, s->b, 1.0f) ? s->a : UINT32_MAX;
  if (m == UINT32_MAX || !inl_op(r, m, LM_S_MUL)) return 0;
  const lm_stmt *t = &r->k->stmts[m];
  uint32_t n = inl_const(r, t->a, -1.0f) ? t->b : inl_const(r, t->b, -1.0f) ? t->a : UINT32_MAX;
  return n != UINT32_MAX && r->inl[n] && ne_form(r, n, a, b);
}

/* ---- a kernel that promises finite values: arithmetic selects printed as selects ----------
 * lm_env_select(c, a, b) is f*a + 0 + (1-f)*b over the primitives (f = 0.5 < c), and
 * lm_minimum / lm_maximum are the same form over a comparison. With f 0 or 1 and finite a and
 * b that is f ? a : b, but for the sign of a zero; with an infinity or a NaN in the unpicked
 * operand it is NaN. In a kernel whose graph promises finite values, zeros' signs unobserved
 * (lm_graph_promise_finite), it prints as a select, a compare and a blend where the arithmetic
 * is two multiplies, two adds and a subtract per element; and x * 0 prints as 0. f is proved 0
 * or 1 from how it was made (comparisons, their products and complements, sums of flags that
 * exclude each other), also through local arrays that one live store at a lane fills. This is
 * printing, not a rewrite: the statements stay what the reference computes, other dialects and
 * kernels without the promise print them as they are, and nothing here can be a rule because
 * no rule may assume finite values (the search's rewrites hold for every input). */
static uint32_t fin_strip(const lm_kernel *k, uint32_t id) { /* x + 0 is x when zeros' signs do not count */
  for (int guard = 0; guard < 64; guard++) {
    const lm_stmt *s = &k->stmts[id];
    if (s->op != LM_S_ADD) break;
    const lm_stmt *a = &k->stmts[s->a], *b = &k->stmts[s->b];
    if (b->op == LM_S_CONST && b->f == 0.0f) id = s->a;
    else if (a->op == LM_S_CONST && a->f == 0.0f) id = s->b;
    else break;
  }
  return id;
}

/* Per local array, the value and the loop of its one live store at a lane (lfill, lloop), or
 * UINT32_MAX when it has none or more; 0: out of memory. */
static int fill_locals(rk *r) {
  const lm_kernel *k = r->k;
  uint32_t *count = lm_calloc(k->nlocals + 1, sizeof *count);
  r->lfill = lm_calloc(k->nlocals + 1, sizeof *r->lfill);
  r->lloop = lm_calloc(k->nlocals + 1, sizeof *r->lloop);
  r->flagged = lm_calloc(k->nstmts + 1, 1);
  if (!count || !r->lfill || !r->lloop || !r->flagged) return lm_free(count), 0;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *t = &k->stmts[i];
    if (t->op != LM_S_STORE || !t->local || !r->live[i] || t->buf >= k->nlocals) continue;
    r->lfill[t->buf] = t->a;
    r->lloop[t->buf] = t->loop;
    count[t->buf] += lm_x_node(r->x, t->idx)->op == LM_X_VAR ? 1 : 2;
  }
  for (size_t l = 0; l < k->nlocals; l++)
    if (count[l] != 1) r->lfill[l] = UINT32_MAX;
  lm_free(count);
  return 1;
}

/* id with + 0s dropped and loads of filled local arrays replaced by the value stored (read
 * outside the storing loop: the value of this step, or of the last, for every load at the same
 * place). *via: the storing loop of the first such load (-2: none), so two values resolved from
 * one place compare as the same only when they come from the same step. */
static uint32_t fin_res(const rk *r, uint32_t id, int32_t *via) {
  for (int guard = 0; guard < 16; guard++) {
    id = fin_strip(r->k, id);
    const lm_stmt *s = &r->k->stmts[id];
    if (s->op != LM_S_LOAD || !s->local || s->buf >= r->k->nlocals || r->lfill[s->buf] == UINT32_MAX ||
        lm_x_node(r->x, s->idx)->op != LM_X_VAR)
      break;
    int32_t at = r->lloop[s->buf], l = s->loop;
    while (l >= 0 && l != at) l = r->k->loops[l].parent;
    if (l == at && at >= 0) break; /* read inside the storing loop: before or after the store */
    if (*via == -2) *via = at;
    id = r->lfill[s->buf];
  }
  return id;
}

static int fin_const(const rk *r, uint32_t id, float f) {
  int32_t via = -2;
  const lm_stmt *s = &r->k->stmts[fin_res(r, id, &via)];
  return s->op == LM_S_CONST && s->f == f;
}

/* id = 1 + -1 * c, in either order: *c resolved, *via as fin_res's */
static int fin_not(const rk *r, uint32_t id, uint32_t *c, int32_t *via) {
  const lm_stmt *s = &r->k->stmts[fin_res(r, id, via)];
  if (s->op != LM_S_ADD) return 0;
  uint32_t m = fin_const(r, s->a, 1.0f) ? s->b : fin_const(r, s->b, 1.0f) ? s->a : UINT32_MAX;
  if (m == UINT32_MAX) return 0;
  const lm_stmt *t = &r->k->stmts[fin_res(r, m, via)];
  if (t->op != LM_S_MUL) return 0;
  uint32_t n = fin_const(r, t->a, -1.0f) ? t->b : fin_const(r, t->b, -1.0f) ? t->a : UINT32_MAX;
  if (n == UINT32_MAX) return 0;
  *c = fin_res(r, n, via);
  return 1;
}

/* f (resolved) is a product with the factor 1 - c, of c resolved through the same step (via) */
static int fin_has_not(const rk *r, uint32_t f, uint32_t c, int32_t via, int depth) {
  uint32_t n;
  int32_t v = via;
  if (fin_not(r, f, &n, &v) && n == c && v == via) return 1;
  const lm_stmt *s = &r->k->stmts[f];
  if (depth >= 8 || s->op != LM_S_MUL) return 0;
  int32_t va = via, vb = via;
  uint32_t a = fin_res(r, s->a, &va), b = fin_res(r, s->b, &vb);
  return (va == via && fin_has_not(r, a, c, via, depth + 1)) || (vb == via && fin_has_not(r, b, c, via, depth + 1));
}

static int fin_flag(const rk *r, uint32_t id, int depth);

/* every value of id is 0 or 1 (zeros' signs unobserved), within depth - 24 more steps */
static int fin_flag_at(const rk *r, uint32_t id, int depth) {
  int32_t via = -2;
  id = fin_res(r, id, &via);
  const lm_stmt *s = &r->k->stmts[id];
  uint32_t c;
  switch (s->op) {
  case LM_S_LT: return 1;
  case LM_S_CONST: return s->f == 0.0f || s->f == 1.0f;
  case LM_S_MUL: return fin_flag(r, s->a, depth + 1) && fin_flag(r, s->b, depth + 1);
  case LM_S_ADD: {
    int32_t vn = via;
    if (fin_not(r, id, &c, &vn)) return fin_flag(r, c, depth + 1);
    int32_t va = via, vb = via;
    uint32_t pa = fin_res(r, s->a, &va), qb = fin_res(r, s->b, &vb);
    const lm_stmt *p = &r->k->stmts[pa], *q = &r->k->stmts[qb];
    if (va != vb) return 0;
    if (p->op == LM_S_LT && q->op == LM_S_LT && p->a == q->b && p->b == q->a) return 1; /* a != b */
    return fin_flag(r, pa, depth + 1) && fin_flag(r, qb, depth + 1) &&
           (fin_has_not(r, pa, qb, va, 0) || fin_has_not(r, qb, pa, va, 0)); /* p + q, p = x * (1 - q) */
  }
  default: return 0;
  }
}

/* fin_flag_at, remembered: statements are shared, and a product of shared flags would be
 * walked once per path. A yes holds at any depth; a no is kept only where the walk had its
 * whole budget (depth 0), and then holds at any depth too (a smaller budget proves no more). */
static int fin_flag(const rk *r, uint32_t id, int depth) {
  if (depth > 24) return 0;
  uint8_t *m = &r->flagged[id];
  if (*m) return *m == 2;
  int yes = fin_flag_at(r, id, depth);
  if (yes || depth == 0) *m = yes ? 2 : 1;
  return yes;
}

/* id = x * (1 - c) + y * c (either order, + 0s anywhere), c a flag of one step: *cv (c as read
 * here), *x, *y */
static int select_form(const rk *r, uint32_t id, uint32_t *cv, uint32_t *x, uint32_t *y) {
  if (!r->k->finite || r->dia != LM_DIALECT_C) return 0;
  const lm_stmt *s = &r->k->stmts[fin_strip(r->k, id)];
  if (s->op != LM_S_ADD) return 0;
  for (int side = 0; side < 2; side++) {
    int32_t vk = -2, vt = -2;
    const lm_stmt *keep = &r->k->stmts[fin_res(r, side ? s->b : s->a, &vk)];
    const lm_stmt *take = &r->k->stmts[fin_res(r, side ? s->a : s->b, &vt)];
    if (keep->op != LM_S_MUL || take->op != LM_S_MUL || vk != -2 || vt != -2) continue; /* printed here */
    uint32_t c, n;
    int32_t vc = vk;
    if (fin_not(r, keep->b, &c, &vc)) *x = keep->a;
    else if ((vc = vk, fin_not(r, keep->a, &c, &vc))) *x = keep->b;
    else continue;
    int32_t va = vt, vb = vt;
    if ((n = fin_res(r, take->b, &vb)) == c && vb == vc) *cv = take->b, *y = take->a;
    else if ((n = fin_res(r, take->a, &va)) == c && va == vc) *cv = take->a, *y = take->b;
    else continue;
    if (fin_flag(r, c, 0)) return 1;
  }
  return 0;
}

/* The loads a select's picked operand reads through statements printed inside it. */
static void unguard_loads(rk *r, uint32_t id, int depth) {
  const lm_stmt *s = &r->k->stmts[id];
  if (depth > 8 || !r->inl[id]) return;
  if (s->op == LM_S_LOAD) {
    if (trivially_valid(r, s->valid)) r->inl[id] = 0;
    return;
  }
  int ops = lm_sop_operands(s->op);
  if (ops & LM_OPND_A) unguard_loads(r, s->a, depth + 1);
  if (ops & LM_OPND_B) unguard_loads(r, s->b, depth + 1);
}

/* Finite C kernels: a load an arithmetic select picks (select_form) is read where it stands,
 * not inside the pick. Every point of an unguarded load is inside its array, so reading it
 * always is safe; printed inside `c ? a : b` the C compiler must keep it under the branch, and
 * in a lane loop it makes it a masked load, or, with constant offsets (a column loop unrolled
 * into its lanes, columns.c), a gather per vector. */
static void unguard_picks(rk *r) {
  const lm_kernel *k = r->k;
  for (size_t i = 0; i < k->nstmts; i++) {
    uint32_t c, a, b;
    if (!r->live[i] || r->vary[i] || k->stmts[i].op != LM_S_ADD || !select_form(r, (uint32_t)i, &c, &a, &b)) continue;
    unguard_loads(r, a, 0);
    unguard_loads(r, b, 0);
  }
}

static void print_test(rk *r, lm_sb *sb, uint32_t a, uint32_t b, int eq, int need) {
  open_paren(sb, PREC_TERNARY, need);
  lm_sb_puts(sb, "(");
  print_value(r, sb, a, PREC_ADD);
  lm_sb_puts(sb, " < ");
  print_value(r, sb, b, PREC_ADD);
  lm_sb_puts(sb, " || ");
  print_value(r, sb, b, PREC_ADD);
  lm_sb_puts(sb, " < ");
  print_value(r, sb, a, PREC_ADD);
  lm_sb_puts(sb, eq ? ") ? 0.0f : 1.0f" : ") ? 1.0f : 0.0f");
  close_paren(sb, PREC_TERNARY, need);
}

static void print_expr(rk *r, lm_sb *sb, uint32_t id, int need) {
  const lm_stmt *s = &r->k->stmts[id];
  const lm_dialect_info *d = r->d;
  switch (s->op) {
  case LM_S_CONST: print_float(r, sb, s->f, need > PREC_TERNARY); return;
  case LM_S_INDEX:
    lm_sb_puts(sb, "((float)(");
    print_x(r, sb, s->idx, 0, 0);
    lm_sb_puts(sb, "))");
    return;
  case LM_S_LOAD:
  case LM_S_SELECT:
    if (trivially_valid(r, s->valid)) {
      if (s->op == LM_S_LOAD && r->vary[id]) {
        lm_sb_puts(sb, "(*(const lm_v8 *)&");
        print_load(r, sb, s);
        lm_sb_puts(sb, ")");
      } else if (s->op == LM_S_LOAD) print_load(r, sb, s);
      else print_value(r, sb, s->a, need);
    } else if (lm_x_is_const(r->x, s->valid, 0)) {
      lm_sb_puts(sb, "0.0f");
    } else { /* the index is evaluated only where valid: it may be out of range elsewhere */
      open_paren(sb, PREC_TERNARY, need);
      lm_sb_puts(sb, "(");
      print_x(r, sb, s->valid, 0, 0);
      lm_sb_puts(sb, ") ? ");
      if (r->spec[id]) lm_sb_printf(sb, "u%u", id);
      else if (s->op == LM_S_LOAD) print_load(r, sb, s);
      else print_value(r, sb, s->a, PREC_ADD);
      lm_sb_puts(sb, " : 0.0f");
      close_paren(sb, PREC_TERNARY, need);
    }
    return;
  case LM_S_RAND:
    r->use_r = 1;
    if (r->dia == LM_DIALECT_C) { /* group and word apart: see c_philox */
      lm_expr four = lm_x_const(r->x, 4);
      lm_expr grp = lm_x_simplify(r->x, lm_x_div(r->x, s->idx, four), &r->xc);
      lm_expr lane = lm_x_simplify(r->x, lm_x_mod(r->x, s->idx, four), &r->xc);
      if (!grp || !lane) {
        fail(r, "out of memory");
        return;
      }
      lm_sb_printf(sb, "lm_philox_u(R[0], %uu, (uint64_t)(", s->stream);
      print_x(r, sb, grp, 0, 0);
      lm_sb_puts(sb, "), (uint32_t)(");
      print_x(r, sb, lane, 0, 0);
    } else {
      lm_sb_printf(sb, "lm_philox_uniform(R[0], %uu, (%s)(", s->stream, d->u64);
      print_x(r, sb, s->idx, 0, 0);
    }
    if (s->step && !lm_x_is_const(r->x, s->step, 0)) {
      lm_sb_printf(sb, "), R[1] + (%s)(", d->u64);
      print_x(r, sb, s->step, 0, 0);
      lm_sb_puts(sb, "))");
    } else lm_sb_puts(sb, "), R[1])");
    return;
  case LM_S_LOG2:
  case LM_S_EXP2:
  case LM_S_SIN:
  case LM_S_SQRT:
    lm_sb_printf(sb, "%s(", s->op == LM_S_EXP2 && r->vary[id]                                        ? "lm_exp2_v8"
                            : s->op == LM_S_EXP2 && (r->k->contract || r->k->fast_exp) && r->dia == LM_DIALECT_C ? "lm_exp2_c"
                            : s->op == LM_S_LOG2 && r->k->contract && !r->vary[id] && r->dia == LM_DIALECT_C ? "lm_log2_c"
                                                                                             : d->math[LM_MATH_LOG2 + (s->op - LM_S_LOG2)]);
    print_value(r, sb, s->a, 0);
    lm_sb_puts(sb, ")");
    return;
  case LM_S_RECIP:
    open_paren(sb, PREC_MUL, need);
    lm_sb_puts(sb, "1.0f / ");
    print_value(r, sb, s->a, PREC_MUL + 1);
    close_paren(sb, PREC_MUL, need);
    return;
  case LM_S_ADD: {
    uint32_t ta, tb, tc;
    if (!r->vary[id] && select_form(r, id, &tc, &ta, &tb)) {
      open_paren(sb, PREC_TERNARY, need);
      print_value(r, sb, tc, PREC_ADD);
      lm_sb_puts(sb, " != 0.0f ? ");
      print_value(r, sb, tb, PREC_TERNARY + 1);
      lm_sb_puts(sb, " : ");
      print_value(r, sb, ta, PREC_TERNARY + 1);
      close_paren(sb, PREC_TERNARY, need);
      return;
    }
    if (!r->vary[id] && eq_form(r, id, &ta, &tb)) return print_test(r, sb, ta, tb, 1, need);
    if (!r->vary[id] && ne_form(r, id, &ta, &tb)) return print_test(r, sb, ta, tb, 0, need);
    open_paren(sb, PREC_ADD, need);
    print_value(r, sb, s->a, PREC_ADD); /* (a + b) + c prints a + b + c */
    lm_sb_puts(sb, " + ");
    print_value(r, sb, s->b, PREC_ADD + 1);
    close_paren(sb, PREC_ADD, need);
    return;
  }
  case LM_S_MUL: {
    if (!r->vary[id] && r->k->finite && r->dia == LM_DIALECT_C) {
      if (fin_const(r, s->a, 0.0f) || fin_const(r, s->b, 0.0f)) { /* x * 0: finite x, zeros unsigned */
        lm_sb_puts(sb, "0.0f");
        return;
      }
    }
    open_paren(sb, PREC_MUL, need);
    /* (1/a) * b keeps its parentheses: / and * mixed read ambiguously */
    int left_recip = r->inl[s->a] && r->k->stmts[s->a].op == LM_S_RECIP;
    print_value(r, sb, s->a, left_recip ? PREC_MUL + 1 : PREC_MUL);
    lm_sb_puts(sb, " * ");
    print_value(r, sb, s->b, PREC_MUL + 1);
    close_paren(sb, PREC_MUL, need);
    return;
  }
  case LM_S_MOD:
    lm_sb_printf(sb, "%s(", pow2_divisor(r, s->b) ? "lm_fmod_p2" : d->math[LM_MATH_FMOD]);
    print_value(r, sb, s->a, 0);
    lm_sb_puts(sb, ", ");
    print_value(r, sb, s->b, 0);
    lm_sb_puts(sb, ")");
    return;
  case LM_S_MAX:
    lm_sb_printf(sb, "%s(", d->math[LM_MATH_FMAX]);
    print_value(r, sb, s->a, 0);
    lm_sb_puts(sb, ", ");
    print_value(r, sb, s->b, 0);
    lm_sb_puts(sb, ")");
    return;
  case LM_S_LT:
    lm_sb_puts(sb, "(");
    print_value(r, sb, s->a, PREC_ADD);
    lm_sb_puts(sb, " < ");
    print_value(r, sb, s->b, PREC_ADD);
    lm_sb_puts(sb, " ? 1.0f : 0.0f)");
    return;
  default: fail(r, "statement %u (op %u) has no value", id, s->op); return;
  }
}

/* A statement's value where it is read: its local, or its expression when inlined. */
static void print_value(rk *r, lm_sb *sb, uint32_t id, int need) {
  if (r->inl[id]) print_expr(r, sb, id, need);
  else lm_sb_printf(sb, "v%u", id);
}

static void emit_stmt(rk *r, lm_sb *sb, uint32_t id, int ind) {
  const lm_stmt *s = &r->k->stmts[id];
  if (r->live[id] && r->spec[id]) { /* read here, picked where it is used */
    indent(sb, ind);
    lm_sb_printf(sb, "const float u%u = ", id);
    print_load(r, sb, s);
    lm_sb_puts(sb, ";\n");
  }
  if (!r->live[id] || r->inl[id]) return;
  indent(sb, ind);
  switch (s->op) {
  case LM_S_ACC:
    lm_sb_printf(sb, "float v%u = ", id);
    print_float(r, sb, s->f, 0);
    break;
  case LM_S_ACC_SUM:
    lm_sb_printf(sb, "v%u += ", s->a);
    print_value(r, sb, s->b, 0);
    break;
  case LM_S_ACC_MAX:
    lm_sb_printf(sb, "v%u = %s(v%u, ", s->a, r->d->math[LM_MATH_FMAX], s->a);
    print_value(r, sb, s->b, 0);
    lm_sb_puts(sb, ")");
    break;
  case LM_S_WARP_SUM:
  case LM_S_WARP_MAX:
    if (r->dia != LM_DIALECT_CUDA || !r->k->group) {
      fail(r, "statement %u: a warp reduction outside a CUDA work-group schedule", id);
      return;
    }
    lm_sb_printf(sb, "float v%u = ", id);
    print_value(r, sb, s->a, 0);
    lm_sb_printf(sb, ";\n");
    indent(sb, ind);
    lm_sb_printf(sb, "for (int o_ = 16; o_ > 0; o_ >>= 1) v%u = %s(v%u, __shfl_down_sync(0xffffffffu, v%u, o_));\n", id,
                 s->op == LM_S_WARP_SUM ? "lm_add" : "fmaxf", id, id);
    return;
  case LM_S_BARRIER:
    if (!r->d->barrier || !r->k->group) {
      fail(r, "statement %u: a barrier outside a work-group schedule", id);
      return;
    }
    lm_sb_puts(sb, r->d->barrier);
    lm_sb_puts(sb, "\n");
    return;
  case LM_S_STORE:
    if (!trivially_valid(r, s->valid)) {
      lm_sb_puts(sb, "if (");
      print_x(r, sb, s->valid, 0, 0);
      lm_sb_puts(sb, ") ");
    }
    if (r->vary[id]) lm_sb_puts(sb, "*(lm_v8 *)&");
    if (r->tiled && r->tiled[id]) {
      print_tile_at(r, sb, r->tiled[id] - 1);
      lm_sb_puts(sb, " = ");
      print_value(r, sb, s->a, 0);
      break;
    }
    if (s->local) lm_sb_printf(sb, "l%u[", s->buf);
    else {
      r->bufwr[s->buf] = 1;
      lm_sb_printf(sb, "b%u[", s->buf);
    }
    print_x(r, sb, s->idx, 0, 0);
    lm_sb_puts(sb, "] = ");
    if (r->vary[id] && !r->vary[s->a]) { /* one value in every lane */
      lm_sb_puts(sb, "lm_splat8(");
      print_value(r, sb, s->a, 0);
      lm_sb_puts(sb, ")");
    } else print_value(r, sb, s->a, 0);
    break;
  default:
    lm_sb_printf(sb, "%s v%u = ", r->vary[id] ? "lm_v8" : "float", id);
    print_expr(r, sb, id, 0);
    break;
  }
  lm_sb_puts(sb, ";\n");
}

static void emit_block(rk *r, lm_sb *sb, int32_t loop, int ind);

/* A loop is printed only when something live happens inside it. */
static int has_work(const rk *r, int32_t loop) {
  const lm_block *b = block_of(r->k, loop);
  for (size_t i = 0; i < b->n; i++)
    if (b->items[i].is_loop ? has_work(r, (int32_t)b->items[i].id) : r->live[b->items[i].id]) return 1;
  return 0;
}

/* The lanes whose element of the mask array is not 0, in order. In C, a bit per lane (at most
 * 64, compiler/lazy.c) and a loop over the set bits; elsewhere a test per lane. */
static void emit_sparse(rk *r, lm_sb *sb, int32_t l, int ind) {
  const lm_loop *lp = &r->k->loops[l];
  const char *I = r->d->i64;
  indent(sb, ind);
  if (r->dia != LM_DIALECT_C) {
    lm_sb_printf(sb, "for (%s i%d = 0; i%d < ", I, l, l);
    print_x(r, sb, lp->extent, 2, 0);
    lm_sb_printf(sb, "; i%d++) {\n", l);
    indent(sb, ind + 1);
    lm_sb_printf(sb, "if (l%u[i%d] == 0.0f) continue;\n", lp->mask, l);
  } else {
    lm_sb_printf(sb, "{\n");
    indent(sb, ind + 1);
    lm_sb_printf(sb, "uint64_t m%d = 0;\n", l);
    indent(sb, ind + 1);
    lm_sb_printf(sb, "for (int64_t i%d = 0; i%d < ", l, l);
    print_x(r, sb, lp->extent, 2, 0);
    lm_sb_printf(sb, "; i%d++) m%d |= (uint64_t)(l%u[i%d] != 0.0f) << i%d;\n", l, l, lp->mask, l, l);
    indent(sb, ind + 1);
    lm_sb_printf(sb, "for (; m%d; m%d &= m%d - 1) {\n", l, l, l);
    indent(sb, ind + 2);
    lm_sb_printf(sb, "const int64_t i%d = lm_ctz64(m%d);\n", l, l);
    emit_block(r, sb, l, ind + 2);
    indent(sb, ind + 1);
    lm_sb_puts(sb, "}\n");
    indent(sb, ind);
    lm_sb_puts(sb, "}\n");
    return;
  }
  emit_block(r, sb, l, ind + 1);
  indent(sb, ind);
  lm_sb_puts(sb, "}\n");
}

/* Strength reduction of a modulo (C dialect). The minibatch gather of the PPO update reads row
 * (i*a + b) % (T*N) of the rollout: a 64-bit division every iteration, by a divisor the C
 * compiler does not know (about 40 cycles on Zen 2; 4 of the update's kernels spent most of their
 * time there). Where a loop's variable steps the dividend by d each iteration and the divisor
 * names no loop, the remainder is kept instead: q = (a0 + lo*d) mod n before the loop, then
 * q += d mod n and one conditional subtraction per iteration. Floor remainders throughout, so it
 * is what the index computes for any sign. Not for vec or lane loops (a carried value would stop
 * the vectoriser) nor constant divisors (the compiler multiplies). */
static int sr_candidate(rk *r, int32_t l, lm_expr e, lm_expr *a0, lm_expr *d) {
  lm_exprs *x = r->x;
  const lm_xnode nd = x->nodes[e];
  if (nd.op != LM_X_MOD || l >= 64 || lm_x_vars_used(x, nd.b) || x->nodes[nd.b].op == LM_X_CONST) return 0;
  uint64_t va = lm_x_vars_used(x, nd.a), around = 1ull << l;
  for (int32_t q = r->k->loops[l].parent; q >= 0; q = r->k->loops[q].parent) around |= q < 64 ? 1ull << q : 0;
  if (!((va >> l) & 1) || (va & ~around)) return 0;
  lm_expr *map = lm_calloc(r->k->nloops + 1, sizeof *map);
  if (!map) return fail(r, "out of memory"), 0;
  map[l] = lm_x_add(x, lm_x_var(x, l), lm_x_const(x, 1));
  lm_expr step = lm_x_simplify(x, lm_x_sub(x, lm_x_subst(x, nd.a, map, (int)r->k->nloops), nd.a), &r->xc);
  map[l] = r->zero;
  *a0 = lm_x_simplify(x, lm_x_subst(x, nd.a, map, (int)r->k->nloops), &r->xc);
  lm_free(map);
  *d = step;
  return step && *a0 && !((lm_x_vars_used(x, step) >> l) & 1);
}

static void sr_collect(rk *r, int32_t l, lm_expr e, int depth) {
  if (!e || e >= r->x->n || depth > 64) return;
  const lm_xnode nd = r->x->nodes[e];
  if (nd.op < LM_X_ADD) return;
  lm_expr a0 = 0, d = 0;
  int known = 0;
  for (size_t i = 0; i < r->nsr; i++) known |= r->sr[i].mod == e;
  if (!known && sr_candidate(r, l, e, &a0, &d)) {
    if (!LM_GROW(r->sr, r->srcap, r->nsr + 1)) return fail(r, "out of memory");
    r->sr[r->nsr++] = (struct srmod){e, a0, d, l, 0};
    return;
  }
  sr_collect(r, l, nd.a, depth + 1);
  sr_collect(r, l, nd.b, depth + 1);
}

static int in_loop(const rk *r, uint32_t stmt, int32_t l) {
  for (int32_t b = r->blk[stmt]; b >= 0; b = r->k->loops[b].parent)
    if (b == l) return 1;
  return 0;
}

/* The running remainders [mark, nsr) of loop l that its body printed: their start values in the
 * loop's first clause (init 1) or their steps in its last (init 0). */
static void sr_clause(rk *r, lm_sb *sb, int32_t l, size_t mark, int chunk, int init) {
  for (size_t i = mark; i < r->nsr; i++) {
    const struct srmod *q = &r->sr[i];
    if (!q->used) continue;
    if (!init) {
      lm_sb_printf(sb, ", q%d_%zu += q%d_%zud, q%d_%zu -= q%d_%zu >= q%d_%zun ? q%d_%zun : 0", l, i, l, i, l, i, l, i,
                   l, i, l, i);
      continue;
    }
    lm_expr n = r->x->nodes[q->mod].b;
    lm_sb_printf(sb, ", q%d_%zu = lm_floormod(", l, i);
    print_x(r, sb, q->a0, 3, 0);
    if (chunk && lm_x_is_const(r->x, q->d, 1)) lm_sb_puts(sb, " + start");
    else if (chunk) {
      lm_sb_puts(sb, " + start*(");
      print_x(r, sb, q->d, 0, 0);
      lm_sb_puts(sb, ")");
    }
    lm_sb_puts(sb, ", ");
    print_x(r, sb, n, 0, 0);
    lm_sb_printf(sb, "), q%d_%zud = lm_floormod(", l, i);
    print_x(r, sb, q->d, 0, 0);
    lm_sb_puts(sb, ", ");
    print_x(r, sb, n, 0, 0);
    lm_sb_printf(sb, "), q%d_%zun = ", l, i);
    print_x(r, sb, n, 0, 0);
  }
}

/* ---- a finite kernel's one-hot reads printed as gathers ------------------------------------
 * A cell of a per-env grid read at a data-dependent position is, over the primitives, a sum
 * over the columns of the column's value times a one-hot mask (envs/: bricks * (cell == j)).
 * In lane form, for a serial loop J over n columns around one lane loop:
 *   for j < n: lanes i: A[i] = A[i] + (... * ((float)(j + o) == P[i] ? 1 : 0) * ...)
 * At most one j matches P[i] (the columns' indices are distinct), so every other term is a
 * zero times a finite value: with finite values and zeros' signs unobserved
 * (lm_graph_promise_finite) the loop is its body once per lane at the matching column,
 *   lanes i: j = (P[i] is a whole number in [o, o + n)) ? P[i] - o : 0; A[i] = A[i] + (...)
 * where a lane with no match reads column 0 and adds a zero (its mask is 0 there too). The
 * C compiler makes the read a gather: one load per lane in place of n multiply-adds. Printing
 * only, as the selects above. */
static int pure_value(uint8_t op) { /* no effect, no accumulator, no draw */
  return op <= LM_S_SELECT && op != LM_S_RAND ? 1 : op == LM_S_INDEX;
}

typedef struct gather_form {
  int32_t C;   /* the lane loop */
  uint32_t p;  /* the statement compared with the column's index, read at lane i */
  int64_t off; /* o */
} gather_form;

static int var_plus(const lm_exprs *x, lm_expr e, int32_t v, int64_t *off) { /* e = v + off */
  const lm_xnode *n = lm_x_node(x, e);
  if (n->op == LM_X_VAR) return n->v == v ? (*off = 0, 1) : 0;
  if (n->op != LM_X_ADD) return 0;
  const lm_xnode *a = lm_x_node(x, n->a), *b = lm_x_node(x, n->b);
  if (a->op == LM_X_VAR && a->v == v && b->op == LM_X_CONST) return *off = b->v, 1;
  if (b->op == LM_X_VAR && b->v == v && a->op == LM_X_CONST) return *off = a->v, 1;
  return 0;
}

/* f (resolved) = (INDEX(J + o) == P) as 1 - ((a < b) + (b < a)), P a lane load of loop C */
static int onehot_factor(const rk *r, uint32_t f, int32_t J, int32_t C, gather_form *g) {
  uint32_t ne, a, b;
  int32_t via = -2;
  if (!fin_not(r, f, &ne, &via) || via != -2) return 0;
  const lm_stmt *s = &r->k->stmts[ne];
  if (s->op != LM_S_ADD) return 0;
  const lm_stmt *p = &r->k->stmts[s->a], *q = &r->k->stmts[s->b];
  if (p->op != LM_S_LT || q->op != LM_S_LT || p->a != q->b || p->b != q->a) return 0;
  a = p->a, b = p->b;
  for (int side = 0; side < 2; side++) {
    const lm_stmt *ix = &r->k->stmts[side ? b : a], *ld = &r->k->stmts[side ? a : b];
    if (ix->op != LM_S_INDEX || !var_plus(r->x, ix->idx, J, &g->off)) continue;
    if (ld->op != LM_S_LOAD || !ld->local || !lm_x_is_const(r->x, ld->valid, 1)) continue;
    const lm_xnode *li = lm_x_node(r->x, ld->idx);
    if (li->op != LM_X_VAR || li->v != C) continue;
    g->p = side ? a : b;
    return 1;
  }
  return 0;
}

static int onehot_product(const rk *r, uint32_t t, int32_t J, int32_t C, gather_form *g, int depth) {
  if (onehot_factor(r, t, J, C, g)) return 1;
  const lm_stmt *s = &r->k->stmts[t];
  return depth < 8 && s->op == LM_S_MUL &&
         (onehot_product(r, s->a, J, C, g, depth + 1) || onehot_product(r, s->b, J, C, g, depth + 1));
}

/* Loop J: serial, a constant extent, pure statements and then one lane loop of pure statements
 * and a single store, A[i] = A[i] + T with a one-hot factor in T. */
static int gather_loop(const rk *r, int32_t J, gather_form *g) {
  const lm_kernel *k = r->k;
  const lm_loop *lj = &k->loops[J];
  if (!k->finite || r->dia != LM_DIALECT_C || lj->kind != LM_L_SERIAL || lm_x_node(r->x, lj->extent)->op != LM_X_CONST ||
      lj->body.n == 0)
    return 0;
  const lm_item *last = &lj->body.items[lj->body.n - 1];
  if (!last->is_loop || k->loops[last->id].kind != LM_L_LANES) return 0;
  g->C = (int32_t)last->id;
  const lm_block *bc = &k->loops[g->C].body;
  for (size_t i = 0; i + 1 < lj->body.n; i++)
    if (lj->body.items[i].is_loop || !pure_value(k->stmts[lj->body.items[i].id].op)) return 0;
  uint32_t store = UINT32_MAX;
  for (size_t i = 0; i < bc->n; i++) {
    if (bc->items[i].is_loop) return 0;
    const lm_stmt *s = &k->stmts[bc->items[i].id];
    if (s->op == LM_S_STORE && store == UINT32_MAX) store = bc->items[i].id;
    else if (!pure_value(s->op)) return 0;
  }
  if (store == UINT32_MAX) return 0;
  const lm_stmt *st = &k->stmts[store];
  const lm_xnode *si = lm_x_node(r->x, st->idx);
  if (!st->local || si->op != LM_X_VAR || si->v != g->C || !lm_x_is_const(r->x, st->valid, 1)) return 0;
  const lm_stmt *sum = &k->stmts[st->a];
  if (sum->op != LM_S_ADD) return 0;
  for (int side = 0; side < 2; side++) {
    const lm_stmt *acc = &k->stmts[side ? sum->b : sum->a];
    if (acc->op != LM_S_LOAD || !acc->local || acc->buf != st->buf || acc->idx != st->idx) continue;
    if (onehot_product(r, side ? sum->a : sum->b, J, g->C, g, 0)) return 1;
  }
  return 0;
}

static void emit_block(rk *r, lm_sb *sb, int32_t loop, int ind);

/* Loop J as its lane loop, the column the lane's value names in J's variable. */
static void emit_gather(rk *r, lm_sb *sb, int32_t J, const gather_form *g, int ind) {
  const lm_kernel *k = r->k;
  int64_t n = lm_x_node(r->x, k->loops[J].extent)->v;
  indent(sb, ind);
  lm_sb_puts(sb, "LM_LANES\n");
  indent(sb, ind);
  lm_sb_printf(sb, "for (%s i%d = 0; i%d < ", r->d->i64, g->C, g->C);
  print_x(r, sb, k->loops[g->C].extent, 2, 0);
  lm_sb_printf(sb, "; i%d++) { /* loop %d as a gather */\n", g->C, J);
  indent(sb, ind + 1);
  lm_sb_printf(sb, "const float g%d = ", J);
  print_expr(r, sb, g->p, 0); /* the load itself: its variable, if it has one, comes later */
  lm_sb_puts(sb, ";\n");
  indent(sb, ind + 1);
  lm_sb_printf(sb, "const %s i%d = (g%d >= %lld.0f && g%d < %lld.0f && g%d == (float)(%s)g%d) ? (%s)g%d - %lld : 0;\n",
               r->d->i64, J, J, (long long)g->off, J, (long long)(g->off + n), J, r->d->i64, J, r->d->i64, J,
               (long long)g->off);
  const lm_block *bj = &k->loops[J].body;
  for (size_t i = 0; i + 1 < bj->n && !r->bad; i++) emit_stmt(r, sb, bj->items[i].id, ind + 1);
  emit_block(r, sb, g->C, ind + 1);
  indent(sb, ind);
  lm_sb_puts(sb, "}\n");
}

/* A point loop (independent points the interchange moved inside a reduction) of 8 or 16
 * iterations, no loop in it, inside a serial loop that is not a point loop: its accumulators are
 * local arrays of one AVX-512 vector. clang vectorised it as one 16-wide iteration and then kept
 * those arrays in memory, storing every accumulator after every FMA; asked for 8 lanes it keeps
 * them in registers (two vectors each). The same per-element arithmetic in either width: the
 * same bits. Measured on a 2-core Zen 4 EPYC (one thread, MinAtar Breakout's convolution forward
 * as generated, 1024 rows, bitwise equal): 46 -> 90 GFLOP/s; 78 unrolled whole at 16 wide; with
 * AVX2 the vectoriser's own width is 8 and it was at 103 already. At most 8 vectors of 8 in
 * accumulators: the convolution's weight gradient, 12 arrays of 16 (24 vectors of 8), ran 1.6x
 * slower narrowed (its share of a PPO profile 6.2% -> 9.9%). Not a rule: it changes no
 * statement, only what the C compiler is told about a loop. */
static int narrow_point(const rk *r, int32_t l) {
  const lm_kernel *k = r->k;
  const lm_loop *lp = &k->loops[l];
  if (r->dia != LM_DIALECT_C || lp->kind != LM_L_SERIAL || !lp->point || !constish(r->x, lp->extent)) return 0;
  int64_t e = lm_x_eval(r->x, lp->extent, NULL, NULL);
  if (e != 8 && e != 16) return 0;
  int accs = 0; /* local arrays stored in it (items are in order: a store's array counted once) */
  for (size_t i = 0; i < lp->body.n; i++) {
    if (lp->body.items[i].is_loop) return 0;
    const lm_stmt *s = &k->stmts[lp->body.items[i].id];
    if (s->op != LM_S_STORE || !s->local) continue;
    int seen = 0;
    for (size_t j = 0; j < i && !seen; j++) {
      const lm_stmt *t = &k->stmts[lp->body.items[j].id];
      seen = t->op == LM_S_STORE && t->local && t->buf == s->buf;
    }
    accs += !seen;
  }
  if (accs * (e / 8) > 8) return 0;
  for (int32_t p = lp->parent; p >= 0; p = k->loops[p].parent)
    if (k->loops[p].kind == LM_L_SERIAL && !k->loops[p].point) return 1;
  return 0;
}

/* ---- column loops in tiles of 16 (C dialect) -------------------------------------------------
 * A serial loop J of constant extent around one lane loop, where the lanes read or write a
 * global array along rows: element j + K * lane, K >= 16 — an env's row of K floats, the lanes
 * being envs. Each lane's access then strides K floats, a gather or a scatter of one element per
 * lane and column (MinAtar Breakout's 400 observation values a step, its 108 state floats in and
 * out: 80% of a 4096-env vec-env step on one thread). Printed in tiles of 16 columns: a strided
 * read is first copied into a local tile [16][lanes] by 16 x 16 register transposes of rows
 * (lm_tr16), the body runs on the tiles, and a strided store goes out the same way; a partial
 * last tile copies element by element. The statements, their order within each lane and every
 * value are the loop's own: only when a buffer's elements move between memory and the tile
 * changes. A read comes before the tile's columns run, a write after; so no other access in the
 * loop may touch a written buffer, and no read tile's buffer may be written (distinct buffers do
 * not alias: restrict parameters). A 4096-env vec-env step on one thread of a 2-core Zen 5
 * EPYC, medians of 3 interleaved: Breakout 967 -> 335 us, Space Invaders 2965 -> 1497 us (two
 * threads: 491 -> 172 and 1060 -> 514); built for AVX2 (-march=znver3) Breakout's went 640 ->
 * 512 us (one run each), the 16-float rows then two registers. Only where the access is
 * unguarded (a whole lane block, find_tails); LUMEN_NO_TILES=1 turns it off. Not a rule: it is
 * the choice of C the loop is printed as; the loop IR has no register transposes and no tile
 * scoped to a strip of a loop. */
enum { TILE_W = 16, TILE_MAX = 4 };

/* e names loop variable v (v < 0: any loop variable); unlike lm_x_vars_used, at any number */
static int x_names_var(const lm_exprs *x, lm_expr e, int64_t v) {
  if (!e) return 0;
  const lm_xnode *nd = &x->nodes[e];
  if (nd->op == LM_X_VAR) return v < 0 || nd->v == v;
  return nd->op != LM_X_CONST && nd->op != LM_X_SYM && (x_names_var(x, nd->a, v) || x_names_var(x, nd->b, v));
}

typedef struct tile_form {
  int32_t L;                /* the lane loop */
  int64_t C, W;             /* J's extent, lanes */
  uint32_t acc[TILE_MAX];   /* the strided accesses, each a tile */
  int64_t K[TILE_MAX];      /* their strides along the lanes */
  int n;
  uint32_t local;           /* a copy between one row access and a local array and nothing else:
                             * that array's access (transposed straight between the two), else
                             * UINT32_MAX */
  int64_t S;                /* the local array's stride along J */
} tile_form;

/* valid holds at every point this print reaches (the tail guards of a full block print as 1) */
static int holds(const rk *r, lm_expr valid) {
  if (!valid || lm_x_is_const(r->x, valid, 1)) return 1;
  for (int i = 0; r->full && i < r->ntail; i++)
    if (valid == r->tail[i]) return 1;
  return 0;
}

/* A global access of J's lane loop that steps by 1 along J and by K >= 16 along the lanes. */
static int strided_row(rk *r, const lm_stmt *s, int32_t J, int32_t L, int64_t *K) {
  int64_t dj = 0, dl = 0;
  int nv = (int)r->k->nloops;
  return !s->local && holds(r, s->valid) && lm_x_step(r->x, s->idx, J, nv, &dj) && dj == 1 &&
         lm_x_step(r->x, s->idx, L, nv, &dl) && dl >= TILE_W && (*K = dl, 1);
}

/* The loop only copies a row to or from a local array (an env's state into the lanes and back):
 * J's body is the lane loop, whose live statements are the one row access and a local access,
 * each the other's value, the local one stepping by 1 along the lanes. Then a whole tile is
 * transposed straight between the two, without the tile (LUMEN_NO_TILE_DIRECT=1: through it).
 * A 4096-env vec-env step, medians of 3 interleaved: Breakout 267 -> 217 us on one thread,
 * 136 -> 110 on two; Space Invaders 942 -> 800 and 453 -> 381. */
static void direct_copy(rk *r, int32_t J, tile_form *t) {
  const lm_kernel *k = r->k;
  t->local = UINT32_MAX;
  if (t->n != 1) return;
  for (size_t i = 0; i + 1 < k->loops[J].body.n; i++)
    if (r->live[k->loops[J].body.items[i].id]) return;
  const lm_block *bl = &k->loops[t->L].body;
  uint32_t row = t->acc[0], other = UINT32_MAX;
  for (size_t i = 0; i < bl->n; i++) {
    uint32_t id = bl->items[i].id;
    if (!r->live[id] || id == row) continue;
    if (other != UINT32_MAX) return;
    other = id;
  }
  if (other == UINT32_MAX) return;
  const lm_stmt *a = &k->stmts[row], *b = &k->stmts[other];
  int in = a->op == LM_S_LOAD;
  if (!b->local || b->op != (in ? LM_S_STORE : LM_S_LOAD) || (in ? b->a != row : a->a != other) ||
      !holds(r, b->valid) || r->uses[in ? row : other] != 1 || r->spec[other])
    return;
  int64_t dl = 0, dj = 0;
  int nv = (int)k->nloops;
  if (!lm_x_step(r->x, b->idx, t->L, nv, &dl) || dl != 1 || !lm_x_step(r->x, b->idx, J, nv, &dj) || dj < TILE_W) return;
  t->local = other;
  t->S = dj;
}

static int tile_loop(rk *r, int32_t J, tile_form *t) {
  const lm_kernel *k = r->k;
  const lm_loop *lj = &k->loops[J];
  if (r->dia != LM_DIALECT_C || r->flat || lj->kind != LM_L_SERIAL || !constish(r->x, lj->extent) || lj->body.n == 0 ||
      getenv("LUMEN_NO_TILES"))
    return 0;
  t->C = lm_x_eval(r->x, lj->extent, NULL, NULL);
  const lm_item *last = &lj->body.items[lj->body.n - 1];
  if (t->C < TILE_W || !last->is_loop || k->loops[last->id].kind != LM_L_LANES) return 0;
  t->L = (int32_t)last->id;
  if (!constish(r->x, k->loops[t->L].extent)) return 0;
  t->W = lm_x_eval(r->x, k->loops[t->L].extent, NULL, NULL);
  if (t->W < TILE_W || t->W % TILE_W || t->W > 64) return 0; /* tiles of at most 4 KB */
  for (size_t i = 0; i + 1 < lj->body.n; i++)
    if (lj->body.items[i].is_loop || !pure_value(k->stmts[lj->body.items[i].id].op)) return 0;
  const lm_block *bl = &k->loops[t->L].body;
  t->n = 0;
  for (size_t i = 0; i < bl->n; i++) { /* the tiles: every global store, the strided reads */
    if (bl->items[i].is_loop) return 0;
    uint32_t id = bl->items[i].id;
    const lm_stmt *s = &k->stmts[id];
    if (!r->live[id]) continue;
    if (s->op != LM_S_STORE && !pure_value(s->op)) return 0;
    if (s->op != LM_S_LOAD && s->op != LM_S_STORE) continue;
    int64_t K;
    if (s->local || r->spec[id] || r->vary[id]) {
      if (s->op == LM_S_LOAD || s->local) continue;
      return 0;
    }
    if (!strided_row(r, s, J, t->L, &K)) {
      if (s->op == LM_S_STORE) return 0;
      continue;
    }
    if (t->n == TILE_MAX || K < t->C) return 0; /* rows that overlap: the order of stores matters */
    t->acc[t->n] = id;
    t->K[t->n++] = K;
  }
  if (t->n == 0) return 0;
  for (uint32_t i = 0; i < k->nstmts; i++) { /* no other access of a written buffer */
    const lm_stmt *s = &k->stmts[i];
    if (!r->live[i] || s->local || (s->op != LM_S_LOAD && s->op != LM_S_STORE) || !in_loop(r, i, J)) continue;
    for (int a = 0; a < t->n; a++) {
      const lm_stmt *w = &k->stmts[t->acc[a]];
      if (t->acc[a] != i && w->buf == s->buf && (w->op == LM_S_STORE || s->op == LM_S_STORE)) return 0;
    }
  }
  direct_copy(r, J, t);
  return 1;
}

/* tile t's element of the current column and lane */
static void print_tile_at(rk *r, lm_sb *sb, int t) {
  lm_sb_printf(sb, "lm_t%d_%d[(i%d - i%dt)*%lld + i%d]", r->tile_j, t, r->tile_j, r->tile_j, (long long)r->tile_w,
               r->tile_l);
}

/* `if (the tile is whole) { J = its first column; for (each 16 lanes) ` */
static void open_whole_tile(rk *r, lm_sb *sb, int32_t J, const tile_form *t, int ind) {
  const char *i64 = r->d->i64;
  indent(sb, ind);
  lm_sb_printf(sb, "if (i%dt + %d <= %lld) {\n", J, TILE_W, (long long)t->C);
  indent(sb, ind + 1);
  lm_sb_printf(sb, "const %s i%d = i%dt;\n", i64, J, J);
  indent(sb, ind + 1);
  lm_sb_printf(sb, "for (%s i%d = 0; i%d < %lld; i%d += %d) ", i64, t->L, t->L, (long long)t->W, t->L, TILE_W);
}

/* Copies tile a between its buffer and the local tile: in (a read) or out (a store), for the
 * tile whose first column is i<J>t. */
static void emit_tile_copy(rk *r, lm_sb *sb, int32_t J, const tile_form *t, int a, int ind) {
  const lm_stmt *s = &r->k->stmts[t->acc[a]];
  int in = s->op == LM_S_LOAD;
  const char *i64 = r->d->i64;
  open_whole_tile(r, sb, J, t, ind);
  (in ? r->bufrd : r->bufwr)[s->buf] = 1;
  if (in) lm_sb_printf(sb, "lm_tr16(&lm_t%d_%d[i%d], %lld, &b%u[", J, a, t->L, (long long)t->W, s->buf);
  else lm_sb_printf(sb, "lm_tr16(&b%u[", s->buf);
  print_x(r, sb, s->idx, 0, 0);
  if (in) lm_sb_printf(sb, "], %lld);\n", (long long)t->K[a]);
  else lm_sb_printf(sb, "], %lld, &lm_t%d_%d[i%d], %lld);\n", (long long)t->K[a], J, a, t->L, (long long)t->W);
  indent(sb, ind);
  lm_sb_puts(sb, "} else {\n");
  indent(sb, ind + 1);
  lm_sb_printf(sb, "for (%s i%d = i%dt; i%d < %lld; i%d++)\n", i64, J, J, J, (long long)t->C, J);
  indent(sb, ind + 2);
  lm_sb_printf(sb, "for (%s i%d = 0; i%d < %lld; i%d++) ", i64, t->L, t->L, (long long)t->W, t->L);
  if (!in) {
    lm_sb_printf(sb, "b%u[", s->buf);
    print_x(r, sb, s->idx, 0, 0);
    lm_sb_puts(sb, "] = ");
  }
  print_tile_at(r, sb, a);
  if (in) {
    lm_sb_printf(sb, " = b%u[", s->buf);
    print_x(r, sb, s->idx, 0, 0);
    lm_sb_puts(sb, "]");
  }
  lm_sb_puts(sb, ";\n");
  indent(sb, ind);
  lm_sb_puts(sb, "}\n");
}

static void emit_block(rk *r, lm_sb *sb, int32_t loop, int ind);

/* The divisions and modulos of e applied to an operand that names J without dividing it
 * first: *any set when there is one, *fold cleared when one's divisor is no constant multiple
 * of 4 (i / 4 % 10 counts its / 4 only: the % 10 then applies to a value a group of 4 shares). */
static void j_divisors(const lm_exprs *x, lm_expr e, int32_t J, int *any, int *fold) {
  if (!e) return;
  const lm_xnode *nd = &x->nodes[e];
  if (nd->op == LM_X_CONST || nd->op == LM_X_VAR || nd->op == LM_X_SYM) return;
  if ((nd->op == LM_X_DIV || nd->op == LM_X_MOD) && x_names_var(x, nd->a, J)) {
    int inner = 0, ignored = 1;
    j_divisors(x, nd->a, J, &inner, &ignored);
    if (inner) { /* the operand divides J already */
      *any = 1;
      *fold &= ignored;
      return;
    }
    const lm_xnode *b = &x->nodes[nd->b];
    *any = 1;
    if (b->op != LM_X_CONST || b->v % 4) *fold = 0;
    return;
  }
  j_divisors(x, nd->a, J, any, fold);
  j_divisors(x, nd->b, J, any, fold);
}

/* Columns printed 4 at a time where J's statements divide or take a modulo of J by multiples
 * of 4 (a stacked row's fields, i % 4 < 1, 1 < i % 4 && i % 4 < 3, ...): in each copy j = q + c
 * with q a multiple of 4, so the C compiler folds those tests. Left as one loop, clang 14
 * turned such a chain of tests into a switch and kept the lane loop scalar ("loop contains a
 * switch statement"). MinAtar Breakout's vec-env step, 4096 envs on a 2-core Zen 5, medians of 3
 * interleaved with LUMEN_NO_TILE_UNROLL=1: same-step (its lanes write obs and final_obs) 4696 ->
 * 421 us on one thread, 2346 -> 228 on two; next-step 311 -> 262 and 162 -> 137. Space
 * Invaders' tests are i % 6, which 4 columns do not fold: 1 there, as where nothing divides J
 * or 4 does not divide its extent. Built for AVX2 (-march=znver3), same-step 3647-3733 -> 1076-
 * 1126 us (two runs each). */
static int tile_unroll(rk *r, int32_t J, const tile_form *t) {
  if (t->C % 4 || getenv("LUMEN_NO_TILE_UNROLL")) return 1;
  const lm_kernel *k = r->k;
  int any = 0, fold = 1;
  for (uint32_t i = 0; i < k->nstmts && fold; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (!r->live[i] || !in_loop(r, i, J)) continue;
    if (s->op == LM_S_LOAD || s->op == LM_S_STORE || s->op == LM_S_INDEX) j_divisors(r->x, s->idx, J, &any, &fold);
    j_divisors(r->x, s->valid, J, &any, &fold);
  }
  return any && fold ? 4 : 1;
}

/* A copy between a row and a local array (direct_copy), every tile by transposes: a copy writes
 * what it wrote before when it runs twice, so the last tile is the row's last 16 columns
 * (Breakout's 108: the last 12 element by element had taken 10% of its vec-env step). */
static void emit_direct(rk *r, lm_sb *sb, int32_t J, const tile_form *t, int ind) {
  const lm_stmt *g = &r->k->stmts[t->acc[0]], *l = &r->k->stmts[t->local];
  const char *i64 = r->d->i64;
  int in = g->op == LM_S_LOAD;
  indent(sb, ind);
  lm_sb_printf(sb, "for (%s i%dt = 0; i%dt < %lld; i%dt += %d) { /* loop %d in tiles of %d columns, transposed */\n",
               i64, J, J, (long long)t->C, J, TILE_W, J, TILE_W);
  /* the last tile ends where the row does: the columns it shares with the one before, twice */
  indent(sb, ind + 1);
  lm_sb_printf(sb, "const %s i%d = i%dt + %d <= %lld ? i%dt : %lld;\n", i64, J, J, TILE_W, (long long)t->C, J,
               (long long)(t->C - TILE_W));
  indent(sb, ind + 1);
  lm_sb_printf(sb, "for (%s i%d = 0; i%d < %lld; i%d += %d) lm_tr16(", i64, t->L, t->L, (long long)t->W, t->L, TILE_W);
  (in ? r->bufrd : r->bufwr)[g->buf] = 1;
  for (int side = 0; side < 2; side++) { /* the destination first */
    const lm_stmt *s = (side == 0) == in ? l : g;
    lm_sb_printf(sb, "&%c%u[", s->local ? 'l' : 'b', s->buf);
    print_x(r, sb, s->idx, 0, 0);
    lm_sb_printf(sb, "], %lld%s", (long long)(s->local ? t->S : t->K[0]), side ? ");\n" : ", ");
  }
  indent(sb, ind);
  lm_sb_puts(sb, "}\n");
}

static void emit_tiled(rk *r, lm_sb *sb, int32_t J, const tile_form *t, int ind) {
  const lm_kernel *k = r->k;
  const char *i64 = r->d->i64;
  r->varuse[J] = r->varuse[t->L] = 1;
  if (t->local != UINT32_MAX && !getenv("LUMEN_NO_TILE_DIRECT")) {
    emit_direct(r, sb, J, t, ind);
    return;
  }
  indent(sb, ind);
  lm_sb_printf(sb, "for (%s i%dt = 0; i%dt < %lld; i%dt += %d) { /* loop %d in tiles of %d columns */\n", i64, J, J,
               (long long)t->C, J, TILE_W, J, TILE_W);
  for (int a = 0; a < t->n; a++) {
    indent(sb, ind + 1);
    lm_sb_printf(sb, "float lm_t%d_%d[%lld] LM_LOCAL;\n", J, a, (long long)(TILE_W * t->W));
  }
  for (int a = 0; a < t->n; a++)
    if (k->stmts[t->acc[a]].op == LM_S_LOAD) emit_tile_copy(r, sb, J, t, a, ind + 1);
  int U = tile_unroll(r, J, t);
  indent(sb, ind + 1);
  if (U == 1) {
    lm_sb_printf(sb, "for (%s i%d = i%dt; i%d < i%dt + %d && i%d < %lld; i%d++) {\n", i64, J, J, J, J, TILE_W, J,
                 (long long)t->C, J);
    emit_block(r, sb, J, ind + 2);
  } else {
    lm_sb_printf(sb, "for (%s i%dq = i%dt; i%dq < i%dt + %d && i%dq < %lld; i%dq += %d) { /* %d columns a time */\n",
                 i64, J, J, J, J, TILE_W, J, (long long)t->C, J, U, U);
    for (int u = 0; u < U && !r->bad; u++) {
      indent(sb, ind + 2);
      lm_sb_printf(sb, "{\n");
      indent(sb, ind + 3);
      lm_sb_printf(sb, "const %s i%d = i%dq + %d;\n", i64, J, J, u);
      emit_block(r, sb, J, ind + 3);
      indent(sb, ind + 2);
      lm_sb_puts(sb, "}\n");
    }
  }
  indent(sb, ind + 1);
  lm_sb_puts(sb, "}\n");
  for (int a = 0; a < t->n; a++)
    if (k->stmts[t->acc[a]].op == LM_S_STORE) emit_tile_copy(r, sb, J, t, a, ind + 1);
  indent(sb, ind);
  lm_sb_puts(sb, "}\n");
}

/* ---- the point loop's scalar head as a loop of its own (C dialect) ----------------------------
 * A kernel's point loop whose body opens with per-point scalar work (a loss's per-row terms: its
 * clipped ratio, log-softmax and entropy over 2 actions, their gradients) and goes on with long
 * loops (the row's 64-wide layer) is printed as two loops over the same points: the head, then
 * the rest. A loop with a long loop inside is not vectorised by the C compiler; the head alone
 * is, 16 points a time, once its indices are computed from the point rather than carried as
 * running remainders (a remainder carried from point to point is a recurrence the vectoriser
 * cannot widen). CartPole's update kernel of the loss's terms, timed alone on one thread (Xeon
 * model 207): 12.0 -> 3.2 us a 128-row minibatch. The points of a parallel loop are
 * independent, so running every point's head before any point's rest reads and writes the
 * same values: legal where no value the head computes is used by the rest except through
 * memory, and no local array is touched by both (a local is reused from point to point). The
 * same statements in the same order at each point: the same bits, where the head calls no libm
 * function that libmvec's vector form rounds otherwise (sinf; expf and logf outside kernels that
 * allow contraction, whose exp2 and log2 are lm_exp2_c and lm_log2_c: the same bits in either
 * form). Not a rule: it changes how the point loop is printed, not what a point computes. */
static int has_lanes(const lm_kernel *k);
enum { FISSION_SMALL = 8 }; /* a head's loops: constant extents up to this, which clang unrolls */

static int small_loop(const rk *r, int32_t l) {
  const lm_loop *lp = &r->k->loops[l];
  if (lp->kind != LM_L_SERIAL || lp->when || !constish(r->x, lp->extent) ||
      lm_x_eval(r->x, lp->extent, NULL, NULL) > FISSION_SMALL)
    return 0;
  for (size_t i = 0; i < lp->body.n; i++)
    if (lp->body.items[i].is_loop && !small_loop(r, (int32_t)lp->body.items[i].id)) return 0;
  return 1;
}

/* Per statement, the item of loop l's body that holds it (UINT32_MAX: not inside l); NULL when
 * memory ran out. */
static uint32_t *items_of(const rk *r, int32_t l) {
  const lm_kernel *k = r->k;
  const lm_block *b = &k->loops[l].body;
  uint32_t *at = lm_malloc((k->nstmts + 1) * sizeof *at), *loop_at = lm_malloc((k->nloops + 1) * sizeof *loop_at);
  if (!at || !loop_at) {
    lm_free(at);
    lm_free(loop_at);
    return NULL;
  }
  for (size_t i = 0; i < k->nstmts; i++) at[i] = UINT32_MAX;
  for (size_t i = 0; i < k->nloops; i++) loop_at[i] = UINT32_MAX;
  for (size_t i = 0; i < b->n; i++) (b->items[i].is_loop ? loop_at : at)[b->items[i].id] = (uint32_t)i;
  for (uint32_t i = 0; i < k->nstmts; i++) {
    int32_t c = r->blk[i];
    if (c == l || c < 0) continue;
    while (c >= 0 && k->loops[c].parent != l) c = k->loops[c].parent;
    at[i] = c < 0 ? UINT32_MAX : loop_at[c];
  }
  lm_free(loop_at);
  return at;
}

/* Does printing statement s in the rest (items from cut on) need a value of the head? */
static int needs_head(const rk *r, const uint32_t *at, size_t cut, uint32_t s, int depth) {
  const lm_kernel *k = r->k;
  int m = lm_sop_operands(k->stmts[s].op);
  for (int j = 0; j < 2; j++) {
    if (!(m & (1 << j))) continue;
    uint32_t o = j ? k->stmts[s].b : k->stmts[s].a;
    if (o >= k->nstmts || at[o] == UINT32_MAX || at[o] >= cut) continue;
    if (!r->inl[o] || r->spec[o] || depth > 64) return 1;
    if (needs_head(r, at, cut, o, depth + 1)) return 1; /* inlined: printed where it is used */
  }
  return 0;
}

/* Where the point loop l splits (the rest's first item), 0 where it does not. */
static size_t point_fission(const rk *r, int32_t l) {
  const lm_kernel *k = r->k;
  if (r->dia != LM_DIALECT_C || l != 0 || k->npar != 1 || r->flat || k->measured || has_lanes(k) ||
      getenv("LUMEN_NO_FISSION"))
    return 0;
  const lm_block *b = &k->loops[l].body;
  size_t cut = 0;
  while (cut < b->n && (!b->items[cut].is_loop || small_loop(r, (int32_t)b->items[cut].id))) cut++;
  if (cut == b->n) return 0; /* no long loop: nothing keeps the whole body from vectorising */
  /* statements just before the long loop that only the rest uses go with it (a row's load) */
  while (cut > 0 && !b->items[cut - 1].is_loop && k->stmts[b->items[cut - 1].id].op != LM_S_STORE) cut--;
  if (!cut) return 0;
  uint32_t *at = items_of(r, l);
  uint8_t *side = lm_calloc(k->nlocals + 1, 1); /* per local array: 1 the head touches it, 2 the rest */
  int head_stores = 0, ok = at && side;
  for (uint32_t i = 0; i < k->nstmts && ok; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (!r->live[i] || at[i] == UINT32_MAX) continue;
    int head = at[i] < cut;
    if (!head && needs_head(r, at, cut, i, 0)) ok = 0;
    /* a libm call vectorised (libmvec) rounds otherwise than in a remainder: a row's value would
     * follow how many rows the batch has; a contracting kernel's exp2 and log2 are inline */
    if (head && (s->op == LM_S_SIN || ((s->op == LM_S_EXP2 || s->op == LM_S_LOG2) && !k->contract))) ok = 0;
    if ((s->op == LM_S_LOAD || s->op == LM_S_STORE) && s->local && s->buf < k->nlocals) {
      side[s->buf] |= (uint8_t)(head ? 1 : 2);
      if (side[s->buf] == 3) ok = 0;
    }
    head_stores += head && s->op == LM_S_STORE && !s->local;
  }
  lm_free(at);
  lm_free(side);
  return ok && head_stores ? cut : 0;
}

/* A serial loop of a contracting kernel (C dialect) that carries at most LATENCY_ACCS floats
 * from one iteration to the next: accumulators declared outside it that it sums or maxes
 * into, and local arrays it stores (a jammed layer's few outputs). Summed in order, each
 * iteration waits on the last one's add, an FMA's latency (4 cycles) per element: a PPO
 * update's 64 -> 2 and 64 -> 1 heads over 4 jammed rows ran at that bound, 8 of the forward
 * kernel's 41 us. Printed in a block under LM_REASSOC, clang vectorises the sum with partial
 * sums. A graph that allows contraction has given up the reference's rounding (graph.h), and
 * the order is fixed when the kernel is built: every run of it, on any number of threads,
 * gives the same bits. Wider accumulators are throughput-bound register tiles already, and
 * there reassociation let clang vectorise the reduction's own loop through strided loads
 * (the update's weight gradients: 21 -> 29 us). Not a rule: it changes no statement, only
 * what the C compiler may do with a loop's sums. */
enum { LATENCY_ACCS = 16, SCAN_ACCS = 64 };

/* A fused scan of a graph that allows contraction (fast_exp) keeps its env's roundings (the
 * env's arithmetic as the reference rounds it): only the policy's loops may have their sums
 * reordered there. Loop l is the policy's when it reads a trainable parameter (a layer's weights
 * or bias): an env's step reads none, and what the lowering inlines into such a loop (an
 * observation's arithmetic) feeds only that loop's values. A rollout steps a few envs at a
 * time, one after another in a chunk: each 64-wide layer's sum waited on the last add, and the
 * critic's 64 -> 1 head, a sum over tanh values, ran as a scalar loop (64 scalar exp2 and
 * divisions a step; clang vectorises a sum only where it may reorder it). With both under
 * LM_REASSOC, CartPole's rollout of 8 envs x 128 steps took 412 -> 245 us a call on two threads
 * (lumen's defaults; Xeon model 207). */
static int policy_loop(const rk *r, int32_t l) {
  const lm_kernel *k = r->k;
  const lm_plan *p = r->p;
  for (uint32_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (!r->live[i] || s->op != LM_S_LOAD || s->local || !in_loop(r, i, l) || s->buf >= p->nbufs) continue;
    const lm_pbuf *b = &p->bufs[s->buf];
    if (b->kind == LM_BUF_INPUT && b->index < p->g->ninputs && p->g->inputs[b->index].role == LM_ROLE_PARAM) return 1;
  }
  return 0;
}

static int latency_bound(const rk *r, int32_t l) {
  const lm_kernel *k = r->k;
  if (r->dia != LM_DIALECT_C || !(k->contract || k->fast_exp) || k->loops[l].kind != LM_L_SERIAL || k->loops[l].point)
    return 0;
  if (!k->contract && !policy_loop(r, l)) return 0;
  const int64_t most = k->contract ? LATENCY_ACCS : SCAN_ACCS;
  int64_t accs = 0;
  uint8_t *seen = lm_calloc(k->nlocals + 1, 1); /* a local array counted once */
  if (!seen) return 0;
  for (uint32_t i = 0; i < k->nstmts && accs <= most; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (!r->live[i] || !in_loop(r, i, l)) continue;
    if ((s->op == LM_S_ACC_SUM || s->op == LM_S_ACC_MAX) && !in_loop(r, s->a, l)) accs++;
    else if (s->op == LM_S_STORE && s->local && s->buf < k->nlocals && !seen[s->buf]) {
      seen[s->buf] = 1;
      accs += k->locals[s->buf];
    } else if (s->op == LM_S_STORE && !s->local)
      accs = most + 1; /* stores out each iteration: not a reduction's loop */
  }
  lm_free(seen);
  return accs > 0 && accs <= most;
}

static void emit_loop(rk *r, lm_sb *sb, int32_t l, int ind) {
  const lm_kernel *k = r->k;
  if (!has_work(r, l)) return;
  if (latency_bound(r, l) && !r->reassoc) {
    indent(sb, ind);
    lm_sb_puts(sb, "{\n");
    indent(sb, ind + 1);
    lm_sb_puts(sb, "LM_REASSOC\n");
    r->reassoc = 1;
    emit_loop(r, sb, l, ind + 1);
    r->reassoc = 0;
    indent(sb, ind);
    lm_sb_puts(sb, "}\n");
    return;
  }
  size_t cut = r->split_l < 0 ? point_fission(r, l) : 0;
  if (cut) { /* the rows' scalar head over the chunk, then the rest */
    r->split_l = l;
    r->split_from = 0;
    r->split_to = cut;
    r->no_sr = 1;
    emit_loop(r, sb, l, ind);
    r->no_sr = 0;
    r->split_from = cut;
    r->split_to = SIZE_MAX;
    emit_loop(r, sb, l, ind);
    r->split_l = -1;
    return;
  }
  if (k->loops[l].when) { /* a stacked kernel's member: a test, its variable unused */
    indent(sb, ind);
    lm_sb_puts(sb, "if (");
    print_x(r, sb, k->loops[l].when, 0, 0);
    lm_sb_puts(sb, ") {\n");
    emit_block(r, sb, l, ind + 1);
    indent(sb, ind);
    lm_sb_puts(sb, "}\n");
    return;
  }
  gather_form gf;
  if (gather_loop(r, l, &gf)) {
    emit_gather(r, sb, l, &gf, ind);
    return;
  }
  tile_form tf;
  if (!r->tiled && tile_loop(r, l, &tf)) {
    r->tiled = lm_calloc(k->nstmts + 1, 1);
    if (!r->tiled) {
      sb->failed = 1;
      return;
    }
    for (int a = 0; a < tf.n; a++) r->tiled[tf.acc[a]] = (uint8_t)(a + 1);
    r->tile_j = l;
    r->tile_l = tf.L;
    r->tile_w = tf.W;
    emit_tiled(r, sb, l, &tf, ind);
    lm_free(r->tiled);
    r->tiled = NULL;
    return;
  }
  if (l < k->npar && r->flat) { /* the thread index already names this point of the domain */
    emit_block(r, sb, l, ind);
    return;
  }
  /* NVRTC unrolls long constant loops whole (a 64-wide layer costs 255 registers and spills) */
  if (r->dia == LM_DIALECT_CUDA && constish(r->x, k->loops[l].extent) &&
      lm_x_eval(r->x, k->loops[l].extent, NULL, NULL) > 16) {
    indent(sb, ind);
    lm_sb_puts(sb, "#pragma unroll 4\n");
  }
  if (k->loops[l].kind == LM_L_LANES && r->dia == LM_DIALECT_C) {
    indent(sb, ind);
    lm_sb_puts(sb, "LM_LANES\n");
  }
  if (narrow_point(r, l)) {
    indent(sb, ind);
    lm_sb_puts(sb, "LM_NARROW\n");
  }
  if (k->loops[l].kind == LM_L_SPARSE) {
    emit_sparse(r, sb, l, ind);
    return;
  }
  int vec = k->loops[l].kind == LM_L_VECTOR && r->dia == LM_DIALECT_C;
  int chunk = l == 0 && k->npar > 0;
  /* running remainders: the body is printed first, to know which it reads */
  size_t mark = r->nsr;
  if (r->dia == LM_DIALECT_C && (k->loops[l].kind == LM_L_SERIAL || chunk) && !r->no_sr)
    for (uint32_t i = 0; i < k->nstmts && !r->bad; i++)
      if (r->live[i] && (k->stmts[i].op == LM_S_LOAD || k->stmts[i].op == LM_S_STORE) && in_loop(r, i, l))
        sr_collect(r, l, k->stmts[i].idx, 0);
  lm_sb inner = {0};
  if (r->nsr > mark) emit_block(r, &inner, l, ind + 1);
  indent(sb, ind);
  lm_sb_printf(sb, "for (%s i%d = %s", r->d->i64, l, chunk ? "start" : "0");
  sr_clause(r, sb, l, mark, chunk, 1);
  lm_sb_printf(sb, "; i%d < ", l);
  if (chunk) lm_sb_puts(sb, "end");
  else print_x(r, sb, k->loops[l].stop ? k->loops[l].stop : k->loops[l].extent, 2, 0);
  lm_sb_printf(sb, vec ? "; i%d += 8" : "; i%d++", l);
  sr_clause(r, sb, l, mark, chunk, 0);
  lm_sb_puts(sb, ") {\n");
  if (r->nsr > mark) {
    if (inner.s) lm_sb_puts(sb, inner.s);
    if (inner.failed) sb->failed = 1;
    lm_sb_free(&inner);
    r->nsr = mark;
  } else emit_block(r, sb, l, ind + 1);
  indent(sb, ind);
  lm_sb_puts(sb, "}\n");
}

static void emit_block(rk *r, lm_sb *sb, int32_t loop, int ind) {
  const lm_block *b = block_of(r->k, loop);
  size_t from = loop >= 0 && loop == r->split_l ? r->split_from : 0;
  size_t to = loop >= 0 && loop == r->split_l && r->split_to < b->n ? r->split_to : b->n;
  for (size_t i = from; i < to && !r->bad; i++) {
    if (b->items[i].is_loop) emit_loop(r, sb, (int32_t)b->items[i].id, ind);
    else emit_stmt(r, sb, b->items[i].id, ind);
  }
}

/* GPU dialects: each parallel loop variable the body reads, from the flat thread index
 * (loop npar-1 fastest); in a work-group schedule, the grid loops from the group index and
 * the thread loop from the index within the group. */
static void emit_unflatten(rk *r, lm_sb *sb) {
  const lm_kernel *k = r->k;
  int grid = k->group ? k->npar - 1 : k->npar;
  const char *flat = k->group ? "grp" : "gid";
  if (k->group && r->varuse[grid]) lm_sb_printf(sb, "  const %s i%d = (%s)%s;\n", r->d->i64, grid, r->d->i64, r->d->local_id);
  for (int l = 0; l < grid; l++) {
    if (!r->varuse[l]) continue;
    lm_expr stride = lm_x_const(r->x, 1);
    for (int j = l + 1; j < grid; j++) stride = lm_x_mul(r->x, stride, k->loops[j].extent);
    if (!stride) {
      fail(r, "out of memory");
      return;
    }
    lm_sb_printf(sb, "  const %s i%d = ", r->d->i64, l);
    int div = !lm_x_is_const(r->x, stride, 1), mod = l > 0;
    if (div && mod) lm_sb_puts(sb, "(");
    lm_sb_puts(sb, flat);
    if (div) {
      lm_sb_puts(sb, " / ");
      print_x(r, sb, stride, 5, 0);
    }
    if (div && mod) lm_sb_puts(sb, ")");
    if (mod) {
      lm_sb_puts(sb, " % ");
      print_x(r, sb, k->loops[l].extent, 5, 0);
    }
    lm_sb_puts(sb, ";\n");
  }
}

/* i0*F + c with 0 < c < F, the guard of a jammed kernel's copy c (compiler/jam.c): F, else 0. */
static int64_t jam_point(const lm_exprs *x, lm_expr e) {
  const lm_xnode *a = &x->nodes[e];
  if (a->op != LM_X_ADD) return 0;
  const lm_xnode *m = &x->nodes[a->a], *c = &x->nodes[a->b];
  if (m->op != LM_X_MUL || c->op != LM_X_CONST) return 0;
  const lm_xnode *v = &x->nodes[m->a], *f = &x->nodes[m->b];
  if (v->op != LM_X_VAR || v->v != 0 || f->op != LM_X_CONST) return 0;
  return c->v > 0 && c->v < f->v ? f->v : 0;
}

/* The guards compiler/lanes.c puts on every access of a kernel in SIMD lanes whose env count E is
 * not known to be a multiple of the lanes L: blk*L + lane < E (conjuncts of a statement's
 * validity), which hold in every block below E / L. Guarded, clang keeps a lane loop's strided
 * stores scalar, one branch each: CartPole's step as a 1-step scan ran 106 us for 4096 envs on
 * one thread guarded and 39 us with the guards dropped (the dumped kernel, clang -O3). So the C
 * entry runs the blocks below E / L through a copy of the body in which these guards print as 1
 * (full), and the rest through the guarded body: the same statements, no guard on what holds.
 * This is a pass of the printer, not a rule: it changes no statement, only how a run splits its
 * block range, which the loop IR does not express (its chunks come from the pool at run time).
 * A jammed kernel's copies (compiler/jam.c) carry the same kind of guard, i0*L + c < E for its
 * copy c, and split the same way. Found only when every such guard has the same E (without loop
 * variables) and L, in kernels of any number of loops and guards (MinAtar Space Invaders' step:
 * 148 loops: until 2026-12 kernels of over 64 loops or 16 guards kept every guard, which alone
 * cost its vec-env step little, but its tiles below need whole blocks); LUMEN_NO_FULL_BLOCKS=1
 * turns it off (experiments). */
static void find_tails(rk *r) {
  const lm_kernel *k = r->k;
  lm_exprs *x = r->x;
  r->ntail = 0;
  if (r->dia != LM_DIALECT_C || k->npar < 1 || getenv("LUMEN_NO_FULL_BLOCKS")) return;
  int64_t L = 0;
  for (size_t i = 0; i < k->nstmts; i++) {
    const lm_stmt *s = &k->stmts[i];
    if (!r->live[i] || (s->op != LM_S_LOAD && s->op != LM_S_STORE && s->op != LM_S_SELECT) || trivially_valid(r, s->valid))
      continue;
    lm_expr stack[32];
    int sp = 0;
    stack[sp++] = s->valid;
    while (sp > 0) {
      lm_expr e = stack[--sp];
      const lm_xnode nd = x->nodes[e];
      if (nd.op == LM_X_AND && sp + 2 <= 32) {
        stack[sp++] = nd.a;
        stack[sp++] = nd.b;
        continue;
      }
      if (nd.op != LM_X_LT || x_names_var(x, nd.b, -1)) continue;
      int64_t blk = jam_point(x, nd.a);
      if (!blk) { /* the block and one lane loop: i0*L + i<l> */
        const lm_xnode sum = x->nodes[nd.a];
        if (sum.op != LM_X_ADD) continue;
        int64_t l = x->nodes[sum.b].op == LM_X_VAR   ? x->nodes[sum.b].v
                    : x->nodes[sum.a].op == LM_X_VAR ? x->nodes[sum.a].v
                                                     : 0;
        if (l <= 0 || (size_t)l >= k->nloops) continue;
        const lm_xnode ext = x->nodes[k->loops[l].extent]; /* a copy: building expressions may grow the arena */
        if (k->loops[l].kind != LM_L_LANES || ext.op != LM_X_CONST ||
            nd.a != lm_x_add(x, lm_x_mul(x, lm_x_var(x, 0), lm_x_const(x, ext.v)), lm_x_var(x, l)))
          continue;
        blk = ext.v;
      }
      if (L && blk != L) {
        r->ntail = 0;
        return;
      }
      L = blk;
      if (r->ntail && nd.b != r->tail_e) {
        r->ntail = 0;
        return;
      }
      r->tail_e = nd.b;
      int seen = 0;
      for (int t = 0; t < r->ntail; t++) seen |= r->tail[t] == e;
      if (!seen) {
        if (r->ntail == r->tailcap) {
          int cap = r->tailcap ? 2 * r->tailcap : 16;
          lm_expr *t = lm_realloc(r->tail, (size_t)cap * sizeof *t);
          if (!t) {
            r->ntail = 0;
            return;
          }
          r->tail = t;
          r->tailcap = cap;
        }
        r->tail[r->ntail++] = e;
      }
    }
  }
  r->tail_l = L;
}

static void emit_signature(rk *r, lm_sb *sb, const char *name) {
  const lm_kernel *k = r->k;
  const lm_dialect_info *d = r->d;
  lm_sb_printf(sb, "%svoid %s(", d->kernel_qual, name);
  switch (r->dia) {
  case LM_DIALECT_C:
    lm_sb_puts(sb, "float *const *restrict B, const int64_t *restrict S, const uint64_t *restrict R, "
                   "int64_t start, int64_t end) {\n");
    break;
  case LM_DIALECT_CUDA:
    lm_sb_puts(sb, "float *const *B, const long long *S, const unsigned long long *R, long long total) {\n");
    break;
  case LM_DIALECT_OPENCL:
    for (size_t j = 0; j < k->nbufs; j++)
      lm_sb_printf(sb, "__global %sfloat *restrict b%u, ", r->bufwr[k->bufs[j]] ? "" : "const ", k->bufs[j]);
    lm_sb_puts(sb, "__global const long *S, __global const ulong *R, long total) {\n");
    break;
  case LM_DIALECT_MSL:
    for (size_t j = 0; j < k->nbufs; j++)
      lm_sb_printf(sb, "%sdevice float *b%u [[buffer(%zu)]], ", r->bufwr[k->bufs[j]] ? "" : "const ", k->bufs[j], j);
    lm_sb_printf(sb,
                 "constant long *S [[buffer(%zu)]], constant ulong *R [[buffer(%zu)]], "
                 "constant long &total [[buffer(%zu)]], uint tid [[thread_position_in_grid]]%s) {\n",
                 k->nbufs, k->nbufs + 1, k->nbufs + 2,
                 k->group ? ", uint lid [[thread_position_in_threadgroup]], uint gidx [[threadgroup_position_in_grid]]"
                          : "");
    break;
  default: fail(r, "bad dialect"); break;
  }
}

/* With tail guards (find_tails), the blocks below E / L run the full body in a range of their
 * own (start and end shadowed), then the rest the guarded body; the caller closes the block.
 * Each part runs only where its range holds a block: what a body does once per call before its
 * parallel loops (schedule.c's staged copies: 800 KiB for MinAtar's dense layer) is then done
 * once, not once more for an empty part. */
static void emit_tail_split(rk *r, lm_sb *out, const lm_sb *full) {
  if (!r->ntail) return;
  lm_sb_puts(out, "  const int64_t lm_mid = (");
  print_x(r, out, r->tail_e, 0, 0);
  lm_sb_printf(out, ") / %lld;\n", (long long)r->tail_l);
  lm_sb_puts(out, "  const int64_t lm_full_end = lm_mid < end ? lm_mid : end, lm_tail_start = lm_mid > start ? lm_mid : start;\n");
  lm_sb_puts(out, "  if (start < lm_full_end) {\n    const int64_t end = lm_full_end;\n");
  if (full->s) lm_sb_puts(out, full->s);
  lm_sb_puts(out, "  }\n  if (lm_tail_start < end) {\n    const int64_t start = lm_tail_start;\n");
}

/* The C dialect: the kernel's code in an inlined helper whose buffers are restrict parameters,
 * and the exported entry that takes them from B and S. C compilers give restrict its meaning on
 * parameters (clang turns it into alias scopes when it inlines), not on the local pointers the
 * entry would otherwise declare: a 4x16 register tile of a 256^3 matmul read through restrict
 * locals stayed scalar with its accumulators on the stack (9.1 ms, one thread), and vectorised
 * in registers as a helper (0.47 ms). A kernel in SIMD lanes (compiler/lanes.c) keeps the plain
 * form: its lane loops carry their own vectorisation pragma, and as a helper the fused CartPole
 * rollout ran 17% slower (3.34e6 -> 2.77e6 steps/s, rlbench --only rollout). */
static int has_lanes(const lm_kernel *k) {
  for (size_t i = 0; i < k->nloops; i++)
    if (k->loops[i].kind == LM_L_LANES) return 1;
  return 0;
}

/* gcc has no contract pragma inside a function: the kernel's two functions compile under an
 * optimize pragma (both, so the helper still inlines into the entry) */
static const char gcc_contract_on[] = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC push_options\n"
                                      "#pragma GCC optimize(\"fp-contract=fast\")\n#endif\n";
static const char gcc_contract_off[] = "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC pop_options\n#endif\n";

static void emit_c_kernel(rk *r, lm_sb *out, const char *name, const lm_sb *head, const lm_sb *full, const lm_sb *body) {
  const lm_kernel *k = r->k;
  const lm_plan *p = r->p;
  lm_sb args = {0}; /* the entry's arguments, in the order of the helper's parameters */
  int any_buf = 0, any_sym = 0;
  if (k->contract) lm_sb_puts(out, gcc_contract_on);
  lm_sb_printf(out, "LM_HELPER void %s_k(", name);
  for (size_t j = 0; j < k->nbufs; j++) {
    uint32_t b = k->bufs[j];
    if (b >= p->nbufs || !(r->bufrd[b] || r->bufwr[b])) continue;
    lm_sb_printf(out, "%sfloat *restrict b%u, ", r->bufwr[b] ? "" : "const ", b);
    lm_sb_printf(&args, "B[%u], ", b);
    any_buf = 1;
  }
  for (size_t i = 0; i < r->x->nsyms; i++)
    if (r->symuse[i]) {
      lm_sb_printf(out, "const int64_t %s, ", r->symname[i]);
      lm_sb_printf(&args, "S[%zu], ", i);
      any_sym = 1;
    }
  lm_sb_puts(out, "const uint64_t *restrict R, int64_t start, int64_t end) {\n");
  if (k->contract) lm_sb_puts(out, "  LM_CONTRACT\n");
  if (!r->use_r) lm_sb_puts(out, "  (void)R;\n");
  for (size_t i = 0; i < k->nlocals; i++) lm_sb_printf(out, "  float l%zu[%lld] LM_LOCAL;\n", i, (long long)k->locals[i]);
  if (head->s) lm_sb_puts(out, head->s);
  if (k->npar == 0) lm_sb_puts(out, "  if (start == 0 && end > 0) {\n");
  emit_tail_split(r, out, full);
  if (body->s) lm_sb_puts(out, body->s);
  if (r->ntail) lm_sb_puts(out, "  }\n");
  if (k->npar == 0) lm_sb_puts(out, "  }\n");
  lm_sb_puts(out, "}\n");
  emit_signature(r, out, name);
  if (!any_buf) lm_sb_puts(out, "  (void)B;\n");
  if (!any_sym) lm_sb_puts(out, "  (void)S;\n");
  if (k->contract) lm_sb_puts(out, "  LM_FLUSH_ON\n");
  lm_sb_printf(out, "  %s_k(%sR, start, end);\n", name, args.s ? args.s : "");
  lm_sb_puts(out, k->contract ? "  LM_FLUSH_OFF\n}\n" : "}\n");
  if (k->contract) lm_sb_puts(out, gcc_contract_off);
  if (args.failed) out->failed = 1;
  lm_sb_free(&args);
}

/* Symbol names: s_ + the name with non-identifier characters as '_', made unique. */
static int name_symbols(rk *r) {
  const lm_exprs *x = r->x;
  for (size_t i = 0; i < x->nsyms; i++) {
    lm_sb sb = {0};
    lm_sb_puts(&sb, "s_");
    for (const char *c = x->syms[i].name; *c; c++) {
      int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_';
      lm_sb_printf(&sb, "%c", ok ? *c : '_');
    }
    for (size_t j = 0; j < i && !sb.failed; j++)
      if (r->symname[j] && sb.s && !strcmp(r->symname[j], sb.s)) {
        lm_sb_printf(&sb, "_%zu", i);
        break;
      }
    if (!(r->symname[i] = lm_sb_take(&sb))) return 0;
  }
  return 1;
}

static void rk_free(rk *r) {
  if (r->symname)
    for (size_t i = 0; i < r->x->nsyms; i++) lm_free(r->symname[i]);
  lm_free(r->symname);
  lm_free(r->ext);
  lm_free(r->live);
  lm_free(r->inl);
  lm_free(r->uses);
  lm_free(r->user);
  lm_free(r->blk);
  lm_free(r->pos);
  lm_free(r->lseen);
  lm_free(r->varuse);
  lm_free(r->sr);
  lm_free(r->bufrd);
  lm_free(r->bufwr);
  lm_free(r->symuse);
  lm_free(r->vary);
  lm_free(r->spec);
  lm_free(r->lfill);
  lm_free(r->lloop);
  lm_free(r->flagged);
  lm_free(r->tail);
}

/* Appends kernel k to out. LM_OK, LM_ERR_NOMEM or LM_ERR_INVALID (with lm_fail's message). */
static lm_status render_kernel(const lm_plan *p, const lm_kernel *k, lm_dialect dia, lm_sb *out) {
  if (!p || !p->g || !k || (unsigned)dia >= LM_DIALECT_COUNT)
    return lm_fail(LM_ERR_INVALID, "render: no plan, kernel or dialect");
  lm_exprs *x = &p->g->x;
  if (x->failed) return lm_fail(LM_ERR_NOMEM, "render: the graph's expressions lost an allocation");
  rk r = {.x = x, .p = p, .k = k, .d = &dialects[dia], .dia = dia, .flat = dia != LM_DIALECT_C, .split_l = -1};
  size_t ns = k->nstmts + 1, nl = k->nloops + 1;
  r.ext = lm_calloc(nl, sizeof *r.ext);
  r.live = lm_calloc(ns, 1);
  r.inl = lm_calloc(ns, 1);
  r.uses = lm_calloc(ns, sizeof *r.uses);
  r.user = lm_calloc(ns, sizeof *r.user);
  r.blk = lm_calloc(ns, sizeof *r.blk);
  r.pos = lm_calloc(ns, sizeof *r.pos);
  r.lseen = lm_calloc(nl, 1);
  r.varuse = lm_calloc(nl, 1);
  r.bufrd = lm_calloc(p->nbufs + 1, 1);
  r.bufwr = lm_calloc(p->nbufs + 1, 1);
  r.symuse = lm_calloc(x->nsyms + 1, 1);
  r.symname = lm_calloc(x->nsyms + 1, sizeof *r.symname);
  r.vary = lm_calloc(ns, 1);
  r.spec = lm_calloc(ns, 1);
  r.zero = lm_x_const(x, 0);
  lm_sb body = {0}, head = {0}, full = {0};
  lm_status st = LM_ERR_NOMEM;
  if (!r.ext || !r.live || !r.inl || !r.uses || !r.user || !r.blk || !r.pos || !r.lseen || !r.varuse ||
      !r.bufrd || !r.bufwr || !r.symuse || !r.symname || !r.vary || !r.spec || !r.zero || !name_symbols(&r))
    goto done;

  /* ---- analysis */
  for (size_t i = 0; i < k->nloops; i++) r.ext[i] = k->loops[i].extent;
  r.xc = (lm_xctx){.extent = r.ext, .nvars = (int)k->nloops};
  for (size_t i = 0; i < k->nstmts; i++) r.blk[i] = -2;
  if (k->npar < 0 || (size_t)k->npar > k->nloops) fail(&r, "npar %d with %zu loops", k->npar, k->nloops);
  if (k->group && (!r.flat || !r.d->shared_qual))
    fail(&r, "a work-group schedule needs a GPU dialect (this is %s)", r.d->name);
  else if (k->group && (k->npar < 1 || !lm_x_is_const(x, k->loops[k->npar - 1].extent, k->group)))
    fail(&r, "work-group schedule: the thread loop (loop %d) must have extent %d", k->npar - 1, k->group);
  for (size_t i = 0; i < k->nshared && !r.bad; i++)
    if (k->shared[i] && !k->group) fail(&r, "shared local array %zu outside a work-group schedule", i);
  for (size_t i = 0; i < k->nloops && !r.bad; i++) {
    const lm_loop *lp = &k->loops[i];
    if (lp->parent < -1 || lp->parent >= (int32_t)k->nloops) fail(&r, "loop %zu: bad parent %d", i, lp->parent);
    else if (!lp->extent || lp->extent >= x->n) fail(&r, "loop %zu: no extent", i);
    else if ((int)i < k->npar && lp->parent != (int32_t)i - 1)
      fail(&r, "parallel loop %zu is not nested in loop %zu", i, i - 1);
  }
  if (!r.bad) place(&r, -1, 0);
  for (int i = 0; i < k->npar && !r.bad; i++)
    if (!r.lseen[i]) fail(&r, "parallel loop %d is in no block", i);
  if (!r.bad) check_stmts(&r);
  for (size_t i = 0; i < k->nloops && !r.bad; i++) /* which statements hold eight lanes */
    if (k->loops[i].kind == LM_L_VECTOR && dia == LM_DIALECT_C &&
        !lm_vector_loop_check(x, k, (int32_t)i, r.vary, r.why, sizeof r.why))
      r.bad = 1;
  if (k->contract && dia == LM_DIALECT_C && has_lanes(k)) fail(&r, "FMAs in a kernel of SIMD lanes");
  if (!r.bad) liveness(&r);
  if (!r.bad) choose_inline(&r);
  if (!r.bad) choose_speculation(&r);
  if (!r.bad && k->finite && dia == LM_DIALECT_C && !fill_locals(&r)) goto done;
  if (!r.bad && k->finite && dia == LM_DIALECT_C) unguard_picks(&r);

  /* ---- body first: it tells which variables, symbols and buffers the head must bind */
  int base = r.flat || k->npar > 0 ? 1 : 2;
  if (!r.bad) find_tails(&r);
  if (!r.bad && r.ntail) { /* the blocks below E / L first, their tail guards as 1 (find_tails) */
    r.full = 1;
    emit_block(&r, &full, -1, base + 1);
    r.full = 0;
  }
  if (!r.bad) emit_block(&r, &body, -1, base + (r.ntail ? 1 : 0));
  if (r.flat && !r.bad) emit_unflatten(&r, &head);
  if (r.bad || x->failed || body.failed || head.failed || full.failed) {
    st = r.bad && !x->failed ? lm_fail(LM_ERR_INVALID, "render: kernel %.32s: %s", k->name, r.why) : LM_ERR_NOMEM;
    goto done;
  }

  char name[48];
  lm_render_entry_name(k, name, sizeof name);
  if (dia == LM_DIALECT_C && !has_lanes(k)) {
    emit_c_kernel(&r, out, name, &head, &full, &body);
    goto rendered;
  }
  emit_signature(&r, out, name);
  if (r.flat && k->group) { /* every thread of a group reaches its barriers: no early return */
    lm_sb_printf(out, "  const %s grp = (%s)%s;\n  (void)total;\n", r.d->i64, r.d->i64, r.d->group_id);
  } else if (r.flat) {
    lm_sb_printf(out, "  const %s gid = %s;\n  if (gid >= total) return;\n", r.d->i64, r.d->global_id);
  }
  int any_buf = 0, any_sym = 0;
  for (size_t j = 0; j < k->nbufs; j++) {
    uint32_t b = k->bufs[j];
    if (b >= p->nbufs || !(r.bufrd[b] || r.bufwr[b])) continue;
    any_buf = 1;
    if (dia == LM_DIALECT_C || dia == LM_DIALECT_CUDA)
      lm_sb_printf(out, "  %sfloat *%s b%u = B[%u];\n", r.bufwr[b] ? "" : "const ", r.d->restrict_kw, b, b);
  }
  for (size_t i = 0; i < x->nsyms; i++)
    if (r.symuse[i]) {
      any_sym = 1;
      lm_sb_printf(out, "  const %s %s = S[%zu];\n", r.d->i64, r.symname[i], i);
    }
  if (!any_buf && (dia == LM_DIALECT_C || dia == LM_DIALECT_CUDA)) lm_sb_puts(out, "  (void)B;\n");
  if (!any_sym) lm_sb_puts(out, "  (void)S;\n");
  if (!r.use_r) lm_sb_puts(out, "  (void)R;\n");
  for (size_t i = 0; i < k->nlocals; i++) {
    int shared = i < k->nshared && k->shared[i];
    lm_sb_printf(out, "  %s%sfloat l%zu[%lld];\n", shared ? r.d->shared_qual : "", shared ? " " : "", i,
                 (long long)k->locals[i]);
  }
  if (head.s) lm_sb_puts(out, head.s);
  if (!r.flat && k->npar == 0) lm_sb_puts(out, "  if (start == 0 && end > 0) {\n");
  emit_tail_split(&r, out, &full);
  if (body.s) lm_sb_puts(out, body.s);
  if (r.ntail) lm_sb_puts(out, "  }\n");
  if (!r.flat && k->npar == 0) lm_sb_puts(out, "  }\n");
  lm_sb_puts(out, "}\n");
rendered:
  st = r.bad ? lm_fail(LM_ERR_INVALID, "render: kernel %.32s: %s", k->name, r.why) : LM_OK;
  /* proving bounds interns expressions: a failed allocation there makes the text unreliable */
  if (body.failed || head.failed || out->failed || x->failed) st = lm_fail(LM_ERR_NOMEM, "render: out of memory");
done:
  if (st == LM_ERR_NOMEM) lm_fail(LM_ERR_NOMEM, "render: out of memory");
  lm_sb_free(&body);
  lm_sb_free(&full);
  lm_sb_free(&head);
  rk_free(&r);
  return st;
}

/* ---------------------------------------------------------------- entry points */

char *lm_render_prelude(lm_dialect d) {
  if ((unsigned)d >= LM_DIALECT_COUNT) {
    lm_fail(LM_ERR_INVALID, "render: bad dialect %d", (int)d);
    return NULL;
  }
  lm_sb sb = {0};
  emit_prelude(&sb, &dialects[d]);
  return lm_sb_take(&sb);
}

char *lm_render_kernel(const lm_plan *p, const lm_kernel *k, lm_dialect d) {
  lm_sb sb = {0};
  if (render_kernel(p, k, d, &sb) != LM_OK) {
    lm_sb_free(&sb);
    return NULL;
  }
  return lm_sb_take(&sb);
}

char *lm_render_plan(const lm_plan *p, lm_dialect d) {
  if ((unsigned)d >= LM_DIALECT_COUNT || !p) {
    lm_fail(LM_ERR_INVALID, "render: no plan or bad dialect");
    return NULL;
  }
  lm_sb sb = {0};
  emit_prelude(&sb, &dialects[d]);
  for (size_t i = 0; i < p->nkernels; i++) {
    lm_sb_puts(&sb, "\n");
    if (render_kernel(p, &p->kernels[i], d, &sb) != LM_OK) {
      lm_sb_free(&sb);
      return NULL;
    }
  }
  return lm_sb_take(&sb);
}
