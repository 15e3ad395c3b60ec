/* compiler/msl_shim.h — the text of lumen's Metal Shading Language shim: a small C++17 header
 * that makes MSL, as the renderer writes it, compile with the system C++ compiler (g++ or
 * clang++), so generated Metal code is checked, and run on the CPU, without a Mac.
 * msl_check.c writes it out as a file named `metal_stdlib` and compiles with -I on its folder,
 * so `#include <metal_stdlib>` in the rendered source finds it unchanged.
 *
 * What it maps (and what it deliberately does not):
 * - function and address-space qualifiers: `kernel`, `device`, `thread` vanish; `constant`
 *   becomes `const` (so a write through a constant pointer is a compile error, as in MSL);
 *   `threadgroup` becomes `static` (shared by the work-items of the one threadgroup running);
 * - attributes: [[buffer(n)]], [[thread_position_in_grid]] and the other index attributes
 *   expand to the empty C++ attribute [[]] (msl_check.c checks the buffer numbering itself);
 * - types: uchar, ushort, uint, ulong (64-bit, as in MSL), size_t, and 2/3/4-vectors of
 *   uint, int and float with .x .y .z .w (no arithmetic);
 * - math: metal::precise:: and metal::fast:: float functions map to the C library's float
 *   functions through compiler builtins (no libm header is included, so unqualified names do not
 *   collide); plain metal:: math is the precise version, as with fast math off;
 * - threadgroup_barrier(mem_flags::...) calls a hook the executor installs;
 * - what MSL lacks fails to compile: `double`, `goto`, new/delete, virtual functions,
 *   exceptions and RTTI (-fno-exceptions -fno-rtti plus #pragma GCC poison at the end).
 * lm_launch() at the end calls a kernel once per thread index with its arguments taken in order
 * from an array of pointers: buffer slot j feeds parameter j, a `uint` index parameter reads the
 * value its pointer gives, or gets the thread position when that pointer is NULL. */
#ifndef LUMEN_MSL_SHIM_H
#define LUMEN_MSL_SHIM_H

static const char lm_msl_shim_text[] =
    "/* metal_stdlib: lumen's MSL shim (compiler/msl_shim.h) for checking MSL with a C++ compiler */\n"
    "#ifndef LUMEN_MSL_SHIM\n"
    "#define LUMEN_MSL_SHIM\n"
    "static_assert(sizeof(long) == 8 && sizeof(int) == 4 && sizeof(float) == 4 && sizeof(void *) == 8,\n"
    "              \"MSL's integer, float and pointer sizes\");\n"
    "\n"
    "/* qualifiers */\n"
    "#define kernel\n"
    "#define device\n"
    "#define thread\n"
    "#define constant const\n"
    "#define threadgroup static\n"
    "\n"
    "/* attributes: [[buffer(0)]] becomes [[]] */\n"
    "#define buffer(n)\n"
    "#define thread_position_in_grid\n"
    "#define thread_position_in_threadgroup\n"
    "#define threadgroup_position_in_grid\n"
    "#define threads_per_threadgroup\n"
    "#define threads_per_grid\n"
    "#define thread_index_in_threadgroup\n"
    "#define thread_execution_width\n"
    "\n"
    "/* types */\n"
    "typedef unsigned char uchar;\n"
    "typedef unsigned short ushort;\n"
    "typedef unsigned int uint;\n"
    "typedef unsigned long ulong;\n"
    "typedef decltype(sizeof(0)) size_t;\n"
    "template <typename T> struct lm_vec2 { T x, y; };\n"
    "template <typename T> struct lm_vec3 { T x, y, z; };\n"
    "template <typename T> struct lm_vec4 { T x, y, z, w; };\n"
    "typedef lm_vec2<uint> uint2;\n"
    "typedef lm_vec3<uint> uint3;\n"
    "typedef lm_vec4<uint> uint4;\n"
    "typedef lm_vec2<int> int2;\n"
    "typedef lm_vec3<int> int3;\n"
    "typedef lm_vec4<int> int4;\n"
    "typedef lm_vec2<float> float2;\n"
    "typedef lm_vec3<float> float3;\n"
    "typedef lm_vec4<float> float4;\n"
    "\n"
    "/* constants of metal_math */\n"
    "#define INFINITY __builtin_inff()\n"
    "#define NAN __builtin_nanf(\"\")\n"
    "#define HUGE_VALF __builtin_huge_valf()\n"
    "#define MAXFLOAT 0x1.fffffep+127f\n"
    "\n"
    "namespace metal {\n"
    "enum class mem_flags : uint { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };\n"
    "inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(uint(a) | uint(b)); }\n"
    "#define LM_MSL_MATH(ns)                                                                \\\n"
    "  namespace ns {                                                                       \\\n"
    "  inline float sin(float x) { return __builtin_sinf(x); }                              \\\n"
    "  inline float cos(float x) { return __builtin_cosf(x); }                              \\\n"
    "  inline float tan(float x) { return __builtin_tanf(x); }                              \\\n"
    "  inline float tanh(float x) { return __builtin_tanhf(x); }                            \\\n"
    "  inline float exp(float x) { return __builtin_expf(x); }                              \\\n"
    "  inline float exp2(float x) { return __builtin_exp2f(x); }                            \\\n"
    "  inline float log(float x) { return __builtin_logf(x); }                              \\\n"
    "  inline float log2(float x) { return __builtin_log2f(x); }                            \\\n"
    "  inline float pow(float x, float y) { return __builtin_powf(x, y); }                  \\\n"
    "  inline float sqrt(float x) { return __builtin_sqrtf(x); }                            \\\n"
    "  inline float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }                    \\\n"
    "  inline float fabs(float x) { return __builtin_fabsf(x); }                            \\\n"
    "  inline float floor(float x) { return __builtin_floorf(x); }                          \\\n"
    "  inline float ceil(float x) { return __builtin_ceilf(x); }                            \\\n"
    "  inline float fmod(float x, float y) { return __builtin_fmodf(x, y); }                \\\n"
    "  inline float fmax(float x, float y) { return __builtin_fmaxf(x, y); }                \\\n"
    "  inline float fmin(float x, float y) { return __builtin_fminf(x, y); }                \\\n"
    "  inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }      \\\n"
    "  }\n"
    "LM_MSL_MATH(precise)\n"
    "LM_MSL_MATH(fast)\n"
    "LM_MSL_MATH(lm_plain)\n"
    "#undef LM_MSL_MATH\n"
    "using namespace lm_plain; /* metal::sin is precise::sin with fast math off */\n"
    "}\n"
    "\n"
    "/* threadgroup_barrier: the executor's hook (NULL: the kernel is only compiled) */\n"
    "extern \"C\" void (*lm_msl_barrier_hook)(void);\n"
    "inline void threadgroup_barrier(metal::mem_flags) {\n"
    "  if (lm_msl_barrier_hook) lm_msl_barrier_hook();\n"
    "  else __builtin_trap();\n"
    "}\n"
    "\n"
    "/* lm_launch(f, args, start, end): f once per thread position in [start, end); parameter i\n"
    " * takes args[i] (pointer and reference parameters); a `uint` parameter *(uint *)args[i], or\n"
    " * the position when args[i] is NULL */\n"
    "template <unsigned long... I> struct lm_seq {};\n"
    "template <unsigned long N, unsigned long... I> struct lm_make_seq : lm_make_seq<N - 1, N - 1, I...> {};\n"
    "template <unsigned long... I> struct lm_make_seq<0, I...> { typedef lm_seq<I...> type; };\n"
    "template <typename T> struct lm_arg { static T get(void *p, uint tid) { return p ? *(const uint *)p : tid; } };\n"
    "template <typename T> struct lm_arg<T *> { static T *get(void *p, uint) { return (T *)p; } };\n"
    "template <typename T> struct lm_arg<T &> { static T &get(void *p, uint) { return *(T *)p; } };\n"
    "template <typename... P, unsigned long... I>\n"
    "inline void lm_call(void (*f)(P...), void *const *a, uint tid, lm_seq<I...>) {\n"
    "  f(lm_arg<P>::get(a[I], tid)...);\n"
    "}\n"
    "template <typename... P> inline void lm_launch(void (*f)(P...), void *const *a, long start, long end) {\n"
    "  for (long t = start; t < end; t++) lm_call(f, a, (uint)t, typename lm_make_seq<sizeof...(P)>::type());\n"
    "}\n"
    "\n"
    "/* what MSL does not have */\n"
    "#pragma GCC poison double goto new delete virtual typeid dynamic_cast thread_local\n"
    "#endif\n";

#endif
