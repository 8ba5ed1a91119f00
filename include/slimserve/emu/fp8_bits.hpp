#pragma once
/// \file
/// \brief Emulated FP8 (OCP e4m3fn / e5m2) conversions with the PTX cvt semantics: decode to
/// fp16 exactly; encode from fp32 with round-to-nearest-even and .satfinite (finite values and
/// infinities beyond the range become the largest finite value; NaN becomes NaN).

#include <cmath>
#include <cstdint>

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

struct Fp8Layout {
  int exponent_bias;
  int mantissa_bits;
  std::uint8_t max_finite;  // magnitude code of the largest finite value
  std::uint8_t nan;         // the NaN code produced by conversions
};
inline constexpr Fp8Layout e4m3_layout{7, 3, 0x7E, 0x7F};
inline constexpr Fp8Layout e5m2_layout{15, 2, 0x7B, 0x7F};

inline bool fp8_is_nan(std::uint8_t code, const Fp8Layout& layout) noexcept {
  const unsigned magnitude = code & 0x7Fu;
  if (layout.mantissa_bits == 3) return magnitude == 0x7F;  // e4m3fn: only S.1111.111
  return (magnitude >> 2) == 0x1F && (magnitude & 3u) != 0;  // e5m2: IEEE-style
}

inline float fp8_to_float(std::uint8_t code, const Fp8Layout& layout) noexcept {
  if (fp8_is_nan(code, layout)) return std::nanf("");
  const unsigned magnitude = code & 0x7Fu;
  const int exponent = static_cast<int>(magnitude >> layout.mantissa_bits);
  const auto mantissa = static_cast<float>(magnitude & ((1u << layout.mantissa_bits) - 1u));
  const float scale = std::ldexp(1.0f, -layout.mantissa_bits);
  float value;
  if (layout.mantissa_bits == 2 && exponent == 0x1F) {
    value = INFINITY;  // e5m2 infinity
  } else if (exponent == 0) {
    value = std::ldexp(mantissa * scale, 1 - layout.exponent_bias);
  } else {
    value = std::ldexp(1.0f + mantissa * scale, exponent - layout.exponent_bias);
  }
  return (code & 0x80u) ? -value : value;
}

inline std::uint8_t float_to_fp8_satfinite(float value, const Fp8Layout& layout) noexcept {
  if (std::isnan(value)) return layout.nan;
  const std::uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  const float magnitude = std::fabs(value);
  const float max_finite = fp8_to_float(layout.max_finite, layout);
  if (magnitude >= max_finite) return static_cast<std::uint8_t>(sign | layout.max_finite);
  const int min_exponent = 1 - layout.exponent_bias;
  int exponent;
  (void)std::frexp(magnitude, &exponent);  // magnitude = f * 2^exponent, f in [0.5, 1)
  exponent -= 1;                           // magnitude = g * 2^exponent, g in [1, 2)
  if (magnitude == 0.0f || exponent < min_exponent) exponent = min_exponent;  // subnormal
  // Units of the last place at this exponent; nearbyint rounds half to even.
  const float units = std::nearbyint(std::ldexp(magnitude, layout.mantissa_bits - exponent));
  // The code is ((biased exponent - 1) << m) + units: for normals units includes the hidden
  // 1 (2^m), for subnormals (biased exponent 1) it is the fraction; units == 2^(m+1) after
  // rounding carries into the next exponent by itself.
  const int code = ((exponent + layout.exponent_bias - 1) << layout.mantissa_bits) +
                   static_cast<int>(units);
  const int clamped = code > layout.max_finite ? layout.max_finite : code;
  return static_cast<std::uint8_t>(sign | clamped);
}

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END
