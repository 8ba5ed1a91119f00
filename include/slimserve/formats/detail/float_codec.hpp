#pragma once
/// \file
/// \brief The portable (integer-only) encoder and decoder behind every small float format.
///
/// One routine per direction, parameterized by the format's layout, so BF16, FP16 and both
/// FP8 formats share a single, exhaustively tested rounding path. Integer arithmetic only:
/// the result does not depend on the FPU rounding mode, flush-to-zero or -ffast-math, and it
/// is constexpr. Device code may replace it with hardware conversions that produce the same
/// bits (see device_convert.hpp).

#include <cstdint>

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace detail {

SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr std::uint32_t float_bits(float x) {
  return __builtin_bit_cast(std::uint32_t, x);
}
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr float float_from_bits(std::uint32_t bits) {
  return __builtin_bit_cast(float, bits);
}

/// The quiet NaN every conversion produces (NVIDIA's canonical NaN: sign clear, all mantissa
/// bits set). GPUs never propagate NaN payloads, so neither do the portable paths.
inline constexpr std::uint32_t canonical_float_nan = 0x7FFFFFFFu;

/// How a format spends its all-ones exponent.
enum class SpecialValues {
  ieee,         ///< infinities and NaNs, like IEEE 754 (FP16, BF16, FP8 e5m2)
  finite_only,  ///< no infinity; only S.1111.111 is NaN (OCP FP8 e4m3fn)
  none,         ///< every code is a finite number (OCP FP4 e2m1fn)
};

/// Layout of a sign / exponent / mantissa format of at most 16 bits.
template <int ExponentBits, int MantissaBits, SpecialValues Specials>
struct FloatLayout {
  static constexpr int exponent_bits = ExponentBits;
  static constexpr int mantissa_bits = MantissaBits;
  static constexpr int total_bits = 1 + ExponentBits + MantissaBits;
  static constexpr SpecialValues specials = Specials;
  static constexpr int bias = (1 << (ExponentBits - 1)) - 1;
  static constexpr std::uint32_t sign_mask = 1u << (ExponentBits + MantissaBits);
  static constexpr std::uint32_t magnitude_mask = sign_mask - 1u;
  static constexpr std::uint32_t exponent_all_ones = (1u << ExponentBits) - 1u;
  static constexpr std::uint32_t mantissa_mask = (1u << MantissaBits) - 1u;
  /// Magnitude code of the largest finite value.
  static constexpr std::uint32_t max_finite_code =
      Specials == SpecialValues::ieee          ? ((exponent_all_ones - 1u) << MantissaBits) | mantissa_mask
      : Specials == SpecialValues::finite_only ? (exponent_all_ones << MantissaBits) | (mantissa_mask - 1u)
                                               : magnitude_mask;
  static constexpr std::uint32_t infinity_code = exponent_all_ones << MantissaBits;  // ieee only
  /// The NaN an encoder writes: what NVIDIA's cvt instructions write (sign clear). A format
  /// without NaN (e2m1) writes +0 instead: a NaN carries no magnitude to keep.
  static constexpr std::uint32_t canonical_nan_code =
      Specials == SpecialValues::none ? 0u : magnitude_mask;
};

/// What an encoder does with values beyond the largest finite one.
enum class Overflow {
  to_infinity,  ///< IEEE: round to +-inf (BF16, FP16)
  saturate,     ///< clamp to +-max_finite, infinities included (FP8, like cvt .satfinite)
};

/// Round-to-nearest-even of a float32 into the format. NaN becomes the canonical NaN.
template <class Layout, Overflow OverflowPolicy>
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr std::uint32_t encode_rne(float value) {
  const std::uint32_t x = float_bits(value);
  const std::uint32_t sign = (x >> 31) << (Layout::total_bits - 1);
  const std::uint32_t magnitude = x & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return Layout::canonical_nan_code;

  // Split |x| into a significand `m` (implicit bit included) and a biased float exponent
  // `e`; float subnormals use exponent 1 without the implicit bit.
  const std::uint32_t e_field = magnitude >> 23;
  const std::uint32_t e = e_field == 0 ? 1u : e_field;
  const std::uint32_t m = e_field == 0 ? (magnitude & 0x7FFFFFu) : ((magnitude & 0x7FFFFFu) | 0x800000u);

  // Target normal numbers start at float exponent `min_normal_e`; below it, the target
  // spacing is fixed (subnormals) and more bits are shifted out.
  constexpr int min_normal_e = 127 + 1 - Layout::bias;
  constexpr int normal_shift = 23 - Layout::mantissa_bits;
  const int shift = static_cast<int>(e) >= min_normal_e
                        ? normal_shift
                        : normal_shift + (min_normal_e - static_cast<int>(e));
  std::uint32_t code;
  if (shift > 24) {
    code = 0;  // below half the smallest subnormal: rounds to zero (m < 2^24 <= half)
  } else {
    const std::uint32_t kept = m >> shift;
    const std::uint32_t rest = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    // Biased exponent in the target, above its subnormal range. Adding the significand's
    // implicit bit carries it into the exponent field, and a rounding carry out of the
    // mantissa moves to the next binade: the code stays monotonic in |x|.
    const std::uint32_t exponent_base =
        static_cast<int>(e) >= min_normal_e
            ? (static_cast<std::uint32_t>(static_cast<int>(e) - min_normal_e) << Layout::mantissa_bits)
            : 0u;
    code = exponent_base + kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
  }

  if (code > Layout::max_finite_code) {
    code = OverflowPolicy == Overflow::saturate ? Layout::max_finite_code : Layout::infinity_code;
  }
  return sign | code;
}

/// Exact decode of a code into float32 (every code of these formats is a float32 value).
/// NaN codes decode to the canonical float NaN, as the GPU's cvt.f32.f16 does, except that a
/// format with float32's exponent range (BF16) decodes by a shift, NaN payload included.
template <class Layout>
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr float decode(std::uint32_t code) {
  if constexpr (Layout::exponent_bits == 8) {
    return float_from_bits(code << (32 - Layout::total_bits));
  }
  const std::uint32_t sign = ((code & Layout::sign_mask) != 0u) ? 0x80000000u : 0u;
  const std::uint32_t exponent = (code >> Layout::mantissa_bits) & Layout::exponent_all_ones;
  const std::uint32_t mantissa = code & Layout::mantissa_mask;
  if (exponent == Layout::exponent_all_ones) {
    if constexpr (Layout::specials == SpecialValues::ieee) {
      return float_from_bits(mantissa == 0u ? (sign | 0x7F800000u) : canonical_float_nan);
    } else if constexpr (Layout::specials == SpecialValues::finite_only) {
      if (mantissa == Layout::mantissa_mask) return float_from_bits(canonical_float_nan);
    }
  }
  if (exponent == 0u) {
    if (mantissa == 0u) return float_from_bits(sign);
    // Subnormal: mantissa * 2^(1 - bias - mantissa_bits), exact in float32 (and a normal
    // float32 for every format here, so flush-to-zero cannot touch it).
    constexpr std::uint32_t unit_exponent = 127u + 1u - Layout::bias - Layout::mantissa_bits;
    const float magnitude = static_cast<float>(mantissa) * float_from_bits(unit_exponent << 23);
    return float_from_bits(sign | float_bits(magnitude));
  }
  const std::uint32_t float_exponent = exponent - static_cast<std::uint32_t>(Layout::bias) + 127u;
  return float_from_bits(sign | (float_exponent << 23) | (mantissa << (23 - Layout::mantissa_bits)));
}

}  // namespace detail
SLIMSERVE_NAMESPACE_END
