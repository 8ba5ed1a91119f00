#pragma once
/// \file
/// \brief prmt (byte permute) and lop3 (any three-input bitwise function).
///
/// prmt(a, b, selector): bytes 0-3 of a and 4-7 of b; result byte i is source byte
/// (selector >> 4i) & 7, or that byte's sign replicated when bit 3 of the nibble is set.
/// lop3<LUT>(a, b, c): bit-wise LUT[(a << 2) | (b << 1) | c]; build LUT from the constants
/// 0xF0 (a), 0xCC (b), 0xAA (c), e.g. (a & b) ^ c is lop3<(0xF0 & 0xCC) ^ 0xAA>.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

#if defined(__CUDACC__)

__device__ __forceinline__ std::uint32_t prmt(std::uint32_t a, std::uint32_t b,
                                              std::uint32_t selector) {
  std::uint32_t result;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(result) : "r"(a), "r"(b), "r"(selector));
  return result;
}

template <std::uint8_t LUT>
__device__ __forceinline__ std::uint32_t lop3(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
  std::uint32_t result;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n"
      : "=r"(result)
      : "r"(a), "r"(b), "r"(c), "n"(static_cast<int>(LUT)));
  return result;
}

#else  // CPU emulator: plain bit arithmetic

inline std::uint32_t prmt(std::uint32_t a, std::uint32_t b, std::uint32_t selector) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(b) << 32 | a;
  std::uint32_t result = 0;
  for (unsigned i = 0; i < 4; ++i) {
    const std::uint32_t nibble = (selector >> (4 * i)) & 0xFu;
    std::uint32_t byte = static_cast<std::uint32_t>(bytes >> (8 * (nibble & 7u))) & 0xFFu;
    if (nibble & 8u) byte = (byte & 0x80u) ? 0xFFu : 0x00u;  // sign replication
    result |= byte << (8 * i);
  }
  return result;
}

template <std::uint8_t LUT>
inline std::uint32_t lop3(std::uint32_t a, std::uint32_t b, std::uint32_t c) {
  std::uint32_t result = 0;
  for (unsigned minterm = 0; minterm < 8; ++minterm) {
    if (!((LUT >> minterm) & 1u)) continue;
    const std::uint32_t ta = (minterm & 4u) ? a : ~a;
    const std::uint32_t tb = (minterm & 2u) ? b : ~b;
    const std::uint32_t tc = (minterm & 1u) ? c : ~c;
    result |= ta & tb & tc;
  }
  return result;
}

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
