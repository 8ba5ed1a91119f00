#pragma once
/// \file
/// \brief Packed fp16 arithmetic (PTX mul.rn.f16x2): both halves of two f16x2 registers
/// multiplied, each product rounded once to nearest even (fp16 subnormals kept, overflow to
/// infinity). Element 0 is the low half of the register, as in fp8_convert.cuh.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

#if !defined(__CUDACC__)
#include "slimserve/formats/float_formats.hpp"
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

#if defined(__CUDACC__)

__device__ __forceinline__ std::uint32_t mul_rn_f16x2(std::uint32_t a, std::uint32_t b) {
  std::uint32_t d = 0;
#if defined(__CUDA_ARCH__)
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
#endif
  return d;
}

#else  // CPU emulator

inline std::uint32_t mul_rn_f16x2(std::uint32_t a, std::uint32_t b) {
  // The product of two fp16 values (11-bit significands, exponents from -24) is exact in FP32,
  // so rounding it to fp16 is the instruction's one rounding.
  std::uint32_t d = 0;
  for (int half = 0; half < 2; ++half) {
    const float x = to_float(fp16::from_bits(static_cast<std::uint16_t>(a >> (16 * half))));
    const float y = to_float(fp16::from_bits(static_cast<std::uint16_t>(b >> (16 * half))));
    d |= std::uint32_t{from_float<fp16>(x * y).bits} << (16 * half);
  }
  return d;
}

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
