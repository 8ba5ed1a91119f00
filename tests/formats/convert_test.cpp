// Bulk host conversions give exactly the scalar conversions' bits, on one thread and many.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <type_traits>
#include <vector>

#include "golden.hpp"
#include "slimserve/formats/convert.hpp"
#include "support/random.hpp"

using namespace slimserve;
using slimserve_test::bits_of;
using slimserve_test::float_of;

namespace {

template <class T>
std::vector<T> all_codes() {
  std::vector<T> codes(std::size_t{1} << format_traits<T>::bits);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i].bits = static_cast<decltype(T::bits)>(i);
  return codes;
}

/// Inputs of type In: every code for the 16-bit formats, the golden float32 inputs plus a
/// random binade and a stride over all patterns for float.
template <class In>
std::vector<In> test_inputs(int binade_exponent) {
  if constexpr (std::is_same_v<In, float>) {
    std::vector<In> inputs;
    for (std::uint32_t bits : slimserve_test::load_golden<std::uint32_t>("f32_inputs.u32")) {
      inputs.push_back(float_of(bits));
    }
    const std::uint32_t first = static_cast<std::uint32_t>(binade_exponent + 127) << 23;
    for (std::uint32_t m = 1; m < (1u << 23); m += 41) inputs.push_back(float_of(first | m));
    for (std::uint64_t bits = 17; bits < (1ull << 32); bits += 65521) {
      inputs.push_back(float_of(static_cast<std::uint32_t>(bits)));
    }
    return inputs;
  } else {
    return all_codes<In>();
  }
}

template <class In, class Out>
void check_quantize(float scale, int binade_exponent) {
  const std::vector<In> src = test_inputs<In>(binade_exponent);
  std::vector<Out> dst(src.size());
  for (Out& d : dst) d.bits = 0x5A;  // poison
  REQUIRE(quantize(std::span<const In>(src), std::span<Out>(dst), scale).ok());
  std::size_t failures = 0;
  for (std::size_t i = 0; i < src.size(); ++i) {
    const auto expected = from_float<Out>(to_float(src[i]) / scale).bits;
    if (dst[i].bits != expected && ++failures <= 10) {
      FAIL_CHECK(format_traits<Out>::name << ": input bits " << bits_of(to_float(src[i])) << " scale "
                                          << scale << " -> " << dst[i].bits << ", scalar "
                                          << expected);
    }
  }
  CHECK(failures == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("quantize from float matches from_float element by element",
                   "[formats][convert]", fp8_e4m3, fp8_e5m2, fp16, bf16) {
  auto rng = slimserve_test::make_rng(51);
  const int low = std::max(-126, std::ilogb(format_traits<TestType>::min_subnormal) - 1);
  const int high = std::min(127, std::ilogb(format_traits<TestType>::max_finite) + 1);
  const int binade = std::uniform_int_distribution<int>(low, high)(rng);
  INFO("binade 2^" << binade);
  check_quantize<float, TestType>(1.0f, binade);
  check_quantize<float, TestType>(0.37f, binade);
}

TEMPLATE_TEST_CASE("quantize from bf16/fp16 matches the scalar path on every code",
                   "[formats][convert]", fp8_e4m3, fp8_e5m2, fp16, bf16) {
  check_quantize<bf16, TestType>(1.0f, 0);
  check_quantize<bf16, TestType>(3.1f, 0);
  check_quantize<fp16, TestType>(1.0f, 0);
  check_quantize<fp16, TestType>(0.011f, 0);
}

TEMPLATE_TEST_CASE("dequantize matches to_float * scale on every code", "[formats][convert]",
                   fp8_e4m3, fp8_e5m2, fp16, bf16) {
  const std::vector<TestType> src = all_codes<TestType>();
  for (float scale : {1.0f, 1.7f, 1e-3f}) {
    std::vector<float> dst(src.size(), -123.0f);
    REQUIRE(dequantize(std::span<const TestType>(src), std::span<float>(dst), scale).ok());
    std::size_t failures = 0;
    for (std::size_t i = 0; i < src.size(); ++i) {
      if (bits_of(dst[i]) != bits_of(to_float(src[i]) * scale) && ++failures <= 10) {
        FAIL_CHECK("code " << i << " scale " << scale);
      }
    }
    CHECK(failures == 0);
  }
}

TEST_CASE("multithreaded conversion equals the single-threaded one", "[formats][convert]") {
  auto rng = slimserve_test::make_rng(52);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  std::vector<float> src(100003);  // not a multiple of the chunking
  for (float& v : src) v = normal(rng);
  std::vector<fp8_e4m3> one(src.size()), many(src.size());
  REQUIRE(quantize(std::span<const float>(src), std::span<fp8_e4m3>(one), 0.5f,
                   ConvertOptions{1, 1}).ok());
  REQUIRE(quantize(std::span<const float>(src), std::span<fp8_e4m3>(many), 0.5f,
                   ConvertOptions{4, 1000}).ok());
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < src.size(); ++i) mismatches += one[i].bits != many[i].bits;
  CHECK(mismatches == 0);
  std::vector<float> back_one(src.size()), back_many(src.size(), -1.0f);
  REQUIRE(dequantize(std::span<const fp8_e4m3>(one), std::span<float>(back_one), 0.5f,
                     ConvertOptions{1, 1}).ok());
  REQUIRE(dequantize(std::span<const fp8_e4m3>(one), std::span<float>(back_many), 0.5f,
                     ConvertOptions{3, 777}).ok());
  CHECK(back_one == back_many);
}

TEST_CASE("bulk conversion rejects bad sizes and scales, writing nothing", "[formats][convert]") {
  const std::vector<float> src{1.0f, 2.0f, 3.0f};
  std::vector<fp8_e5m2> dst(3, fp8_e5m2{0x11});
  std::vector<fp8_e5m2> short_dst(2, fp8_e5m2{0x11});
  const Status size = quantize(std::span<const float>(src), std::span<fp8_e5m2>(short_dst));
  CHECK(size.code() == StatusCode::invalid_argument);
  CHECK(std::string(size.message()) == "source has 3 elements but destination has 2");
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    const Status status = quantize(std::span<const float>(src), std::span<fp8_e5m2>(dst), bad);
    CHECK(status.code() == StatusCode::invalid_argument);
    std::vector<float> out(3, 9.0f);
    CHECK_FALSE(dequantize(std::span<const fp8_e5m2>(dst), std::span<float>(out), bad).ok());
    CHECK(out == std::vector<float>(3, 9.0f));
  }
  for (const fp8_e5m2& d : dst) CHECK(d.bits == 0x11);
}
