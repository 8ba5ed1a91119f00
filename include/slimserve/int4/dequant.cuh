#pragma once
/// \file
/// \brief INT4 -> BF16/FP16 dequantization in registers with the magic-number trick.
///
/// A nibble q ORed into the low mantissa bits of a float whose unit in the last place is 1
/// (FP16 1024.0 = 0x6400, BF16 128.0 = 0x4300) gives the float `magic + q` with one `lop3`
/// and no integer-to-float conversion; `lop3` does it for two nibbles (one per 16-bit half) at
/// once. One FMA then subtracts `magic + z` (exact: small integers) and one FMA multiplies by
/// the scale with `-0.0` as addend, which is a single round-to-nearest-even of the exact
/// product: w = round_T((q - z) * s), bit for bit `int4::dequantize_reference`.
///
/// Which nibble feeds which mma register is the layout's business (gemm_layout.hpp): nibbles
/// i and i + 4 of a word are the (even row, odd row) halves of b register r_i.

#include <cstdint>
#include <type_traits>

#include "slimserve/arch/bit_ops.cuh"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {
namespace detail {

/// Both 16-bit halves set to `bits`.
SLIMSERVE_HOST_DEVICE constexpr std::uint32_t splat(std::uint16_t bits) {
  return static_cast<std::uint32_t>(bits) * 0x00010001u;
}

/// splat() of a value known only at run time (a zero point or scale read from shared
/// memory). On the GPU a `mov.b32 {h, h}`, which ptxas can fold into the consuming HFMA2's
/// .H0_H0 operand selector; the multiply by 0x10001 could not be folded (one IMAD per value).
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE std::uint32_t splat_value(std::uint16_t bits) {
#if defined(__CUDA_ARCH__)
  std::uint32_t both;
  asm("mov.b32 %0, {%1, %1};" : "=r"(both) : "h"(bits));
  return both;
#else
  return splat(bits);
#endif
}

/// Per-type constants (bit patterns of one 16-bit value).
template <class T>
struct DequantTraits;
template <>
struct DequantTraits<bf16> {
  static constexpr std::uint16_t magic = 0x4300;  // 128.0: 7 mantissa bits, ulp 1
  static constexpr std::uint16_t one = 0x3F80;
  static constexpr std::uint16_t minus_one = 0xBF80;
  static constexpr std::uint16_t minus_zero = 0x8000;
  static constexpr std::uint16_t eight = 0x4100;  // the symmetric zero point
  static constexpr std::uint16_t minus_magic = 0xC300;
  static constexpr std::uint16_t minus_magic_eight = 0xC308;  // -(128 + 8)
};
template <>
struct DequantTraits<fp16> {
  static constexpr std::uint16_t magic = 0x6400;  // 1024.0: 10 mantissa bits, ulp 1
  static constexpr std::uint16_t one = 0x3C00;
  static constexpr std::uint16_t minus_one = 0xBC00;
  static constexpr std::uint16_t minus_zero = 0x8000;
  static constexpr std::uint16_t eight = 0x4800;
  static constexpr std::uint16_t one_sixteenth = 0x2C00;  // undoes the 0x00f0 mask's << 4
  static constexpr std::uint16_t minus_magic = 0xE400;
  static constexpr std::uint16_t minus_magic_sixteenth = 0xD400;  // -64.0 = -1024 / 16
  static constexpr std::uint16_t minus_magic_eight = 0xE408;            // -(1024 + 8)
  static constexpr std::uint16_t minus_magic_sixteenth_eight = 0xD480;  // -(64 + 8)
};

/// d = a * b + c on both halves, rounded once to nearest even.
template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE std::uint32_t fma2(std::uint32_t a, std::uint32_t b,
                                                          std::uint32_t c) {
#if defined(__CUDA_ARCH__)
  std::uint32_t d;
  if constexpr (std::is_same_v<T, fp16>) {
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  } else {
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  }
  return d;
#else
  // Emulated with FP32: exact for every use here (products of an integer below 2^11 and an
  // 8- or 11-bit significand, sums of small integers), so one rounding, as on the GPU.
  auto half = [](std::uint32_t x, int which) {
    return to_float(T::from_bits(static_cast<std::uint16_t>(x >> (16 * which))));
  };
  std::uint32_t d = 0;
  for (int which = 0; which < 2; ++which) {
    const float value = half(a, which) * half(b, which) + half(c, which);
    d |= static_cast<std::uint32_t>(from_float<T>(value).bits) << (16 * which);
  }
  return d;
#endif
}

}  // namespace detail

/// What dequantizing one column needs, prepared once per (group, column).
struct DequantColumn {
  std::uint32_t scale;             ///< (s, s)
  std::uint32_t minus_base;        ///< -(magic + z), both halves
  std::uint32_t minus_base_div16;  ///< FP16 only: -(magic / 16 + z)
};

/// `scale_bits`, `zero_bits`: one value of T each (the zero point z as a T value).
/// `symmetric`: `zero_bits` is +0.0 (a zero-filled row) and the zero point is 8, folded into
/// the constant, so kernels read the zero row unconditionally with no select per column.
template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE DequantColumn make_dequant_column(std::uint16_t scale_bits,
                                                                         std::uint16_t zero_bits,
                                                                         bool symmetric = false) {
  using Traits = detail::DequantTraits<T>;
  const std::uint32_t zero = detail::splat_value(zero_bits);
  const std::uint32_t minus_one = detail::splat(Traits::minus_one);
  DequantColumn column{};
  column.scale = detail::splat_value(scale_bits);
  // -z - magic: exact (integers well inside the significand)
  column.minus_base = detail::fma2<T>(
      zero, minus_one, detail::splat(symmetric ? Traits::minus_magic_eight : Traits::minus_magic));
  if constexpr (std::is_same_v<T, fp16>) {
    column.minus_base_div16 = detail::fma2<T>(
        zero, minus_one,
        detail::splat(symmetric ? Traits::minus_magic_sixteenth_eight
                                : Traits::minus_magic_sixteenth));
  } else {
    column.minus_base_div16 = column.minus_base;
  }
  return column;
}

/// One packed word (a 16x16 tile's share of one lane) -> the lane's four mma B registers:
/// b[0], b[1] for the first n8 half (column `first`), b[2], b[3] for the second (`second`).
template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void dequantize_word(std::uint32_t word,
                                                            const DequantColumn& first,
                                                            const DequantColumn& second,
                                                            std::uint32_t (&b)[4]) {
  using Traits = detail::DequantTraits<T>;
  constexpr std::uint8_t and_or = 0xEA;  // (a & b) | c
  const std::uint32_t magic = detail::splat(Traits::magic);
  const std::uint32_t minus_zero = detail::splat(Traits::minus_zero);
  std::uint32_t shifted[4];
  if constexpr (std::is_same_v<T, fp16>) {
    // FP16 has room for a nibble at mantissa bits 4..7 (1024 + 16q): one shift for 8 codes.
    const std::uint32_t upper = word >> 8;
    const std::uint32_t one = detail::splat(Traits::one);
    const std::uint32_t sixteenth = detail::splat(Traits::one_sixteenth);
    shifted[0] = detail::fma2<T>(arch::lop3<and_or>(word, 0x000F000Fu, magic), one, first.minus_base);
    shifted[1] = detail::fma2<T>(arch::lop3<and_or>(word, 0x00F000F0u, magic), sixteenth,
                                 first.minus_base_div16);
    shifted[2] = detail::fma2<T>(arch::lop3<and_or>(upper, 0x000F000Fu, magic), one, second.minus_base);
    shifted[3] = detail::fma2<T>(arch::lop3<and_or>(upper, 0x00F000F0u, magic), sixteenth,
                                 second.minus_base_div16);
  } else {
    // BF16's 7 mantissa bits take one nibble only: shift by 4 before each extraction.
    const std::uint32_t one = detail::splat(Traits::one);
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int reg = 0; reg < 4; ++reg) {
      const DequantColumn& column = reg < 2 ? first : second;
      shifted[reg] = detail::fma2<T>(arch::lop3<and_or>(word >> (4 * reg), 0x000F000Fu, magic),
                                     one, column.minus_base);
    }
  }
  // q - z is exact; the scale multiply is the one rounding.
  b[0] = detail::fma2<T>(shifted[0], first.scale, minus_zero);
  b[1] = detail::fma2<T>(shifted[1], first.scale, minus_zero);
  b[2] = detail::fma2<T>(shifted[2], second.scale, minus_zero);
  b[3] = detail::fma2<T>(shifted[3], second.scale, minus_zero);
}

/// One packed word -> the lane's four mma B registers holding q - z (exact small integers in
/// T), for kernels that multiply the group's FP32 sums by the scale instead of every weight
/// (`GroupScaling::per_group_sum`). Same registers as `dequantize_word`, without its scale FMA.
template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void dequantize_word_unscaled(std::uint32_t word,
                                                                     const DequantColumn& first,
                                                                     const DequantColumn& second,
                                                                     std::uint32_t (&b)[4]) {
  using Traits = detail::DequantTraits<T>;
  constexpr std::uint8_t and_or = 0xEA;  // (a & b) | c
  const std::uint32_t magic = detail::splat(Traits::magic);
  const std::uint32_t one = detail::splat(Traits::one);
  if constexpr (std::is_same_v<T, fp16>) {
    const std::uint32_t upper = word >> 8;
    const std::uint32_t sixteenth = detail::splat(Traits::one_sixteenth);
    b[0] = detail::fma2<T>(arch::lop3<and_or>(word, 0x000F000Fu, magic), one, first.minus_base);
    b[1] = detail::fma2<T>(arch::lop3<and_or>(word, 0x00F000F0u, magic), sixteenth,
                           first.minus_base_div16);
    b[2] = detail::fma2<T>(arch::lop3<and_or>(upper, 0x000F000Fu, magic), one, second.minus_base);
    b[3] = detail::fma2<T>(arch::lop3<and_or>(upper, 0x00F000F0u, magic), sixteenth,
                           second.minus_base_div16);
  } else {
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (int reg = 0; reg < 4; ++reg) {
      const DequantColumn& column = reg < 2 ? first : second;
      b[reg] = detail::fma2<T>(arch::lop3<and_or>(word >> (4 * reg), 0x000F000Fu, magic), one,
                               column.minus_base);
    }
  }
}

/// Zero point z of symmetric weights, as T bits.
template <class T>
SLIMSERVE_HOST_DEVICE constexpr std::uint16_t symmetric_zero_bits() {
  return detail::DequantTraits<T>::eight;
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
