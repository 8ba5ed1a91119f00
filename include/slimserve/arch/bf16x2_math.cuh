#pragma once
/// \file
/// \brief Packed bf16 multiply (PTX mul.rn.bf16x2, sm_90+; fma.rn.bf16x2 with a -0 addend on
/// sm_80): both halves of two bf16x2 registers multiplied, each product rounded once to nearest
/// even. Subnormal inputs and results are kept (the PTX ISA gives mul.bf16x2 no .ftz form) and
/// overflow goes to infinity; NaN in, NaN out. Element 0 is the low half of the register, as in
/// f16x2_math.cuh.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

#if !defined(__CUDACC__)
#include <cmath>

#include "slimserve/formats/float_formats.hpp"
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

#if defined(__CUDACC__)

__device__ __forceinline__ std::uint32_t mul_rn_bf16x2(std::uint32_t a, std::uint32_t b) {
  std::uint32_t d = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
#elif defined(__CUDA_ARCH__)
  // -0 as the addend: x * y + (-0) is x * y for every x * y, signed zeros included.
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
#endif
  return d;
}

#else  // CPU emulator

inline std::uint32_t mul_rn_bf16x2(std::uint32_t a, std::uint32_t b) {
  // The product of two bf16 values (8-bit significands) is exact in double. It is rounded
  // once, to the bf16 spacing of its binade (2^-133 at the least, bf16's subnormal spacing):
  // nearbyint rounds ties to even in the default rounding mode. Rounding to float first could
  // round twice where the product is a float32 subnormal.
  std::uint32_t d = 0;
  for (int half = 0; half < 2; ++half) {
    const float x = to_float(bf16::from_bits(static_cast<std::uint16_t>(a >> (16 * half))));
    const float y = to_float(bf16::from_bits(static_cast<std::uint16_t>(b >> (16 * half))));
    const double p = static_cast<double>(x) * static_cast<double>(y);
    float rounded = static_cast<float>(p);  // inf, NaN and signed zeros as they are
    if (std::isfinite(p) && p != 0.0) {
      int exponent = 0;
      (void)std::frexp(p, &exponent);  // |p| in [2^(exponent-1), 2^exponent)
      const int quantum = exponent - 8 > -133 ? exponent - 8 : -133;
      const double r = std::ldexp(std::nearbyint(std::ldexp(p, -quantum)), quantum);
      // A bf16 value, or 2^128 and beyond, which is infinity in float and in bf16.
      rounded = r == 0.0 ? (std::signbit(p) ? -0.0f : 0.0f) : static_cast<float>(r);
    }
    d |= std::uint32_t{from_float<bf16>(rounded).bits} << (16 * half);
  }
  return d;
}

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
