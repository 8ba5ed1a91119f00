// Packed FP8 conversions against brute-force references: decoding every one of the 256 codes,
// and encoding chosen and random floats by searching all finite codes for the nearest value
// (ties to the even code); and the packed fp16 multiply the FP8 widening scales codes with,
// against the exact product rounded by a search over all fp16 values. KERNEL: on a GPU this
// checks the PTX cvt and mul.rn.f16x2 instructions the same way.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "slimserve/arch/f16x2_math.cuh"
#include "slimserve/arch/fp8_convert.cuh"
#include "slimserve/arch/fp8x4_convert.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "support/random.hpp"

namespace rt = slimserve::rt;
namespace arch = slimserve::arch;

namespace {

__global__ void decode_kernel(std::uint32_t* __restrict__ e4m3,  // [128]: codes 2i, 2i+1
                              std::uint32_t* __restrict__ e5m2)  // [128]
{
  const unsigned i = threadIdx.x;
  const auto pair = static_cast<std::uint16_t>((2 * i) | (2 * i + 1) << 8);
  e4m3[i] = arch::cvt_e4m3x2_to_f16x2(pair);
  e5m2[i] = arch::cvt_e5m2x2_to_f16x2(pair);
}

// Thread i: the word of codes i, i + 1, i + 2, i + 3 (mod 256, byte 0 first) through the
// four-code conversion, and its two 16-bit pairs through the two-code one.
__global__ void decode4_kernel(std::uint32_t* __restrict__ quad,   // [256][2 formats][2]
                               std::uint32_t* __restrict__ pairs)  // [256][2 formats][2]
{
  const unsigned i = threadIdx.x;
  std::uint32_t word = 0;
  for (unsigned b = 0; b < 4; ++b) word |= ((i + b) & 0xFFu) << (8 * b);
  std::uint32_t* q = quad + 4 * i;
  std::uint32_t* p = pairs + 4 * i;
  arch::cvt_e4m3x4_to_f16x2x2(word, q[0], q[1]);
  arch::cvt_e5m2x4_to_f16x2x2(word, q[2], q[3]);
  p[0] = arch::cvt_e4m3x2_to_f16x2(static_cast<std::uint16_t>(word & 0xFFFFu));
  p[1] = arch::cvt_e4m3x2_to_f16x2(static_cast<std::uint16_t>(word >> 16));
  p[2] = arch::cvt_e5m2x2_to_f16x2(static_cast<std::uint16_t>(word & 0xFFFFu));
  p[3] = arch::cvt_e5m2x2_to_f16x2(static_cast<std::uint16_t>(word >> 16));
}

__global__ void encode_kernel(const float* __restrict__ in,  // [2n]
                              std::uint16_t* __restrict__ e4m3, std::uint16_t* __restrict__ e5m2,
                              int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  e4m3[i] = arch::cvt_f32x2_to_e4m3x2(in[2 * i], in[2 * i + 1]);
  e5m2[i] = arch::cvt_f32x2_to_e5m2x2(in[2 * i], in[2 * i + 1]);
}

__global__ void multiply_kernel(const std::uint32_t* __restrict__ a, const std::uint32_t* __restrict__ b,
                                std::uint32_t* __restrict__ d, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  d[i] = arch::mul_rn_f16x2(a[i], b[i]);
}

struct Format {
  int exponent_bits, mantissa_bits, bias;
  bool has_inf;  // e5m2: IEEE-style specials; e4m3fn: only S.1111.111 is NaN
};
constexpr Format e4m3{4, 3, 7, false};
constexpr Format e5m2{5, 2, 15, true};

bool is_nan_code(unsigned code, const Format& f) {
  const unsigned magnitude = code & 0x7Fu;
  if (!f.has_inf) return magnitude == 0x7F;
  return (magnitude >> f.mantissa_bits) == 0x1Fu && (magnitude & 3u) != 0;
}
bool is_inf_code(unsigned code, const Format& f) {
  return f.has_inf && (code & 0x7Fu) == 0x7Cu;
}
// Value of a finite code by the textbook formula.
double code_value(unsigned code, const Format& f) {
  const unsigned magnitude = code & 0x7Fu;
  const int e = static_cast<int>(magnitude >> f.mantissa_bits);
  const double m = static_cast<double>(magnitude & ((1u << f.mantissa_bits) - 1u)) /
                   static_cast<double>(1u << f.mantissa_bits);
  const double v = e == 0 ? std::ldexp(m, 1 - f.bias) : std::ldexp(1.0 + m, e - f.bias);
  return (code & 0x80u) ? -v : v;
}
float f16_to_float(std::uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const double m = (h & 0x3FF) / 1024.0;
  double v = e == 0 ? std::ldexp(m, -14) : (e == 31 ? (m == 0 ? INFINITY : NAN)
                                                     : std::ldexp(1.0 + m, e - 15));
  return static_cast<float>((h & 0x8000) ? -v : v);
}
// Nearest finite code, ties to the even code; beyond the range: the largest finite code.
unsigned encode_reference(float x, const Format& f) {
  unsigned best = 0;
  double best_error = INFINITY;
  const double target = std::fabs(static_cast<double>(x));
  for (unsigned code = 0; code < 0x80; ++code) {
    if (is_nan_code(code, f) || is_inf_code(code, f)) continue;
    if (std::isinf(target)) {  // saturates: the largest finite code
      best = code;
      continue;
    }
    const double error = std::fabs(code_value(code, f) - target);
    if (error < best_error || (error == best_error && (code & 1u) == 0)) {
      best = code;
      best_error = error;
    }
  }
  return (std::signbit(x) ? 0x80u : 0u) | best;
}

}  // namespace

TEST_CASE("fp8x2 -> f16x2 decodes all 256 codes exactly", "[emu][arch]") {
  auto d_e4m3 = rt::DeviceBuffer<std::uint32_t>::create(128);
  auto d_e5m2 = rt::DeviceBuffer<std::uint32_t>::create(128);
  REQUIRE((d_e4m3.ok() && d_e5m2.ok()));
  REQUIRE(d_e4m3->fill_bytes(0xAB).ok());
  REQUIRE(d_e5m2->fill_bytes(0xAB).ok());
  const slimserve::Status status = rt::launch(&decode_kernel, {dim3(1), dim3(128), 0, nullptr},
                                              d_e4m3->data(), d_e5m2->data());
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<std::uint32_t> got_e4m3(128), got_e5m2(128);
  REQUIRE(d_e4m3->download(got_e4m3).ok());
  REQUIRE(d_e5m2->download(got_e5m2).ok());
  for (unsigned code = 0; code < 256; ++code) {
    INFO("code " << code);
    const int shift = (code % 2) * 16;
    for (int which = 0; which < 2; ++which) {
      const Format& f = which == 0 ? e4m3 : e5m2;
      const auto half = static_cast<std::uint16_t>(
          (which == 0 ? got_e4m3 : got_e5m2)[code / 2] >> shift);
      const float value = f16_to_float(half);
      if (is_nan_code(code, f)) {
        CHECK(std::isnan(value));
      } else if (is_inf_code(code, f)) {
        CHECK(value == ((code & 0x80u) ? -INFINITY : INFINITY));
      } else {
        CHECK(static_cast<double>(value) == code_value(code, f));
        CHECK(std::signbit(value) == ((code & 0x80u) != 0));
      }
    }
  }
}

TEST_CASE("fp8x4 -> two f16x2: every code in every byte position, as the pair conversions", "[emu][arch]") {
  auto d_quad = rt::DeviceBuffer<std::uint32_t>::create(256 * 4);
  auto d_pairs = rt::DeviceBuffer<std::uint32_t>::create(256 * 4);
  REQUIRE((d_quad.ok() && d_pairs.ok()));
  REQUIRE(d_quad->fill_bytes(0xAB).ok());
  REQUIRE(d_pairs->fill_bytes(0xCD).ok());
  const slimserve::Status status = rt::launch(&decode4_kernel, {dim3(1), dim3(256), 0, nullptr},
                                              d_quad->data(), d_pairs->data());
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<std::uint32_t> quad(256 * 4), pairs(256 * 4);
  REQUIRE(d_quad->download(quad).ok());
  REQUIRE(d_pairs->download(pairs).ok());
  for (unsigned i = 0; i < 256; ++i) {
    for (unsigned b = 0; b < 4; ++b) {
      const unsigned code = (i + b) & 0xFFu;
      INFO("word " << i << " byte " << b << " code " << code);
      for (int which = 0; which < 2; ++which) {
        const Format& f = which == 0 ? e4m3 : e5m2;
        const std::uint32_t got = quad[4 * i + 2 * which + b / 2];
        CHECK(got == pairs[4 * i + 2 * which + b / 2]);
        const float value = f16_to_float(static_cast<std::uint16_t>(got >> (16 * (b % 2))));
        if (is_nan_code(code, f)) {
          CHECK(std::isnan(value));
        } else if (is_inf_code(code, f)) {
          CHECK(value == ((code & 0x80u) ? -INFINITY : INFINITY));
        } else {
          CHECK(static_cast<double>(value) == code_value(code, f));
        }
      }
    }
  }
}

TEST_CASE("f32x2 -> fp8x2 rounds to nearest even and saturates", "[emu][arch]") {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, 448.0f, 449.0f, 464.0f, 465.0f,
                               1.0e6f, -1.0e6f, 57344.0f, 61439.0f, 61440.0f, 1.0e9f,
                               INFINITY, -INFINITY,
                               1.0625f,   // e4m3 tie between 1.0 and 1.125 -> 1.0 (even)
                               1.1875f,   // tie between 1.125 and 1.25 -> 1.25 (even)
                               1.125f,    // e5m2 tie between 1.0 and 1.25 -> 1.0
                               0x1p-10f,  // e4m3 tie between 0 and the smallest subnormal
                               0x1p-9f * 1.5f, 0x1p-17f, 0x1p-16f * 1.5f, 0x1p-6f, 0x1p-7f,
                               240.0f, 232.0f, 3.0e-3f};
  auto rng = slimserve_test::make_rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 17);
  while (values.size() < 256) values.push_back(std::ldexp(normal(rng), exponent(rng)));
  const int n = static_cast<int>(values.size() / 2);

  auto d_in = rt::DeviceBuffer<float>::create(values.size());
  auto d_e4m3 = rt::DeviceBuffer<std::uint16_t>::create(n);
  auto d_e5m2 = rt::DeviceBuffer<std::uint16_t>::create(n);
  REQUIRE((d_in.ok() && d_e4m3.ok() && d_e5m2.ok()));
  REQUIRE(d_in->upload(values).ok());
  REQUIRE(d_e4m3->fill_bytes(0xAB).ok());
  REQUIRE(d_e5m2->fill_bytes(0xAB).ok());
  const slimserve::Status status =
      rt::launch(&encode_kernel, {dim3(2), dim3(64), 0, nullptr}, d_in->data(), d_e4m3->data(),
                 d_e5m2->data(), n);
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<std::uint16_t> got_e4m3(n), got_e5m2(n);
  REQUIRE(d_e4m3->download(got_e4m3).ok());
  REQUIRE(d_e5m2->download(got_e5m2).ok());
  for (std::size_t i = 0; i < values.size(); ++i) {
    INFO("value " << values[i] << " (index " << i << ")");
    const unsigned shift = (i % 2) * 8;
    CHECK(((got_e4m3[i / 2] >> shift) & 0xFFu) == encode_reference(values[i], e4m3));
    CHECK(((got_e5m2[i / 2] >> shift) & 0xFFu) == encode_reference(values[i], e5m2));
  }
}

TEST_CASE("NaN converts to an fp8 NaN", "[emu][arch]") {
  const std::vector<float> values = {std::numeric_limits<float>::quiet_NaN(), 1.0f};
  auto d_in = rt::DeviceBuffer<float>::create(2);
  auto d_e4m3 = rt::DeviceBuffer<std::uint16_t>::create(1);
  auto d_e5m2 = rt::DeviceBuffer<std::uint16_t>::create(1);
  REQUIRE((d_in.ok() && d_e4m3.ok() && d_e5m2.ok()));
  REQUIRE(d_in->upload(values).ok());
  REQUIRE(rt::launch(&encode_kernel, {dim3(1), dim3(32), 0, nullptr}, d_in->data(),
                     d_e4m3->data(), d_e5m2->data(), 1)
              .ok());
  std::vector<std::uint16_t> got_e4m3(1), got_e5m2(1);
  REQUIRE(d_e4m3->download(got_e4m3).ok());
  REQUIRE(d_e5m2->download(got_e5m2).ok());
  CHECK(is_nan_code(got_e4m3[0] & 0xFFu, e4m3));
  CHECK(is_nan_code(got_e5m2[0] & 0xFFu, e5m2));
  CHECK((got_e4m3[0] >> 8) == 0x38u);  // 1.0
  CHECK((got_e5m2[0] >> 8) == 0x3Cu);
}

TEST_CASE("mul.rn.f16x2 rounds the exact product once, to nearest even", "[emu][arch]") {
  // Operands: normal and subnormal halves, products that are exact, round, tie, go subnormal,
  // underflow to zero and overflow to infinity; both halves of each register differ.
  auto rng = slimserve_test::make_rng(9001);
  std::uniform_int_distribution<unsigned> finite_half(0, 0x7BFF), sign(0, 1);
  const std::vector<std::uint16_t> chosen = {0x3C00, 0x3C01, 0x4000, 0x7BFF, 0x0001, 0x0400, 0x3800,
                                             0x5BFF, 0x5C00, 0x1000, 0x0200, 0x3555, 0x3E00};
  std::vector<std::uint16_t> halves_a, halves_b;
  for (const std::uint16_t x : chosen) {
    for (const std::uint16_t y : chosen) {
      halves_a.push_back(x);
      halves_b.push_back(static_cast<std::uint16_t>(y | 0x8000u * (x & 1u)));
    }
  }
  for (int i = 0; i < 400; ++i) {
    halves_a.push_back(static_cast<std::uint16_t>(finite_half(rng) | (sign(rng) << 15)));
    halves_b.push_back(static_cast<std::uint16_t>(finite_half(rng) | (sign(rng) << 15)));
  }
  if (halves_a.size() % 2) {
    halves_a.push_back(0x3C00);
    halves_b.push_back(0x3C00);
  }
  const int n = static_cast<int>(halves_a.size() / 2);
  std::vector<std::uint32_t> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = halves_a[2 * i] | std::uint32_t{halves_a[2 * i + 1]} << 16;
    b[i] = halves_b[2 * i] | std::uint32_t{halves_b[2 * i + 1]} << 16;
  }
  auto d_a = rt::DeviceBuffer<std::uint32_t>::create(a.size());
  auto d_b = rt::DeviceBuffer<std::uint32_t>::create(b.size());
  auto d_d = rt::DeviceBuffer<std::uint32_t>::create(a.size());
  REQUIRE((d_a.ok() && d_b.ok() && d_d.ok()));
  REQUIRE(d_a->upload(a).ok());
  REQUIRE(d_b->upload(b).ok());
  REQUIRE(d_d->fill_bytes(0xAB).ok());
  const slimserve::Status status =
      rt::launch(&multiply_kernel, {dim3(static_cast<unsigned>((n + 127) / 128)), dim3(128), 0, nullptr},
                 d_a->data(), d_b->data(), d_d->data(), n);
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<std::uint32_t> got(a.size());
  REQUIRE(d_d->download(got).ok());
  // Every finite non-negative half, by value (increasing with the bits).
  std::vector<double> magnitudes;
  for (unsigned h = 0; h <= 0x7BFF; ++h) magnitudes.push_back(static_cast<double>(f16_to_float(static_cast<std::uint16_t>(h))));
  for (std::size_t i = 0; i < 2 * a.size(); ++i) {
    const std::uint16_t x = halves_a[i], y = halves_b[i];
    const double product = static_cast<double>(f16_to_float(x)) * static_cast<double>(f16_to_float(y));  // exact
    const auto result = static_cast<std::uint16_t>(got[i / 2] >> (16 * (i % 2)));
    INFO("halves " << x << " x " << y << " = " << product << ", got bits " << result);
    const double target = std::fabs(product);
    unsigned want = 0x7C00;  // overflow: at or past 65504 + half an ulp (2^15 x (2 - 2^-11))
    if (target < 65520.0) {
      // Nearest by value, ties to the even significand (the even bit pattern).
      const auto above = std::lower_bound(magnitudes.begin(), magnitudes.end(), target);
      const auto hi = static_cast<unsigned>(above - magnitudes.begin());
      want = hi;
      if (hi == magnitudes.size()) {
        want = hi - 1;  // between 65504 and the overflow threshold: the largest finite half
      } else if (hi > 0 && magnitudes[hi] != target) {
        const double below_error = target - magnitudes[hi - 1], above_error = magnitudes[hi] - target;
        if (below_error < above_error || (below_error == above_error && ((hi - 1) & 1u) == 0)) want = hi - 1;
      }
    }
    const unsigned sign_bit = ((x ^ y) & 0x8000u);
    CHECK(result == (want | sign_bit));
  }
}
