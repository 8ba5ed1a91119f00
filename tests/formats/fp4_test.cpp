// E2M1 (FP4 e2m1fn, NVFP4's element) on the host, bit for bit against the golden tables
// gen_golden.py wrote from ml_dtypes' float4_e2m1fn: every code decoded, every encoder input
// (ties, neighbours of every tie, saturation, specials, random float32 bit patterns) encoded;
// and the NVFP4 block rule's scalar pieces at their edges.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "golden.hpp"
#include "slimserve/formats/fp4.hpp"
#include "slimserve/formats/nvfp4.hpp"

using namespace slimserve;
using slimserve_test::bits_of;
using slimserve_test::float_of;
using slimserve_test::is_nan_bits;
using slimserve_test::load_golden;

TEST_CASE("e2m1 decodes all 16 codes as ml_dtypes does", "[formats][fp4]") {
  const auto golden = load_golden<std::uint32_t>("e2m1_to_f32.u32");
  REQUIRE(golden.size() == 16);
  for (std::uint32_t code = 0; code < 16; ++code) {
    INFO("code " << code);
    CHECK(bits_of(to_float(fp4_e2m1::from_bits(static_cast<std::uint8_t>(code)))) == golden[code]);
  }
  CHECK(format_traits<fp4_e2m1>::bits == 4);
  CHECK(format_traits<fp4_e2m1>::exponent_bias == 1);
  CHECK_FALSE(format_traits<fp4_e2m1>::has_infinity);
}

TEST_CASE("e2m1 encodes every golden input as ml_dtypes does (NaN -> +0)", "[formats][fp4]") {
  const auto inputs = load_golden<std::uint32_t>("f32_inputs.u32");
  const auto golden = load_golden<std::uint8_t>("f32_to_e2m1.u8");
  REQUIRE(inputs.size() == golden.size());
  REQUIRE(inputs.size() > 100000);
  std::size_t nans = 0, saturated = 0, exact = 0, wrong = 0, first = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const float x = float_of(inputs[i]);
    const std::uint8_t got = from_float<fp4_e2m1>(x).bits;
    bool ok;
    if (is_nan_bits(inputs[i])) {
      // ml_dtypes writes a zero (of either sign); slimserve writes +0 (docs/formats.md).
      ok = (golden[i] & 0x7u) == 0u && got == 0u;
      ++nans;
    } else {
      ok = got == golden[i];
      if (std::fabs(x) >= 7.0f) ++saturated;
      if (std::fabs(x) <= 6.0f && to_float(fp4_e2m1::from_bits(got)) == x) ++exact;
    }
    if (!ok && wrong++ == 0) first = i;
  }
  INFO("first mismatch: input " << first << " bits 0x" << std::hex << inputs[first]);
  CHECK(wrong == 0);
  CHECK(nans >= 9);
  CHECK(saturated > 1000);
  CHECK(exact >= 16);
}

TEST_CASE("NVFP4 block scale: rounding, saturation, flush, NaN and invalid tensor scales",
          "[formats][fp4][nvfp4]") {
  // amax / (6 * tensor_scale) rounded to nearest E4M3.
  CHECK(nvfp4_block_scale(6.0f, 1.0f).bits == from_float<fp8_e4m3>(1.0f).bits);
  CHECK(nvfp4_block_scale(12.0f, 0.5f).bits == from_float<fp8_e4m3>(4.0f).bits);
  CHECK(to_float(nvfp4_block_scale(6.0f * 448.0f, 1.0f)) == 448.0f);
  CHECK(to_float(nvfp4_block_scale(1.0e9f, 1.0f)) == 448.0f);  // saturates
  CHECK(to_float(nvfp4_block_scale(INFINITY, 1.0f)) == 448.0f);
  CHECK(nvfp4_block_scale(0.0f, 1.0f).bits == 0u);
  CHECK(nvfp4_block_scale(6.0f * 0x1p-11f, 1.0f).bits == 0u);  // below half of 2^-9: flushed
  CHECK(to_float(nvfp4_block_scale(6.0f * 0x1p-9f, 1.0f)) == 0x1p-9f);
  CHECK(nvfp4_block_scale(NAN, 1.0f).bits == nvfp4_nan_scale_code);
  for (float bad : {0.0f, -1.0f, NAN, INFINITY, -INFINITY}) {
    INFO("tensor scale " << bad);
    CHECK(nvfp4_block_scale(1.0f, bad).bits == nvfp4_nan_scale_code);
  }
  // The multiplier: 0 when the step is 0 or NaN, so the codes are 0.
  CHECK(nvfp4_code_multiplier(fp8_e4m3{0}, 1.0f) == 0.0f);
  CHECK(nvfp4_code_multiplier(fp8_e4m3{nvfp4_nan_scale_code}, 1.0f) == 0.0f);
  CHECK(nvfp4_code_multiplier(from_float<fp8_e4m3>(2.0f), 0.25f) == 2.0f);
  // Element codes and decode.
  CHECK(nvfp4_code(-6.5f, 1.0f) == 0xFu);
  CHECK(nvfp4_code(INFINITY, 0.5f) == 0x7u);
  CHECK(nvfp4_code_at(0x76543210u, 5).bits == 5u);
  CHECK(nvfp4_decode(fp4_e2m1{0xF}, from_float<fp8_e4m3>(448.0f), 2.0f) == -6.0f * 448.0f * 2.0f);
  CHECK(std::isnan(nvfp4_decode(fp4_e2m1{0x1}, fp8_e4m3{nvfp4_nan_scale_code}, 1.0f)));
}
