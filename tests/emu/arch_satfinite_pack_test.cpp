// arch::pack_satfinite<fp16 / bf16> (PTX cvt.rn.satfinite.{f16x2,bf16x2}.f32) against the ISA's
// definition, with the rounding written out here: every finite value of the format decoded
// from its bits into a table, the nearest to the input chosen with ties to the even code;
// beyond the largest finite value (infinities included) that value with the input's sign;
// NaN gives a NaN (the ISA names no payload). Both halves of the pair checked, every result
// by its bits. Inputs: NaNs of several payloads and both signs, infinities, signed zeros,
// FP32 subnormals, the formats' largest finite values and their rounding boundaries, the
// smallest fp16 subnormal and the ties around it, and random floats of every magnitude.
// KERNEL: on a GPU this checks the instruction.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "slimserve/arch/satfinite_pack.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "support/random.hpp"

namespace rt = slimserve::rt;
namespace arch = slimserve::arch;

namespace {

__global__ void pack_kernel(const float* __restrict__ lo, const float* __restrict__ hi,  // [n]
                            std::uint32_t* __restrict__ out,                              // [n][2]: fp16x2, bf16x2
                            int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  out[2 * i] = arch::pack_satfinite<slimserve::fp16>(lo[i], hi[i]);
  out[2 * i + 1] = arch::pack_satfinite<slimserve::bf16>(lo[i], hi[i]);
}

/// A 16-bit format's non-negative finite values, by code (index = bits), for the reference.
struct FormatTable {
  std::vector<double> value;
  static FormatTable fp16() {
    FormatTable t;
    for (std::uint32_t bits = 0; bits < 0x7C00u; ++bits) {
      const int exponent = static_cast<int>(bits >> 10), mantissa = static_cast<int>(bits & 0x3FFu);
      t.value.push_back(exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25));
    }
    return t;
  }
  static FormatTable bf16() {
    FormatTable t;
    for (std::uint32_t bits = 0; bits < 0x7F80u; ++bits) t.value.push_back(std::bit_cast<float>(bits << 16));
    return t;
  }
  /// The code of x (not NaN): nearest finite value, ties to the even code, sign kept.
  std::uint16_t nearest(float x) const {
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(static_cast<double>(x));
    if (a >= value.back()) return static_cast<std::uint16_t>(sign | (value.size() - 1));  // saturated
    const auto above = static_cast<std::size_t>(std::upper_bound(value.begin(), value.end(), a) - value.begin());
    std::size_t code = above - 1;  // value[code] <= a < value[above]
    const double below_gap = a - value[code], above_gap = value[above] - a;
    if (above_gap < below_gap || (above_gap == below_gap && above % 2 == 0)) code = above;
    return static_cast<std::uint16_t>(sign | code);
  }
};

bool is_nan16(std::uint16_t bits, unsigned exponent_mask) {
  return (bits & exponent_mask) == exponent_mask && (bits & 0x7FFFu & ~exponent_mask) != 0;
}

}  // namespace

TEST_CASE("cvt.rn.satfinite f16x2 / bf16x2: nearest even, saturated to the finite range, NaN kept", "[emu][arch]") {
  auto rng = slimserve_test::make_rng(9102);
  const FormatTable fp16 = FormatTable::fp16(), bf16 = FormatTable::bf16();
  const float inf = std::numeric_limits<float>::infinity();
  const float bf16_max = std::bit_cast<float>(0x7F7F0000u);
  std::vector<float> values = {
      std::bit_cast<float>(0x7FC00000u), std::bit_cast<float>(0xFFC00000u),  // quiet NaNs, both signs
      std::bit_cast<float>(0x7F800001u), std::bit_cast<float>(0x7FC12345u),  // other payloads
      inf, -inf, 0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
      std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
      65504.0f, -65504.0f, 65519.99f, 65520.0f, -65520.0f, 65536.0f,   // fp16's largest and its boundary
      bf16_max, -bf16_max, std::bit_cast<float>(0x7F7F7FFFu), std::bit_cast<float>(0x7F7F8000u),  // bf16's
      std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -25), std::ldexp(1.5f, -24),  // fp16 subnormal ties
      std::ldexp(1.0f, -14), 1.0f, -1.0f, 3.5f, 1.0f + std::ldexp(1.0f, -11), 1.0f + std::ldexp(3.0f, -11),
      // FP32 subnormals that bf16 keeps (0x00010000, 0x00400000) and its ties (to 0 and to 0x0002)
      std::bit_cast<float>(0x00010000u), std::bit_cast<float>(0x00400000u), std::bit_cast<float>(0x80400000u),
      std::bit_cast<float>(0x00008000u), std::bit_cast<float>(0x00018000u), std::bit_cast<float>(0x00018001u)};
  std::uniform_int_distribution<std::uint32_t> any_finite(0, 0x7F7FFFFFu), sign(0, 1);
  for (int i = 0; i < 200; ++i) values.push_back(std::bit_cast<float>(any_finite(rng) | sign(rng) << 31));
  std::normal_distribution<float> normal(0.0f, 4e4f);  // around fp16's limit
  for (int i = 0; i < 100; ++i) values.push_back(normal(rng));
  std::uniform_real_distribution<float> small(-0.001f, 0.001f);  // fp16 subnormals and small normals
  for (int i = 0; i < 100; ++i) values.push_back(small(rng));
  std::vector<float> lo = values, hi = values;
  std::shuffle(hi.begin(), hi.end(), rng);
  const int n = static_cast<int>(lo.size());
  auto d_lo = rt::DeviceBuffer<float>::create(lo.size());
  auto d_hi = rt::DeviceBuffer<float>::create(hi.size());
  auto d_out = rt::DeviceBuffer<std::uint32_t>::create(2 * lo.size());
  REQUIRE((d_lo.ok() && d_hi.ok() && d_out.ok()));
  REQUIRE(d_lo->upload(lo).ok());
  REQUIRE(d_hi->upload(hi).ok());
  REQUIRE(d_out->fill_bytes(0xAB).ok());
  const slimserve::Status status =
      rt::launch(&pack_kernel, {dim3(static_cast<unsigned>((n + 127) / 128)), dim3(128), 0, nullptr},
                 d_lo->data(), d_hi->data(), d_out->data(), n);
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<std::uint32_t> got(2 * lo.size());
  REQUIRE(d_out->download(got).ok());
  std::size_t wrong = 0, nans = 0, saturated = 0;
  for (std::size_t i = 0; i < lo.size(); ++i) {
    for (int format = 0; format < 2; ++format) {
      const FormatTable& table = format == 0 ? fp16 : bf16;
      const unsigned exponent_mask = format == 0 ? 0x7C00u : 0x7F80u;
      for (int half = 0; half < 2; ++half) {
        const float x = half == 0 ? lo[i] : hi[i];
        const auto result = static_cast<std::uint16_t>(got[2 * i + static_cast<std::size_t>(format)] >> (16 * half));
        bool ok;
        if (std::isnan(x)) {
          ok = is_nan16(result, exponent_mask);
          ++nans;
        } else {
          ok = result == table.nearest(x);
          saturated += std::fabs(static_cast<double>(x)) > table.value.back();
        }
        if (!ok) {
          ++wrong;
          UNSCOPED_INFO((format == 0 ? "fp16" : "bf16") << " half " << half << " of " << x << " (bits "
                                                         << std::bit_cast<std::uint32_t>(x) << "): got " << result);
        }
      }
    }
  }
  CHECK(wrong == 0);
  CHECK(nans >= 16);      // the NaN inputs are there, in both halves and formats
  CHECK(saturated >= 8);  // and values beyond the range
}
