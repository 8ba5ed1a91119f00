#pragma once
/// \file
/// \brief OCP FP4 e2m1fn, NVFP4's element format: storage type, traits and scalar conversions
/// to and from float32, usable on the host and on the device.
///
/// 1 sign, 2 exponent, 1 mantissa bit, bias 1; the 16 codes are +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
/// There is no infinity and no NaN. A code lives in the low nibble of `bits`; packed storage
/// (two codes per byte) is formats/nvfp4.hpp's.
///
///  * `to_float(x)` is exact.
///  * `from_float<fp4_e2m1>(x)` rounds to nearest, ties to even (0.25 -> 0, 0.75 -> 1,
///    5 -> 4), saturates beyond the range (|x| >= 7 and +-inf -> +-6) like ml_dtypes and a
///    .satfinite cvt, and writes NaN as +0 (ml_dtypes writes a zero whose sign follows the NaN's
///    bits; slimserve drops the sign, the way its other encoders write one canonical NaN).
///
/// The same integer path (detail/float_codec.hpp) runs on the host, the CPU emulator and the
/// GPU: sm_90 has no FP4 conversion instruction.

#include <concepts>
#include <cstdint>
#include <string_view>

#include "slimserve/config.hpp"
#include "slimserve/formats/detail/float_codec.hpp"
#include "slimserve/formats/float_formats.hpp"

SLIMSERVE_NAMESPACE_BEGIN

/// OCP FP4 e2m1fn; the code is `bits & 0xF` (the high nibble is zero in every value made here).
struct fp4_e2m1 {
  std::uint8_t bits;
  SLIMSERVE_HOST_DEVICE static constexpr fp4_e2m1 from_bits(std::uint8_t b) {
    return fp4_e2m1{static_cast<std::uint8_t>(b & 0xFu)};
  }
};

namespace detail {
using E2m1Layout = FloatLayout<2, 1, SpecialValues::none>;
}  // namespace detail

template <>
struct format_traits<fp4_e2m1> : detail::LayoutTraits<detail::E2m1Layout> {
  static constexpr std::string_view name = "fp4_e2m1";
};

static_assert(format_traits<fp4_e2m1>::max_finite == 6.0f);
static_assert(format_traits<fp4_e2m1>::min_normal == 1.0f);
static_assert(format_traits<fp4_e2m1>::min_subnormal == 0.5f);

SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr float to_float(fp4_e2m1 x) {
  return detail::decode<detail::E2m1Layout>(x.bits & 0xFu);
}

/// float -> e2m1: round to nearest even, saturating, NaN -> +0.
template <class T>
  requires std::same_as<T, fp4_e2m1>
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr T from_float(float x) {
  return fp4_e2m1{static_cast<std::uint8_t>(
      detail::encode_rne<detail::E2m1Layout, detail::Overflow::saturate>(x))};
}

static_assert(from_float<fp4_e2m1>(0.25f).bits == 0x0);
static_assert(from_float<fp4_e2m1>(0.75f).bits == 0x2);
static_assert(from_float<fp4_e2m1>(5.0f).bits == 0x6);
static_assert(from_float<fp4_e2m1>(-7.0f).bits == 0xF);

SLIMSERVE_NAMESPACE_END
