#pragma once
/// \file
/// \brief How the MLA kernels take a power of two out of an FP8 token's group scales (plain
/// C++, so host-side references can model the same rounding).
///
/// wgmma kernel: scale_g = 2^e x m_g, e the exponent of the token's largest scale clamped to
/// [mla_min_token_exponent, mla_max_token_exponent]; the tile holds fp16(code x fp16(m_g)),
/// and 2^e is applied in FP32 to S and P. The range keeps the P copy, P x 2^e x 2^8, in
/// fp16's normal range (2^-14 .. 2^15 for P = 1).
/// mma.sync kernel: the tile holds code x 2^k (exact), k = E - 6 for E the exponent of the
/// token's largest scale clamped to [-9, 13], and S and P use scale_g x 2^-k.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/formats/detail/float_codec.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

inline constexpr int mla_min_token_exponent = -22;
inline constexpr int mla_max_token_exponent = 7;

/// 2^(E + Offset) and its inverse, E the exponent of `largest` (from the float's exponent
/// field: a subnormal or zero `largest` counts as below the range) clamped to
/// [MinExponent, MaxExponent]. Integer operations on the exponent field only: both are exact.
template <int MinExponent, int MaxExponent, int Offset = 0>
struct ClampedPowerOfTwo {
  static_assert(MinExponent <= MaxExponent && MinExponent + Offset >= -126 && MaxExponent + Offset <= 127 &&
                MinExponent - Offset >= -126 && MaxExponent - Offset <= 127);
  float power;
  float inverse;
  SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE explicit ClampedPowerOfTwo(float largest) {
    constexpr std::uint32_t min_bits = static_cast<std::uint32_t>(127 + MinExponent) << 23;
    constexpr std::uint32_t max_bits = static_cast<std::uint32_t>(127 + MaxExponent) << 23;
    std::uint32_t bits = slimserve::detail::float_bits(largest) & 0x7F800000u;
    bits = bits < min_bits ? min_bits : bits;
    bits = bits > max_bits ? max_bits : bits;
    // 2^(E + Offset): the exponent field plus Offset; 2^-(E + Offset): 2 x 127 - that field.
    // (Unsigned arithmetic: a negative Offset wraps to the same field.)
    power = slimserve::detail::float_from_bits(bits + (static_cast<std::uint32_t>(Offset) << 23));
    inverse = slimserve::detail::float_from_bits((static_cast<std::uint32_t>(2 * 127 - Offset) << 23) - bits);
  }
};

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
