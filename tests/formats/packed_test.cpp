// Register-level packed conversions agree with the scalar ones, lane by lane.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <type_traits>

#include "golden.hpp"
#include "slimserve/formats/packed.hpp"
#include "support/random.hpp"

using namespace slimserve;
using slimserve_test::bits_of;
using slimserve_test::float_of;

namespace {
bool same_bits(float a, float b) { return bits_of(a) == bits_of(b); }
}  // namespace

TEMPLATE_TEST_CASE("to_float4 decodes each byte like to_float", "[formats][packed]", fp8_e4m3,
                   fp8_e5m2) {
  auto rng = slimserve_test::make_rng(21);
  std::uniform_int_distribution<std::uint32_t> word(0, 0xFFFFFFFFu);
  std::size_t failures = 0;
  for (int trial = 0; trial < 256 * 64; ++trial) {
    // Every code in every lane (lane = trial % 4, code = trial / 64 % 256), random neighbours.
    const std::uint32_t code = static_cast<std::uint32_t>(trial / 64) & 0xFFu;
    const int lane = trial % 4;
    std::uint32_t packed = word(rng);
    packed = (packed & ~(0xFFu << (8 * lane))) | (code << (8 * lane));
    const f32x4 v = to_float4<TestType>(packed);
    const float lanes[4] = {v.x, v.y, v.z, v.w};
    for (int j = 0; j < 4; ++j) {
      const auto byte = static_cast<std::uint8_t>(packed >> (8 * j));
      if (!same_bits(lanes[j], to_float(TestType::from_bits(byte))) && ++failures <= 10) {
        FAIL_CHECK("word " << packed << " lane " << j);
      }
    }
  }
  CHECK(failures == 0);
}

TEMPLATE_TEST_CASE("from_float4 encodes each lane like from_float", "[formats][packed]",
                   fp8_e4m3, fp8_e5m2) {
  const auto inputs = slimserve_test::load_golden<std::uint32_t>("f32_inputs.u32");
  std::size_t failures = 0;
  for (std::size_t i = 0; i + 4 <= inputs.size(); i += 3) {  // overlapping: every input in 1+ lanes
    const f32x4 v{float_of(inputs[i]), float_of(inputs[i + 1]), float_of(inputs[i + 2]),
                  float_of(inputs[i + 3])};
    const std::uint32_t packed = from_float4<TestType>(v);
    for (int j = 0; j < 4; ++j) {
      const std::uint32_t expected = from_float<TestType>(float_of(inputs[i + j])).bits;
      if (((packed >> (8 * j)) & 0xFFu) != expected && ++failures <= 10) {
        FAIL_CHECK("input " << inputs[i + j] << " in lane " << j);
      }
    }
  }
  CHECK(failures == 0);
}

TEMPLATE_TEST_CASE("to_float2 / from_float2 agree with the scalar conversions",
                   "[formats][packed]", bf16, fp16) {
  std::size_t failures = 0;
  auto rng = slimserve_test::make_rng(22);
  std::uniform_int_distribution<std::uint32_t> half(0, 0xFFFFu);
  for (std::uint32_t code = 0; code < 0x10000u; ++code) {
    for (int lane = 0; lane < 2; ++lane) {
      const std::uint32_t other = half(rng);
      const std::uint32_t packed = lane == 0 ? (code | (other << 16)) : (other | (code << 16));
      const f32x2 v = to_float2<TestType>(packed);
      const bool ok = same_bits(v.x, to_float(TestType::from_bits(static_cast<std::uint16_t>(packed)))) &&
                      same_bits(v.y, to_float(TestType::from_bits(static_cast<std::uint16_t>(packed >> 16))));
      if (!ok && ++failures <= 10) FAIL_CHECK("to_float2 of word " << packed);
    }
  }
  const auto inputs = slimserve_test::load_golden<std::uint32_t>("f32_inputs.u32");
  for (std::size_t i = 0; i + 2 <= inputs.size(); ++i) {
    const f32x2 v{float_of(inputs[i]), float_of(inputs[i + 1])};
    const std::uint32_t packed = from_float2<TestType>(v);
    const std::uint32_t expected = from_float<TestType>(v.x).bits |
                                   (static_cast<std::uint32_t>(from_float<TestType>(v.y).bits) << 16);
    if (packed != expected && ++failures <= 10) FAIL_CHECK("from_float2 of inputs " << i);
  }
  CHECK(failures == 0);
}

TEST_CASE("packed vector types match CUDA's float2/float4 layout", "[formats][packed]") {
  STATIC_REQUIRE(sizeof(f32x2) == 8 && alignof(f32x2) == 8);
  STATIC_REQUIRE(sizeof(f32x4) == 16 && alignof(f32x4) == 16);
  // Element 0 is the lowest byte: a little-endian load of codes {0x38, 0x40, 0xB8, 0x00}.
  const f32x4 v = to_float4<fp8_e4m3>(0x00B84038u);
  CHECK(v.x == 1.0f);
  CHECK(v.y == 2.0f);
  CHECK(v.z == -1.0f);
  CHECK(v.w == 0.0f);
  CHECK(from_float4<fp8_e4m3>(f32x4{1.0f, 2.0f, -1.0f, 0.0f}) == 0x00B84038u);
}
