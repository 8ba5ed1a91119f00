// The examples shown in docs/formats.md (between the example-begin/end markers), compiled
// and run so the documentation cannot go stale.
#include <catch2/catch.hpp>

#include <span>
#include <vector>

#include "slimserve/formats/convert.hpp"
#include "slimserve/formats/formats.hpp"

TEST_CASE("docs: scalar conversions", "[formats][docs]") {
  // example-begin scalar
  using namespace slimserve;
  const fp8_e4m3 q = from_float<fp8_e4m3>(0.3f);    // round to nearest even
  const float back = to_float(q);                  // exact: 0.3125
  const fp8_e4m3 big = from_float<fp8_e4m3>(1e6f);  // saturates to 448 (code 0x7E)
  static_assert(format_traits<fp8_e4m3>::max_finite == 448.0f);
  // example-end scalar
  CHECK(q.bits == 0x2A);
  CHECK(back == 0.3125f);
  CHECK(big.bits == 0x7E);
}

TEST_CASE("docs: quantize a tensor with a per-tensor scale", "[formats][docs]") {
  // example-begin quantize
  using namespace slimserve;
  const std::vector<float> weights = {0.5f, -3.0f, 12.0f, 0.0f};
  Result<float> scale = tensor_scale(std::span<const float>(weights),
                                     format_traits<fp8_e4m3>::max_finite);  // 12 / 448
  if (!scale.ok()) { /* scale.status().to_string() says which element was bad */ }
  std::vector<fp8_e4m3> codes(weights.size());
  Status status = quantize(std::span<const float>(weights), std::span<fp8_e4m3>(codes), *scale);
  std::vector<float> restored(weights.size());
  status = dequantize(std::span<const fp8_e4m3>(codes), std::span<float>(restored), *scale);
  // example-end quantize
  REQUIRE(scale.ok());
  REQUIRE(status.ok());
  CHECK(*scale == 12.0f / 448.0f);
  CHECK(codes[2].bits == 0x7E);   // amax lands on the largest finite code
  CHECK(restored[2] == 12.0f);    // 448 * (12 / 448) rounds back to 12 exactly
  CHECK(restored[3] == 0.0f);
}

TEST_CASE("docs: packed register conversions", "[formats][docs]") {
  // example-begin packed
  using namespace slimserve;
  const std::uint32_t four_codes = 0x00B84038u;  // e4m3 codes {0x38, 0x40, 0xB8, 0x00}
  const f32x4 v = to_float4<fp8_e4m3>(four_codes);  // {1, 2, -1, 0}: byte 0 is element 0
  const std::uint32_t again = from_float4<fp8_e4m3>(v);
  // example-end packed
  CHECK(again == four_codes);
  CHECK(v.x == 1.0f);
  CHECK(v.z == -1.0f);
}
