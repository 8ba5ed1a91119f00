#pragma once
/// \file
/// \brief NaN-propagating FP32 minimum and maximum (PTX min.NaN.f32 / max.NaN.f32, sm_80 and
/// later; one FMNMX.NAN each): IEEE 754-2019 minimum / maximum, the canonical NaN (0x7FFFFFFF)
/// if either operand is NaN, and -0.0 below +0.0. CUDA's fminf / fmaxf (min.f32 / max.f32)
/// return the other operand for a NaN one, so a clamp built from them turns a NaN input into
/// the clamp's bound: a finite, wrong answer where IEEE arithmetic would give NaN.

#include <bit>
#include <cmath>
#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

#if defined(__CUDACC__)

__device__ __forceinline__ float max_nan(float a, float b) {
  float d = 0.0f;
#if defined(__CUDA_ARCH__)
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(d) : "f"(a), "f"(b));
#endif
  return d;
}

__device__ __forceinline__ float min_nan(float a, float b) {
  float d = 0.0f;
#if defined(__CUDA_ARCH__)
  asm("min.NaN.f32 %0, %1, %2;\n" : "=f"(d) : "f"(a), "f"(b));
#endif
  return d;
}

#else  // CPU emulator

namespace detail {
inline float canonical_nan() { return std::bit_cast<float>(std::uint32_t{0x7FFFFFFFu}); }
}  // namespace detail

inline float max_nan(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return detail::canonical_nan();
  if (a == b) return std::signbit(a) ? b : a;  // equal values: only +-0 differ; +0 is the larger
  return a > b ? a : b;
}

inline float min_nan(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return detail::canonical_nan();
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

#endif

/// x clamped to [-limit, limit] (limit > 0), NaN kept NaN: what a conversion into a narrower
/// format (a bf16 query or K/V input into an fp16 MMA operand) needs so that out-of-range
/// values saturate while a NaN input still reaches the output as NaN. The same two
/// instructions as fminf(fmaxf(x, -limit), limit).
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE float clamp_keep_nan(float x, float limit) {
  return min_nan(max_nan(x, -limit), limit);
}

}  // namespace arch
SLIMSERVE_NAMESPACE_END
