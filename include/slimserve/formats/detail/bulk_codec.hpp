#pragma once
/// \file
/// \brief Branch-free variants of the float codec for the host's bulk loops (convert.cpp):
/// straight-line selects that compilers vectorize. Bit-identical to float_codec.hpp (the tests
/// compare them on every code and on the golden and sweep inputs).
///
/// The encoder rounds subnormal results with one float addition (the FPU's round-to-nearest-
/// even does the work), so it assumes the default rounding mode; flush-to-zero and
/// denormals-are-zero do not change its results.

#include <cstdint>

#include "slimserve/formats/detail/float_codec.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace detail {

template <class Layout, Overflow OverflowPolicy>
SLIMSERVE_FORCEINLINE std::uint32_t encode_rne_branchless(float value) {
  constexpr int m = Layout::mantissa_bits;
  constexpr int min_normal_exponent = 1 - Layout::bias;
  constexpr std::uint32_t min_normal_bits = static_cast<std::uint32_t>(127 + min_normal_exponent) << 23;
  constexpr float max_finite = decode<Layout>(Layout::max_finite_code);
  constexpr std::uint32_t max_finite_bits = float_bits(max_finite);
  // Adding 2^(min_normal_exponent - m + 23) to |x| < 2^min_normal_exponent leaves a float
  // whose ulp is the target's subnormal spacing: its low bits are the rounded code.
  constexpr std::uint32_t subnormal_magic_bits =
      static_cast<std::uint32_t>(127 + min_normal_exponent - m + 23) << 23;

  const std::uint32_t x = float_bits(value);
  const std::uint32_t sign = (x >> 31) << (Layout::total_bits - 1);
  std::uint32_t a = x & 0x7FFFFFFFu;
  const bool nan = a > 0x7F800000u;
  if constexpr (OverflowPolicy == Overflow::saturate) {
    a = a < max_finite_bits ? a : max_finite_bits;  // everything beyond max rounds to max
  }
  // Normal results: round the float's mantissa at bit (23 - m), then rebias the exponent.
  const std::uint32_t rounded = a + ((1u << (22 - m)) - 1u) + ((a >> (23 - m)) & 1u);
  const std::uint32_t normal_code =
      (rounded >> (23 - m)) - (static_cast<std::uint32_t>(127 - Layout::bias) << m);
  const float subnormal_sum = float_from_bits(a) + float_from_bits(subnormal_magic_bits);
  const std::uint32_t subnormal_code = float_bits(subnormal_sum) - subnormal_magic_bits;
  std::uint32_t code = a < min_normal_bits ? subnormal_code : normal_code;
  if constexpr (OverflowPolicy == Overflow::to_infinity) {
    // Past the largest finite value (after rounding), and infinities, become infinity.
    code = (a >= 0x7F800000u || code > Layout::infinity_code) ? Layout::infinity_code : code;
  }
  return nan ? Layout::canonical_nan_code : (sign | code);
}

template <class Layout>
SLIMSERVE_FORCEINLINE float decode_branchless(std::uint32_t code) {
  constexpr int m = Layout::mantissa_bits;
  constexpr std::uint32_t unit_bits = static_cast<std::uint32_t>(127 + 1 - Layout::bias - m) << 23;
  const std::uint32_t sign = (code & Layout::sign_mask) != 0u ? 0x80000000u : 0u;
  const std::uint32_t magnitude = code & Layout::magnitude_mask;
  const std::uint32_t normal_bits =
      (magnitude << (23 - m)) + (static_cast<std::uint32_t>(127 - Layout::bias) << 23);
  const std::uint32_t subnormal_bits =
      float_bits(static_cast<float>(magnitude) * float_from_bits(unit_bits));
  std::uint32_t bits = magnitude < (1u << m) ? subnormal_bits : normal_bits;
  bool nan;
  if constexpr (Layout::specials == SpecialValues::ieee) {
    nan = magnitude > Layout::infinity_code;
    bits = magnitude == Layout::infinity_code ? 0x7F800000u : bits;
  } else {
    nan = magnitude == Layout::magnitude_mask;
  }
  return float_from_bits(nan ? canonical_float_nan : (sign | bits));
}

}  // namespace detail
SLIMSERVE_NAMESPACE_END
