// The INT4 host code's internal element decoder agrees with the project's numeric formats.

#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../../src/int4/element_convert.hpp"
#include "slimserve/formats/float_formats.hpp"

namespace int4 = slimserve::int4;

TEST_CASE("element decode: every FP16, BF16 and FP8 code matches the formats' to_float", "[int4][convert]") {
  auto same = [](float a, float b) {
    return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) || (a != a && b != b);
  };
  std::vector<std::byte> bytes(2 * 65536 + 1);
  for (std::uint32_t code = 0; code < 65536; ++code) {
    const auto bits = static_cast<std::uint16_t>(code);
    std::memcpy(bytes.data() + 1 + 2 * code, &bits, 2);  // odd address: the unaligned path
  }
  std::vector<float> decoded(65536);
  int4::detail::decode_run(int4::ElementType::float16, bytes.data() + 1, 65536, decoded.data());
  for (std::uint32_t code = 0; code < 65536; ++code) {
    INFO("fp16 code " << code);
    REQUIRE(same(decoded[code], slimserve::to_float(slimserve::fp16::from_bits(static_cast<std::uint16_t>(code)))));
  }
  int4::detail::decode_run(int4::ElementType::bfloat16, bytes.data() + 1, 65536, decoded.data());
  for (std::uint32_t code = 0; code < 65536; ++code) {
    INFO("bf16 code " << code);
    REQUIRE(same(decoded[code], slimserve::to_float(slimserve::bf16::from_bits(static_cast<std::uint16_t>(code)))));
  }
  std::vector<std::byte> small(256);
  for (int code = 0; code < 256; ++code) small[static_cast<std::size_t>(code)] = static_cast<std::byte>(code);
  int4::detail::decode_run(int4::ElementType::float8_e4m3, small.data(), 256, decoded.data());
  for (int code = 0; code < 256; ++code) {
    INFO("e4m3 code " << code);
    REQUIRE(same(decoded[static_cast<std::size_t>(code)],
                 slimserve::to_float(slimserve::fp8_e4m3::from_bits(static_cast<std::uint8_t>(code)))));
  }
}

TEST_CASE("round_up_to: the smallest FP16/BF16 value not below the input", "[int4][convert]") {
  for (float v : {1.0f, 1.0001f, 3.14159f, 1e-6f, 65000.0f, 0.3f}) {
    const float up16 = int4::detail::round_up_to(int4::ElementType::float16, v);
    REQUIRE(up16 >= v);
    REQUIRE(slimserve::to_float(slimserve::from_float<slimserve::fp16>(up16)) == up16);
    const float up_bf = int4::detail::round_up_to(int4::ElementType::bfloat16, v);
    REQUIRE(up_bf >= v);
    REQUIRE(slimserve::to_float(slimserve::from_float<slimserve::bf16>(up_bf)) == up_bf);
    // Nothing representable in between: one step down is below v.
    const auto below16 = slimserve::fp16::from_bits(static_cast<std::uint16_t>(slimserve::from_float<slimserve::fp16>(up16).bits - 1));
    REQUIRE(slimserve::to_float(below16) < v);
  }
}
