// Scalar conversions of BF16, FP16 and FP8: smoke checks (golden tables follow).
#include <catch2/catch.hpp>

#include "slimserve/formats/formats.hpp"

using namespace slimserve;

TEST_CASE("format constants", "[formats]") {
  CHECK(format_traits<fp8_e4m3>::max_finite == 448.0f);
  CHECK(format_traits<fp8_e5m2>::max_finite == 57344.0f);
  CHECK(from_float<fp8_e4m3>(1e9f).bits == 0x7E);
  CHECK(from_float<fp8_e5m2>(-1e9f).bits == 0xFB);
}
