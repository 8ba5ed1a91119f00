// Round-to-nearest-even against an independent reference: the nearest representable value
// chosen by comparing distances in double over the format's value list (taken from the
// ml_dtypes decode tables), ties to the even code. Sweeps every float32 around each
// midpoint, a whole binade chosen at random per run, and a stride over all 2^32 patterns.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "golden.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "support/random.hpp"

using namespace slimserve;
using slimserve_test::bits_of;
using slimserve_test::float_of;
using slimserve_test::load_golden;

namespace {

template <class T>
const char* decode_table() {
  if constexpr (std::is_same_v<T, bf16>) return "bf16_to_f32.u32";
  if constexpr (std::is_same_v<T, fp16>) return "fp16_to_f32.u32";
  if constexpr (std::is_same_v<T, fp8_e4m3>) return "e4m3_to_f32.u32";
  if constexpr (std::is_same_v<T, fp8_e5m2>) return "e5m2_to_f32.u32";
}

/// The nearest-value encoder, written without any bit tricks.
template <class T>
class NearestReference {
 public:
  NearestReference() {
    const auto decoded = load_golden<std::uint32_t>(decode_table<T>());
    const std::uint32_t sign_bit = 1u << (format_traits<T>::bits - 1);
    // Positive codes 0, 1, ... ascend in value up to the largest finite one.
    for (std::uint32_t code = 0; code < sign_bit; ++code) {
      const double v = static_cast<double>(float_of(decoded[code]));
      if (!std::isfinite(v)) break;
      REQUIRE((values_.empty() || v > values_.back()));
      values_.push_back(v);
    }
    REQUIRE(values_.back() == static_cast<double>(format_traits<T>::max_finite));
    sign_bit_ = sign_bit;
  }

  std::uint32_t encode(float x) const {
    if (std::isnan(x)) return sign_bit_ - 1u;  // canonical NaN (policy)
    const std::uint32_t sign = std::signbit(x) ? sign_bit_ : 0u;
    const double a = std::fabs(static_cast<double>(x));
    const std::uint32_t max_code = static_cast<std::uint32_t>(values_.size() - 1);
    const double top = values_.back();
    if (a > top) {
      if constexpr (!format_traits<T>::has_infinity || std::is_same_v<T, fp8_e5m2>) {
        return sign | max_code;  // FP8 saturates (satfinite)
      } else {
        // IEEE: the value one ulp above max is where infinity sits; the tie goes to the even
        // code, which is infinity's (max's code is odd).
        const double beyond = top + (top - values_[max_code - 1]);
        return sign | (a >= (top + beyond) / 2 ? max_code + 1 : max_code);
      }
    }
    const auto above = std::lower_bound(values_.begin(), values_.end(), a);
    const auto hi = static_cast<std::uint32_t>(above - values_.begin());
    if (*above == a) return sign | hi;
    const std::uint32_t lo = hi - 1;
    const double below_distance = a - values_[lo];
    const double above_distance = values_[hi] - a;
    if (below_distance < above_distance) return sign | lo;
    if (above_distance < below_distance) return sign | hi;
    return sign | ((lo % 2 == 0) ? lo : hi);
  }

  const std::vector<double>& values() const { return values_; }

 private:
  std::vector<double> values_;  // positive finite values, index = code
  std::uint32_t sign_bit_ = 0;
};

template <class T>
struct SweepCounter {
  const NearestReference<T>& reference;
  std::size_t checked = 0;
  std::size_t failures = 0;
  void check(std::uint32_t float_bits) {
    const float x = float_of(float_bits);
    const std::uint32_t ours = from_float<T>(x).bits;
    const std::uint32_t expected = reference.encode(x);
    ++checked;
    if (ours != expected && ++failures <= 10) {
      FAIL_CHECK(format_traits<T>::name << ": float bits " << float_bits << " (" << x << ") -> "
                                        << ours << ", nearest-even is " << expected);
    }
  }
};

}  // namespace

TEMPLATE_TEST_CASE("RNE matches the nearest-value reference around every tie",
                   "[formats][rne]", bf16, fp16, fp8_e4m3, fp8_e5m2) {
  const NearestReference<TestType> reference;
  SweepCounter<TestType> sweep{reference};
  const auto& values = reference.values();
  auto rng = slimserve_test::make_rng(11);

  // Pairs of neighbouring values (plus the pair max / one ulp above max): all of them for
  // FP8, the subnormal and top ranges plus a random sample for the 16-bit formats.
  std::vector<std::size_t> pairs;
  const std::size_t num_pairs = values.size();  // pair i = (values[i], values[i + 1])
  for (std::size_t i = 0; i < num_pairs; ++i) {
    const bool small_format = format_traits<TestType>::bits == 8;
    if (small_format || i < 1100 || i + 600 >= num_pairs ||
        std::uniform_int_distribution<int>(0, 31)(rng) == 0) {
      pairs.push_back(i);
    }
  }
  const int window = format_traits<TestType>::bits == 8 ? 384 : 32;
  for (std::size_t i : pairs) {
    const double lo = values[i];
    const double hi = i + 1 < values.size() ? values[i + 1] : lo + (lo - values[i - 1]);
    const double mid = (lo + hi) / 2;  // exact: a float32 for every format here
    for (double centre : {lo, mid}) {
      const auto c = bits_of(static_cast<float>(centre));
      for (int d = -window; d <= window; ++d) {
        const auto bits = static_cast<std::uint32_t>(static_cast<std::int64_t>(c) + d);
        if ((bits & 0x7FFFFFFFu) > 0x7F800000u || (c == 0 && d < 0)) continue;
        sweep.check(bits);
        sweep.check(bits | 0x80000000u);
      }
    }
  }
  CHECK(sweep.failures == 0);
  CHECK(sweep.checked > 50000);
}

TEMPLATE_TEST_CASE("RNE matches the reference on every float32 of a random binade",
                   "[formats][rne]", fp8_e4m3, fp8_e5m2, fp16, bf16) {
  const NearestReference<TestType> reference;
  SweepCounter<TestType> sweep{reference};
  auto rng = slimserve_test::make_rng(12);
  // A binade inside the format's range, from its subnormals to just past its maximum.
  const int low_exponent = static_cast<int>(std::ilogb(format_traits<TestType>::min_subnormal)) - 1;
  const int high_exponent = static_cast<int>(std::ilogb(format_traits<TestType>::max_finite)) + 1;
  const int exponent = std::uniform_int_distribution<int>(std::max(low_exponent, -126),
                                                          std::min(high_exponent, 127))(rng);
  INFO("binade 2^" << exponent);
  const std::uint32_t first = static_cast<std::uint32_t>(exponent + 127) << 23;
  // An eighth of the binade for FP8, 1/32 for the 16-bit ones (random offset).
  const std::uint32_t stride = format_traits<TestType>::bits == 8 ? 8u : 32u;
  const std::uint32_t offset = std::uniform_int_distribution<std::uint32_t>(0, stride - 1)(rng);
  for (std::uint32_t m = offset; m < (1u << 23); m += stride) sweep.check(first | m);
  CHECK(sweep.failures == 0);
}

TEMPLATE_TEST_CASE("RNE matches the reference over a stride of all 2^32 float32 patterns",
                   "[formats][rne]", bf16, fp16, fp8_e4m3, fp8_e5m2) {
  const NearestReference<TestType> reference;
  SweepCounter<TestType> sweep{reference};
  auto rng = slimserve_test::make_rng(13);
  const std::uint64_t stride = 16381;  // prime: every mantissa low-bit pattern gets visited
  const std::uint64_t start = std::uniform_int_distribution<std::uint64_t>(0, stride - 1)(rng);
  for (std::uint64_t bits = start; bits < (1ull << 32); bits += stride) {
    sweep.check(static_cast<std::uint32_t>(bits));
  }
  CHECK(sweep.failures == 0);
  CHECK(sweep.checked > 250000);
}
