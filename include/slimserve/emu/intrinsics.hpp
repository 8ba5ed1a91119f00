#pragma once
/// \file
/// \brief CUDA device intrinsics with plain C++ meanings: bit tricks, cache-hinted loads and
/// stores, fast math (computed exactly: the emulator does not model approximations), min/max.

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "slimserve/config.hpp"
#include "slimserve/emu/scheduler.hpp"

// --- bits ---------------------------------------------------------------------------------
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) {
  return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1;
}
inline int __ffsll(long long x) {
  return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1;
}
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned long long __brevll(unsigned long long x) {
  return static_cast<unsigned long long>(__brev(static_cast<unsigned>(x))) << 32 |
         __brev(static_cast<unsigned>(x >> 32));
}
/// Byte i of the result is byte (s >> 4i) & 7 of the 8-byte value {y, x} (x is bytes 0-3).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long bytes = static_cast<unsigned long long>(y) << 32 | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned selector = (s >> (4 * i)) & 7u;
    r |= static_cast<unsigned>((bytes >> (8 * selector)) & 0xFFu) << (8 * i);
  }
  return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long both = static_cast<unsigned long long>(hi) << 32 | lo;
  return static_cast<unsigned>((both << (shift & 31u)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long both = static_cast<unsigned long long>(hi) << 32 | lo;
  return static_cast<unsigned>(both >> (shift & 31u));
}
inline unsigned __funnelshift_lc(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long both = static_cast<unsigned long long>(hi) << 32 | lo;
  return static_cast<unsigned>((both << (shift > 32u ? 32u : shift)) >> 32);
}
inline unsigned __funnelshift_rc(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long both = static_cast<unsigned long long>(hi) << 32 | lo;
  return static_cast<unsigned>(both >> (shift > 32u ? 32u : shift));
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __mulhi(int a, int b) {
  return static_cast<int>((static_cast<long long>(a) * b) >> 32);
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  __extension__ using u128 = unsigned __int128;
  return static_cast<unsigned long long>((static_cast<u128>(a) * b) >> 64);
}

// --- reinterpretation and conversion -----------------------------------------------------
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(std::trunc(x)); }
inline int __float2int_rd(float x) { return static_cast<int>(std::floor(x)); }
inline int __float2int_ru(float x) { return static_cast<int>(std::ceil(x)); }
inline unsigned __float2uint_rn(float x) { return static_cast<unsigned>(std::nearbyint(x)); }
inline unsigned __float2uint_rz(float x) { return static_cast<unsigned>(std::trunc(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline float __uint2float_rn(unsigned x) { return static_cast<float>(x); }

// --- math (exact: the emulator does not imitate the fast approximations) -----------------
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }

// CUDA's integer min/max overloads (host code gets them from cuda_runtime.h too).
#define SLIMSERVE_EMU_MINMAX(T)                              \
  inline T min(T a, T b) { return b < a ? b : a; }            \
  inline T max(T a, T b) { return a < b ? b : a; }
SLIMSERVE_EMU_MINMAX(int)
SLIMSERVE_EMU_MINMAX(unsigned)
SLIMSERVE_EMU_MINMAX(long)
SLIMSERVE_EMU_MINMAX(unsigned long)
SLIMSERVE_EMU_MINMAX(long long)
SLIMSERVE_EMU_MINMAX(unsigned long long)
#undef SLIMSERVE_EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// --- cache-hinted loads and stores: plain accesses ---------------------------------------
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldlu(const T* p) { return *p; }
template <class T> inline T __ldcv(const T* p) { return *p; }
template <class T> inline void __stwb(T* p, T v) { *p = v; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stwt(T* p, T v) { *p = v; }

// --- misc ---------------------------------------------------------------------------------
inline long long clock64() {
  return std::chrono::steady_clock::now().time_since_epoch().count();
}
/// Lets the other emulated threads run (spin loops must back off with it to make progress).
inline void __nanosleep(unsigned, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  auto& self = ::slimserve::emu::detail::this_thread("__nanosleep");
  self.post_site({"__nanosleep", file, line});
  ::slimserve::emu::detail::yield_to_scheduler(self, ::slimserve::emu::detail::ThreadState::yielded);
}
[[noreturn]] inline void __trap() { ::slimserve::emu::detail::fail_this_thread("__trap() called"); }
