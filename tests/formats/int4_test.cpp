// INT4 nibble packing: exhaustive over bytes and over every (position, value) of a word.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>

#include "slimserve/formats/int4.hpp"
#include "support/random.hpp"

using namespace slimserve;

TEST_CASE("int4 nibble encode/decode covers -8..7 and 0..15", "[formats][int4]") {
  for (int v = int4_min; v <= int4_max; ++v) {
    CHECK(fits_int4(v));
    CHECK(int4_from_bits(int4_bits(v)) == v);
    CHECK(offset_uint4_to_int4(int4_to_offset_uint4(v)) == v);
    CHECK(int4_to_offset_uint4(v) == static_cast<std::uint8_t>(int4_bits(v) ^ 0x8u));
  }
  CHECK_FALSE(fits_int4(8));
  CHECK_FALSE(fits_int4(-9));
  CHECK(fits_uint4(15));
  CHECK_FALSE(fits_uint4(16));
  CHECK_FALSE(fits_uint4(-1));
  STATIC_REQUIRE(int4_from_bits(0xFu) == -1);
  STATIC_REQUIRE(int4_from_bits(0x8u) == -8);
  STATIC_REQUIRE(int4_from_bits(0x7u) == 7);
}

TEST_CASE("two nibbles per byte: every byte round-trips", "[formats][int4]") {
  for (int byte = 0; byte < 256; ++byte) {
    const auto b = static_cast<std::uint8_t>(byte);
    const std::uint8_t lo = uint4_in_byte(b, 0), hi = uint4_in_byte(b, 1);
    CHECK(lo == (byte & 0xF));
    CHECK(hi == (byte >> 4));
    CHECK(pack_uint4x2(lo, hi) == b);
    const int slo = int4_in_byte(b, 0), shi = int4_in_byte(b, 1);
    CHECK(fits_int4(slo));
    CHECK(fits_int4(shi));
    CHECK(pack_int4x2(slo, shi) == b);
  }
}

TEST_CASE("eight nibbles per word: every value at every position round-trips", "[formats][int4]") {
  auto rng = slimserve_test::make_rng(31);
  std::uniform_int_distribution<int> signed_value(int4_min, int4_max);
  std::uniform_int_distribution<int> unsigned_value(0, uint4_max);
  for (int trial = 0; trial < 2000; ++trial) {
    for (int position = 0; position < 8; ++position) {
      for (int v = 0; v < 16; ++v) {
        std::uint8_t u[8];
        std::int8_t s[8];
        for (int j = 0; j < 8; ++j) {
          u[j] = static_cast<std::uint8_t>(unsigned_value(rng));
          s[j] = static_cast<std::int8_t>(signed_value(rng));
        }
        u[position] = static_cast<std::uint8_t>(v);
        s[position] = static_cast<std::int8_t>(v - 8);
        const std::uint32_t uw = pack_uint4x8(u);
        const std::uint32_t sw = pack_int4x8(s);
        std::uint8_t u_back[8];
        std::int8_t s_back[8];
        unpack_uint4x8(uw, u_back);
        unpack_int4x8(sw, s_back);
        bool ok = true;
        for (int j = 0; j < 8; ++j) {
          ok = ok && u_back[j] == u[j] && s_back[j] == s[j] && uint4_at(uw, j) == u[j] &&
               int4_at(sw, j) == s[j];
          // Nibble j sits at bits 4j..4j+3 (the interchange form's order).
          ok = ok && ((uw >> (4 * j)) & 0xFu) == u[j];
        }
        // Offset binary: flipping bit 3 of every nibble maps signed to zero-point-8 unsigned.
        const std::uint32_t flipped = flip_int4x8_offset(sw);
        for (int j = 0; j < 8; ++j) {
          ok = ok && uint4_at(flipped, j) == int4_to_offset_uint4(s[j]);
        }
        if (!ok) {
          FAIL("word round trip failed at position " << position << " value " << v);
        }
      }
    }
  }
  SUCCEED();
}
