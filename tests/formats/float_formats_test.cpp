// Scalar BF16 / FP16 / FP8 conversions, bit-exact against golden tables generated with
// ml_dtypes (gen_golden.py). Where slimserve's documented policy differs from ml_dtypes (FP8
// saturation, canonical NaNs) the policy is checked explicitly, everything else bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "golden.hpp"
#include "slimserve/formats/float_formats.hpp"

using namespace slimserve;
using slimserve_test::bits_of;
using slimserve_test::float_of;
using slimserve_test::is_nan_bits;
using slimserve_test::load_golden;

namespace {

template <class T>
using storage_t = decltype(T::bits);

template <class T>
struct Golden;
template <>
struct Golden<bf16> {
  static constexpr const char* decode = "bf16_to_f32.u32";
  static constexpr const char* encode = "f32_to_bf16.u16";
};
template <>
struct Golden<fp16> {
  static constexpr const char* decode = "fp16_to_f32.u32";
  static constexpr const char* encode = "f32_to_fp16.u16";
};
template <>
struct Golden<fp8_e4m3> {
  static constexpr const char* decode = "e4m3_to_f32.u32";
  static constexpr const char* encode = "f32_to_e4m3.u8";
};
template <>
struct Golden<fp8_e5m2> {
  static constexpr const char* decode = "e5m2_to_f32.u32";
  static constexpr const char* encode = "f32_to_e5m2.u8";
};

template <class T>
constexpr std::uint32_t sign_bit = 1u << (format_traits<T>::bits - 1);
template <class T>
constexpr std::uint32_t canonical_nan = sign_bit<T> - 1u;  // 0x7F / 0x7FFF
template <class T>
constexpr std::uint32_t max_code = format_traits<T>::layout::max_finite_code;
template <class T>
constexpr std::uint32_t num_codes = 1u << format_traits<T>::bits;

}  // namespace

TEMPLATE_TEST_CASE("every code decodes like the golden table", "[formats][decode]", bf16, fp16,
                   fp8_e4m3, fp8_e5m2) {
  const std::vector<std::uint32_t> golden = load_golden<std::uint32_t>(Golden<TestType>::decode);
  REQUIRE(golden.size() == num_codes<TestType>);
  std::uint32_t nan_codes = 0;
  for (std::uint32_t code = 0; code < num_codes<TestType>; ++code) {
    const auto value = TestType::from_bits(static_cast<storage_t<TestType>>(code));
    const std::uint32_t ours = bits_of(to_float(value));
    if (is_nan_bits(golden[code])) {
      ++nan_codes;
      CHECK(is_nan(value));
      if constexpr (std::is_same_v<TestType, bf16>) {
        // BF16 decodes by a shift: sign and payload survive, exactly like ml_dtypes.
        if (ours != golden[code]) FAIL_CHECK("bf16 code " << code << ": " << ours << " vs " << golden[code]);
      } else if (ours != 0x7FFFFFFFu) {
        FAIL_CHECK("NaN code " << code << " must decode to the canonical NaN, got " << ours);
      }
    } else {
      CHECK_FALSE(is_nan(value));
      if (ours != golden[code]) {
        FAIL_CHECK(format_traits<TestType>::name << " code " << code << " decodes to " << ours
                                                 << ", ml_dtypes says " << golden[code]);
      }
    }
  }
  // e4m3fn has exactly two NaN codes; the IEEE-like formats 2 * (2^mantissa_bits - 1).
  const std::uint32_t expected_nans =
      format_traits<TestType>::has_infinity
          ? 2u * ((1u << format_traits<TestType>::mantissa_bits) - 1u)
          : 2u;
  CHECK(nan_codes == expected_nans);
}

TEMPLATE_TEST_CASE("float32 inputs encode like the golden table, under slimserve's policy",
                   "[formats][encode]", bf16, fp16, fp8_e4m3, fp8_e5m2) {
  const auto inputs = load_golden<std::uint32_t>("f32_inputs.u32");
  const auto golden = load_golden<storage_t<TestType>>(Golden<TestType>::encode);
  const auto decoded = load_golden<std::uint32_t>(Golden<TestType>::decode);
  REQUIRE(inputs.size() > 100000);
  REQUIRE(golden.size() == inputs.size());

  std::size_t exact = 0, nan_inputs = 0, saturated = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const float x = float_of(inputs[i]);
    const std::uint32_t ours = from_float<TestType>(x).bits;
    const std::uint32_t theirs = golden[i];
    const std::uint32_t sign = (inputs[i] >> 31) != 0 ? sign_bit<TestType> : 0u;
    if (std::isnan(x)) {
      // Policy: every NaN becomes the canonical NaN (sign cleared), like the GPU's cvt.
      ++nan_inputs;
      CHECK(is_nan_bits(decoded[theirs]));
      if (ours != canonical_nan<TestType>) FAIL_CHECK("NaN input " << inputs[i] << " -> " << ours);
    } else if constexpr (std::is_same_v<TestType, fp8_e4m3> || std::is_same_v<TestType, fp8_e5m2>) {
      const bool ml_dtypes_overflowed = !std::isfinite(float_of(decoded[theirs]));
      if (ml_dtypes_overflowed) {
        // Policy: FP8 saturates (satfinite); ml_dtypes gives NaN (e4m3fn) or inf (e5m2).
        ++saturated;
        CHECK(std::fabs(x) > format_traits<TestType>::max_finite);
        if (ours != (sign | max_code<TestType>)) FAIL_CHECK("input " << x << " -> " << ours);
      } else {
        ++exact;
        if (ours != theirs) FAIL_CHECK("input " << x << " (bits " << inputs[i] << ") -> " << ours << ", ml_dtypes " << theirs);
      }
    } else {
      ++exact;
      if (ours != theirs) FAIL_CHECK("input " << x << " (bits " << inputs[i] << ") -> " << ours << ", ml_dtypes " << theirs);
    }
  }
  CHECK(nan_inputs > 10);
  CHECK(exact > 100000);  // most inputs are compared bit for bit, not by policy
  if constexpr (std::is_same_v<TestType, fp8_e4m3> || std::is_same_v<TestType, fp8_e5m2>) {
    CHECK(saturated > 100);
  }
}

TEMPLATE_TEST_CASE("decode then encode returns every non-NaN code", "[formats][round-trip]", bf16,
                   fp16, fp8_e4m3, fp8_e5m2) {
  for (std::uint32_t code = 0; code < num_codes<TestType>; ++code) {
    const auto value = TestType::from_bits(static_cast<storage_t<TestType>>(code));
    if (is_nan(value)) {
      CHECK(from_float<TestType>(to_float(value)).bits == canonical_nan<TestType>);
      continue;
    }
    std::uint32_t expected = code;
    if constexpr (std::is_same_v<TestType, fp8_e5m2>) {
      // FP8 saturates infinities: e5m2's +-inf codes come back as +-max.
      if ((code & 0x7Fu) == 0x7Cu) expected = (code & 0x80u) | max_code<TestType>;
    }
    if (from_float<TestType>(to_float(value)).bits != expected) {
      FAIL_CHECK(format_traits<TestType>::name << " code " << code << " does not round-trip");
    }
  }
}

TEST_CASE("FP8 saturation policy (satfinite)", "[formats][saturate]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // e4m3fn: 448 = 0x7E; 464 is the tie between 448 and the (NaN) pattern above it.
  CHECK(from_float<fp8_e4m3>(448.0f).bits == 0x7E);
  CHECK(from_float<fp8_e4m3>(464.0f).bits == 0x7E);
  CHECK(from_float<fp8_e4m3>(std::nextafter(464.0f, inf)).bits == 0x7E);
  CHECK(from_float<fp8_e4m3>(1e30f).bits == 0x7E);
  CHECK(from_float<fp8_e4m3>(-1e30f).bits == 0xFE);
  CHECK(from_float<fp8_e4m3>(inf).bits == 0x7E);
  CHECK(from_float<fp8_e4m3>(-inf).bits == 0xFE);
  CHECK(from_float<fp8_e4m3>(nan).bits == 0x7F);
  CHECK(from_float<fp8_e4m3>(-nan).bits == 0x7F);
  // e5m2: 57344 = 0x7B; inf saturates too (like cvt.rn.satfinite.e5m2x2.f32).
  CHECK(from_float<fp8_e5m2>(57344.0f).bits == 0x7B);
  CHECK(from_float<fp8_e5m2>(61440.0f).bits == 0x7B);
  CHECK(from_float<fp8_e5m2>(std::numeric_limits<float>::max()).bits == 0x7B);
  CHECK(from_float<fp8_e5m2>(inf).bits == 0x7B);
  CHECK(from_float<fp8_e5m2>(-inf).bits == 0xFB);
  CHECK(from_float<fp8_e5m2>(nan).bits == 0x7F);
  // 16-bit formats are IEEE: overflow rounds to infinity.
  CHECK(from_float<fp16>(65520.0f).bits == 0x7C00);
  CHECK(from_float<fp16>(std::nextafter(65520.0f, 0.0f)).bits == 0x7BFF);
  CHECK(from_float<bf16>(std::numeric_limits<float>::max()).bits == 0x7F80);
  CHECK(from_float<bf16>(-nan).bits == 0x7FFF);
}

TEST_CASE("format traits", "[formats][traits]") {
  STATIC_REQUIRE(format_traits<fp8_e4m3>::max_finite == 448.0f);
  STATIC_REQUIRE(format_traits<fp8_e5m2>::max_finite == 57344.0f);
  STATIC_REQUIRE(format_traits<fp16>::max_finite == 65504.0f);
  STATIC_REQUIRE(format_traits<bf16>::max_finite == 0x1.FEp127f);
  STATIC_REQUIRE(format_traits<fp8_e4m3>::min_subnormal == 0x1p-9f);
  STATIC_REQUIRE(format_traits<fp8_e5m2>::min_subnormal == 0x1p-16f);
  STATIC_REQUIRE(format_traits<fp16>::min_normal == 0x1p-14f);
  STATIC_REQUIRE(format_traits<bf16>::min_subnormal == 0x1p-133f);
  STATIC_REQUIRE(format_traits<bf16>::bits == 16);
  STATIC_REQUIRE(format_traits<fp8_e4m3>::bits == 8);
  STATIC_REQUIRE(!format_traits<fp8_e4m3>::has_infinity);
  STATIC_REQUIRE(format_traits<fp8_e5m2>::has_infinity);
  STATIC_REQUIRE(std::is_trivially_copyable_v<fp8_e4m3> && sizeof(fp8_e4m3) == 1);
  STATIC_REQUIRE(std::is_trivially_copyable_v<bf16> && sizeof(bf16) == 2);
  STATIC_REQUIRE(std::is_trivial_v<fp16>);  // usable in __shared__ arrays
  CHECK(format_traits<fp8_e4m3>::name == "fp8_e4m3");
  CHECK(format_traits<bf16>::name == "bf16");
  // Conversions are constexpr on the host.
  STATIC_REQUIRE(from_float<fp8_e4m3>(1.0f).bits == 0x38);
  STATIC_REQUIRE(to_float(fp8_e5m2::from_bits(0x3C)) == 1.0f);
}
