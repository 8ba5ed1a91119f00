#pragma once
/// \file
/// \brief Two FP32 values to a packed fp16x2 or bf16x2, rounded to nearest even and saturated
/// to the finite range with NaN kept NaN: PTX cvt.rn.satfinite.{f16x2,bf16x2}.f32 (PTX 8.1,
/// sm_80 and later; one F2FP.SATFINITE on sm_90a). The ISA: a NaN input gives NaN, a value
/// beyond the format's largest finite magnitude (infinities included) gives that magnitude
/// with its sign. This is what a wider value needs on its way into a narrower MMA operand (a
/// BF16 query or K/V input into fp16): an out-of-range element saturates, a NaN one reaches
/// the output as NaN. The ISA saturates on the input's magnitude, so the emulation clamps
/// and then converts. That equals rounding and then turning an overflow into the largest
/// finite value: inputs just above it round down to it, and those from the next rounding
/// boundary on round to infinity, which saturation maps back.
///
/// Packing follows the registers: `lo` in bits 0..15, `hi` in bits 16..31 (PTX takes the
/// high half's source first).

#include <cstdint>
#include <type_traits>

#include "slimserve/config.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/runtime/platform.hpp"

#if !defined(__CUDACC__)
#include <cmath>
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

#if defined(__CUDACC__)

template <class T>
__device__ __forceinline__ std::uint32_t pack_satfinite(float lo, float hi) {
  static_assert(std::is_same_v<T, fp16> || std::is_same_v<T, bf16>, "fp16x2 or bf16x2");
  std::uint32_t d = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, fp16>) {
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  }
#elif defined(__CUDA_ARCH__)
  (void)lo;
  (void)hi;
  __trap();  // needs sm_80 or newer
#endif
  return d;
}

#else  // CPU emulator

namespace detail {
/// One element: the format's canonical NaN (0x7FFF) for NaN, else clamped and rounded.
template <class T>
inline std::uint16_t satfinite_bits(float x) {
  if (std::isnan(x)) return 0x7FFF;
  constexpr float limit = format_traits<T>::max_finite;
  return from_float<T>(x > limit ? limit : (x < -limit ? -limit : x)).bits;
}
}  // namespace detail

template <class T>
inline std::uint32_t pack_satfinite(float lo, float hi) {
  static_assert(std::is_same_v<T, fp16> || std::is_same_v<T, bf16>, "fp16x2 or bf16x2");
  return static_cast<std::uint32_t>(detail::satfinite_bits<T>(lo)) |
         static_cast<std::uint32_t>(detail::satfinite_bits<T>(hi)) << 16;
}

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
