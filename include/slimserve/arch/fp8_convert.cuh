#pragma once
/// \file
/// \brief Packed FP8 conversions (PTX cvt, sm_89+): two e4m3/e5m2 values to two fp16, and
/// two fp32 values to two e4m3/e5m2 (round to nearest even, .satfinite).
///
/// Packing follows the registers: element 0 is the low byte of the 16-bit pair and the low
/// half of the 32-bit f16x2 value. e4m3 is OCP e4m3fn (max 448, no infinity); with
/// .satfinite, finite values and infinities beyond the range become the largest finite value
/// of that sign, and NaN stays NaN.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

#if !defined(__CUDACC__)
#include <bit>
#include <cmath>

#include "slimserve/emu/fp8_bits.hpp"
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

#if defined(__CUDACC__)

__device__ __forceinline__ std::uint32_t cvt_e4m3x2_to_f16x2(std::uint16_t pair) {
  std::uint32_t result = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(result) : "h"(pair));
#elif defined(__CUDA_ARCH__)
  (void)pair;
  __trap();  // needs sm_89 or newer
#endif
  return result;
}

__device__ __forceinline__ std::uint32_t cvt_e5m2x2_to_f16x2(std::uint16_t pair) {
  std::uint32_t result = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;\n" : "=r"(result) : "h"(pair));
#elif defined(__CUDA_ARCH__)
  (void)pair;
  __trap();
#endif
  return result;
}

__device__ __forceinline__ std::uint16_t cvt_f32x2_to_e4m3x2(float lo, float hi) {
  std::uint16_t result = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The first source goes to the upper byte.
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(result) : "f"(hi), "f"(lo));
#elif defined(__CUDA_ARCH__)
  (void)lo;
  (void)hi;
  __trap();
#endif
  return result;
}

__device__ __forceinline__ std::uint16_t cvt_f32x2_to_e5m2x2(float lo, float hi) {
  std::uint16_t result = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;\n" : "=h"(result) : "f"(hi), "f"(lo));
#elif defined(__CUDA_ARCH__)
  (void)lo;
  (void)hi;
  __trap();
#endif
  return result;
}

#else  // CPU emulator

namespace detail {
inline std::uint16_t exact_f16_bits(float value) {
  // Every fp8 value is exact in fp16; only NaN needs a fixed pattern.
  if (value != value) return 0x7FFF;
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const float magnitude = value < 0 ? -value : value;
  if (magnitude == 0.0f) return sign;
  if (magnitude == INFINITY) return static_cast<std::uint16_t>(sign | 0x7C00u);
  if (magnitude < 0x1p-14f) {  // fp16 subnormal
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(magnitude * 0x1p24f));
  }
  const std::uint32_t exponent = ((bits >> 23) & 0xFFu) - 127u + 15u;
  return static_cast<std::uint16_t>(sign | exponent << 10 | ((bits >> 13) & 0x3FFu));
}
inline std::uint32_t fp8x2_to_f16x2(std::uint16_t pair, const emu::detail::Fp8Layout& layout) {
  const std::uint32_t lo = exact_f16_bits(
      emu::detail::fp8_to_float(static_cast<std::uint8_t>(pair & 0xFFu), layout));
  const std::uint32_t hi = exact_f16_bits(
      emu::detail::fp8_to_float(static_cast<std::uint8_t>(pair >> 8), layout));
  return lo | hi << 16;
}
inline std::uint16_t f32x2_to_fp8x2(float lo, float hi, const emu::detail::Fp8Layout& layout) {
  return static_cast<std::uint16_t>(emu::detail::float_to_fp8_satfinite(lo, layout) |
                                    emu::detail::float_to_fp8_satfinite(hi, layout) << 8);
}
}  // namespace detail

inline std::uint32_t cvt_e4m3x2_to_f16x2(std::uint16_t pair) {
  return detail::fp8x2_to_f16x2(pair, emu::detail::e4m3_layout);
}
inline std::uint32_t cvt_e5m2x2_to_f16x2(std::uint16_t pair) {
  return detail::fp8x2_to_f16x2(pair, emu::detail::e5m2_layout);
}
inline std::uint16_t cvt_f32x2_to_e4m3x2(float lo, float hi) {
  return detail::f32x2_to_fp8x2(lo, hi, emu::detail::e4m3_layout);
}
inline std::uint16_t cvt_f32x2_to_e5m2x2(float lo, float hi) {
  return detail::f32x2_to_fp8x2(lo, hi, emu::detail::e5m2_layout);
}

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
