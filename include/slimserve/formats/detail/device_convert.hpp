#pragma once
/// \file
/// \brief Hardware conversion instructions used by device code (nvcc, __CUDA_ARCH__ only).
///
/// Each wrapper produces exactly the bits of the portable path in float_codec.hpp, which is
/// what the host, the CPU emulator and GPUs without the instruction use; the kernel test
/// formats_device_test checks the two paths against each other on every code. The
/// first-operand-is-the-high-half order of the packed cvt forms is the PTX ISA's.

#include <cstdint>

#include "slimserve/config.hpp"

#if defined(__CUDA_ARCH__)

// Hardware BF16 and packed FP16 converts exist from sm_80, FP8 converts from sm_89.
#if __CUDA_ARCH__ >= 800
#define SLIMSERVE_HAS_HW_BF16_CVT 1
#endif
#if __CUDA_ARCH__ >= 890
#define SLIMSERVE_HAS_HW_FP8_CVT 1
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace detail::hw {

__device__ SLIMSERVE_FORCEINLINE std::uint16_t float_to_fp16(float x) {
  std::uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}
__device__ SLIMSERVE_FORCEINLINE float fp16_to_float(std::uint16_t h) {
  float x;
  asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
  return x;
}

#if defined(SLIMSERVE_HAS_HW_BF16_CVT)
__device__ SLIMSERVE_FORCEINLINE std::uint16_t float_to_bf16(float x) {
  std::uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}
/// {lo, hi} -> bf16x2 with `lo` in bits 0..15.
__device__ SLIMSERVE_FORCEINLINE std::uint32_t float2_to_bf16x2(float lo, float hi) {
  std::uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}
/// {lo, hi} -> f16x2 with `lo` in bits 0..15.
__device__ SLIMSERVE_FORCEINLINE std::uint32_t float2_to_fp16x2(float lo, float hi) {
  std::uint32_t packed;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
}
#endif

#if defined(SLIMSERVE_HAS_HW_FP8_CVT)
/// {lo, hi} -> two FP8 codes, `lo` in bits 0..7 (satfinite: saturates, NaN -> 0x7F).
template <bool E4M3>
__device__ SLIMSERVE_FORCEINLINE std::uint16_t float2_to_fp8x2(float lo, float hi) {
  std::uint16_t packed;
  if constexpr (E4M3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(hi), "f"(lo));
  }
  return packed;
}
/// Two FP8 codes (lo in bits 0..7) -> f16x2 (exact: every FP8 value is an FP16 value).
template <bool E4M3>
__device__ SLIMSERVE_FORCEINLINE std::uint32_t fp8x2_to_fp16x2(std::uint16_t packed) {
  std::uint32_t halves;
  if constexpr (E4M3) {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(packed));
  } else {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(halves) : "h"(packed));
  }
  return halves;
}
#endif

}  // namespace detail::hw
SLIMSERVE_NAMESPACE_END

#endif  // __CUDA_ARCH__
