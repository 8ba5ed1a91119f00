#pragma once
/// \file
/// \brief BF16, FP16, FP8 e4m3 (OCP e4m3fn) and FP8 e5m2: storage types, traits and
/// scalar conversions to and from float32, usable on the host and on the device.
///
/// Conversions (the same bits on the host, on the CPU emulator and on the GPU):
///  * `to_float(x)` is exact. NaN codes of FP16 and FP8 decode to the canonical float NaN
///    0x7FFFFFFF (what the GPU's cvt.f32.f16 does); BF16 decodes by a 16-bit shift, so a BF16
///    NaN keeps its sign and payload.
///  * `from_float<T>(x)` rounds to nearest, ties to even. NaN becomes the canonical NaN of T
///    (BF16/FP16 0x7FFF, FP8 0x7F: sign cleared). Beyond the largest finite value BF16 and
///    FP16 round to +-infinity (IEEE); FP8 saturates to +-max_finite, infinities included,
///    like the GPU's cvt.rn.satfinite (so a finite input never becomes NaN or infinity).
///    Where this differs from ml_dtypes (which overflows FP8 to NaN/inf and keeps NaN signs)
///    is listed in docs/formats.md.
///
/// Plain C++20 on the host (no CUDA headers); under nvcc, device code uses the hardware
/// conversions of detail/device_convert.hpp where the GPU has them.

#include <concepts>
#include <cstdint>
#include <string_view>

#include "slimserve/config.hpp"
#include "slimserve/formats/detail/device_convert.hpp"
#include "slimserve/formats/detail/float_codec.hpp"

SLIMSERVE_NAMESPACE_BEGIN

// Storage types: trivially copyable, no default member initializer (so they can live in
// __shared__ arrays), one public member `bits`. They carry no arithmetic on purpose: convert
// to float, compute, convert back.

/// bfloat16: 1 sign, 8 exponent, 7 mantissa bits; IEEE infinities and NaNs.
struct bf16 {
  std::uint16_t bits;
  SLIMSERVE_HOST_DEVICE static constexpr bf16 from_bits(std::uint16_t b) { return bf16{b}; }
};
/// IEEE binary16: 1 sign, 5 exponent, 10 mantissa bits.
struct fp16 {
  std::uint16_t bits;
  SLIMSERVE_HOST_DEVICE static constexpr fp16 from_bits(std::uint16_t b) { return fp16{b}; }
};
/// OCP FP8 e4m3fn: 1 sign, 4 exponent, 3 mantissa bits, bias 7; max 448; no infinity; the
/// only NaNs are 0x7F and 0xFF.
struct fp8_e4m3 {
  std::uint8_t bits;
  SLIMSERVE_HOST_DEVICE static constexpr fp8_e4m3 from_bits(std::uint8_t b) { return fp8_e4m3{b}; }
};
/// OCP FP8 e5m2: 1 sign, 5 exponent, 2 mantissa bits, bias 15; max 57344; IEEE specials.
struct fp8_e5m2 {
  std::uint8_t bits;
  SLIMSERVE_HOST_DEVICE static constexpr fp8_e5m2 from_bits(std::uint8_t b) { return fp8_e5m2{b}; }
};

template <class T>
concept float_format = std::same_as<T, bf16> || std::same_as<T, fp16> ||
                       std::same_as<T, fp8_e4m3> || std::same_as<T, fp8_e5m2>;
template <class T>
concept fp8_format = std::same_as<T, fp8_e4m3> || std::same_as<T, fp8_e5m2>;
/// The 16-bit formats, which pack two to a 32-bit register.
template <class T>
concept half_format = std::same_as<T, bf16> || std::same_as<T, fp16>;

namespace detail {
using Bf16Layout = FloatLayout<8, 7, SpecialValues::ieee>;
using Fp16Layout = FloatLayout<5, 10, SpecialValues::ieee>;
using E4m3Layout = FloatLayout<4, 3, SpecialValues::finite_only>;
using E5m2Layout = FloatLayout<5, 2, SpecialValues::ieee>;

template <class Layout>
struct LayoutTraits {
  using layout = Layout;
  static constexpr int bits = Layout::total_bits;
  static constexpr int exponent_bits = Layout::exponent_bits;
  static constexpr int mantissa_bits = Layout::mantissa_bits;
  static constexpr int exponent_bias = Layout::bias;
  static constexpr bool has_infinity = Layout::specials == SpecialValues::ieee;
  /// Largest finite value.
  static constexpr float max_finite = decode<Layout>(Layout::max_finite_code);
  /// Smallest positive normal value.
  static constexpr float min_normal = decode<Layout>(1u << Layout::mantissa_bits);
  /// Smallest positive (subnormal) value.
  static constexpr float min_subnormal = decode<Layout>(1u);
};
}  // namespace detail

/// Per-format constants: `max_finite`, `min_normal`, `min_subnormal`, `name`, `bits`, ...
template <class T>
struct format_traits;
template <>
struct format_traits<bf16> : detail::LayoutTraits<detail::Bf16Layout> {
  static constexpr std::string_view name = "bf16";
};
template <>
struct format_traits<fp16> : detail::LayoutTraits<detail::Fp16Layout> {
  static constexpr std::string_view name = "fp16";
};
template <>
struct format_traits<fp8_e4m3> : detail::LayoutTraits<detail::E4m3Layout> {
  static constexpr std::string_view name = "fp8_e4m3";
};
template <>
struct format_traits<fp8_e5m2> : detail::LayoutTraits<detail::E5m2Layout> {
  static constexpr std::string_view name = "fp8_e5m2";
};

static_assert(format_traits<fp8_e4m3>::max_finite == 448.0f);
static_assert(format_traits<fp8_e5m2>::max_finite == 57344.0f);
static_assert(format_traits<fp16>::max_finite == 65504.0f);

// ---- float_format -> float (exact) ---------------------------------------------------------

SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr float to_float(float x) { return x; }

SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr float to_float(bf16 x) {
  return detail::float_from_bits(static_cast<std::uint32_t>(x.bits) << 16);
}

SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr float to_float(fp16 x) {
#if defined(__CUDA_ARCH__)
  return detail::hw::fp16_to_float(x.bits);
#else
  return detail::decode<detail::Fp16Layout>(x.bits);
#endif
}

SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr float to_float(fp8_e4m3 x) {
#if defined(SLIMSERVE_HAS_HW_FP8_CVT)
  return detail::hw::fp16_to_float(
      static_cast<std::uint16_t>(detail::hw::fp8x2_to_fp16x2<true>(x.bits)));
#else
  return detail::decode<detail::E4m3Layout>(x.bits);
#endif
}

SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr float to_float(fp8_e5m2 x) {
#if defined(SLIMSERVE_HAS_HW_FP8_CVT)
  return detail::hw::fp16_to_float(
      static_cast<std::uint16_t>(detail::hw::fp8x2_to_fp16x2<false>(x.bits)));
#else
  return detail::decode<detail::E5m2Layout>(x.bits);
#endif
}

// ---- float -> float_format (round to nearest even) ----------------------------------------

template <class T>
  requires float_format<T> || std::same_as<T, float>
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr T from_float(float x) {
  using detail::encode_rne;
  using detail::Overflow;
  if constexpr (std::same_as<T, float>) {
    return x;
  } else if constexpr (std::same_as<T, bf16>) {
#if defined(SLIMSERVE_HAS_HW_BF16_CVT)
    return bf16{detail::hw::float_to_bf16(x)};
#else
    return bf16{static_cast<std::uint16_t>(encode_rne<detail::Bf16Layout, Overflow::to_infinity>(x))};
#endif
  } else if constexpr (std::same_as<T, fp16>) {
#if defined(__CUDA_ARCH__)
    return fp16{detail::hw::float_to_fp16(x)};
#else
    return fp16{static_cast<std::uint16_t>(encode_rne<detail::Fp16Layout, Overflow::to_infinity>(x))};
#endif
  } else if constexpr (std::same_as<T, fp8_e4m3>) {
#if defined(SLIMSERVE_HAS_HW_FP8_CVT)
    return fp8_e4m3{static_cast<std::uint8_t>(detail::hw::float2_to_fp8x2<true>(x, 0.0f))};
#else
    return fp8_e4m3{static_cast<std::uint8_t>(encode_rne<detail::E4m3Layout, Overflow::saturate>(x))};
#endif
  } else {
#if defined(SLIMSERVE_HAS_HW_FP8_CVT)
    return fp8_e5m2{static_cast<std::uint8_t>(detail::hw::float2_to_fp8x2<false>(x, 0.0f))};
#else
    return fp8_e5m2{static_cast<std::uint8_t>(encode_rne<detail::E5m2Layout, Overflow::saturate>(x))};
#endif
  }
}

// ---- bit-level classification (exact, no float compares) ----------------------------------

template <float_format T>
SLIMSERVE_HOST_DEVICE constexpr bool is_nan(T x) {
  using L = typename format_traits<T>::layout;
  const std::uint32_t magnitude = x.bits & L::magnitude_mask;
  if constexpr (L::specials == detail::SpecialValues::ieee) {
    return magnitude > L::infinity_code;
  } else {
    return magnitude == L::magnitude_mask;
  }
}

SLIMSERVE_NAMESPACE_END
