#pragma once
/// \file
/// \brief Four packed FP8 codes (one 32-bit word, byte 0 first) to two f16x2 (codes 0, 1 and
/// codes 2, 3), exactly as two fp8_convert.cuh pair conversions. On the GPU the word's halves
/// reach the conversions as 16-bit registers, so ptxas reads the upper pair in place
/// (F2FP ... R.H1) instead of shifting it down first: one instruction per pair, not two.
/// Every FP8 widening path of the attention kernels goes through it (mma_fragments.cuh's
/// fp8_quad_to_f16x2, the MLA kernels, NVFP4's block scales).

#include <cstdint>

#include "slimserve/arch/fp8_convert.cuh"
#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

#if defined(__CUDACC__)

__device__ __forceinline__ void cvt_e4m3x4_to_f16x2x2(std::uint32_t four, std::uint32_t& lo, std::uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(four));
#else
  (void)four;
  lo = hi = 0;
#if defined(__CUDA_ARCH__)
  __trap();  // needs sm_89 or newer
#endif
#endif
}

__device__ __forceinline__ void cvt_e5m2x4_to_f16x2x2(std::uint32_t four, std::uint32_t& lo, std::uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e5m2x2 %0, l;\n cvt.rn.f16x2.e5m2x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(four));
#else
  (void)four;
  lo = hi = 0;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif
}

#else  // CPU emulator: the pair conversions

inline void cvt_e4m3x4_to_f16x2x2(std::uint32_t four, std::uint32_t& lo, std::uint32_t& hi) {
  lo = cvt_e4m3x2_to_f16x2(static_cast<std::uint16_t>(four & 0xFFFFu));
  hi = cvt_e4m3x2_to_f16x2(static_cast<std::uint16_t>(four >> 16));
}
inline void cvt_e5m2x4_to_f16x2x2(std::uint32_t four, std::uint32_t& lo, std::uint32_t& hi) {
  lo = cvt_e5m2x2_to_f16x2(static_cast<std::uint16_t>(four & 0xFFFFu));
  hi = cvt_e5m2x2_to_f16x2(static_cast<std::uint16_t>(four >> 16));
}

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
