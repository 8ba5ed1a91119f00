// NaN-propagating FP32 min/max (arch::min_nan / max_nan: PTX min.NaN.f32 / max.NaN.f32) and
// the clamp built from them, against the IEEE 754-2019 minimum / maximum written out here from
// comparisons: the canonical NaN (0x7FFFFFFF) when either operand is NaN (any payload, either
// sign), -0.0 below +0.0, otherwise the smaller / larger operand; every result compared by its
// bits. Operands: NaNs, infinities, signed zeros, subnormals, the largest finite values and
// random floats, every pair in both orders. KERNEL: on a GPU this checks the instructions.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "slimserve/arch/float_minmax.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "support/random.hpp"

namespace rt = slimserve::rt;
namespace arch = slimserve::arch;

namespace {

__global__ void minmax_kernel(const float* __restrict__ a, const float* __restrict__ b,  // [n]
                              float* __restrict__ out,  // [n][3]: max, min, clamp(a, |b|)
                              int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  out[3 * i] = arch::max_nan(a[i], b[i]);
  out[3 * i + 1] = arch::min_nan(a[i], b[i]);
  out[3 * i + 2] = arch::clamp_keep_nan(a[i], 65504.0f);
}

constexpr std::uint32_t canonical_nan = 0x7FFFFFFFu;

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

std::uint32_t maximum_reference(float a, float b) {
  if (a != a || b != b) return canonical_nan;
  if (a > b) return bits(a);
  if (b > a) return bits(b);
  return bits(a) & bits(b);  // equal: the same bits, or +0 and -0, of which +0
}

std::uint32_t minimum_reference(float a, float b) {
  if (a != a || b != b) return canonical_nan;
  if (a < b) return bits(a);
  if (b < a) return bits(b);
  return bits(a) | bits(b);  // equal: -0 of +0 and -0
}

std::uint32_t clamp_reference(float x) {
  if (x != x) return canonical_nan;
  if (x > 65504.0f) return bits(65504.0f);
  if (x < -65504.0f) return bits(-65504.0f);
  return bits(x);
}

}  // namespace

TEST_CASE("min.NaN / max.NaN: IEEE 754-2019 minimum and maximum, bit for bit; the clamp keeps NaN", "[emu][arch]") {
  auto rng = slimserve_test::make_rng(9101);
  std::vector<float> values = {
      std::bit_cast<float>(0x7FC00000u), std::bit_cast<float>(0xFFC00000u),  // quiet NaNs, both signs
      std::bit_cast<float>(0x7F800001u), std::bit_cast<float>(0x7FC12345u),  // other payloads
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
      0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
      std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 65504.0f, -65504.0f,
      65504.0f * 1.0001f, -65520.0f, 1.0f, -1.0f, 3.5f};
  std::uniform_int_distribution<std::uint32_t> any_finite(0, 0x7F7FFFFFu), sign(0, 1);
  for (int i = 0; i < 24; ++i) values.push_back(std::bit_cast<float>(any_finite(rng) | sign(rng) << 31));
  std::normal_distribution<float> normal(0.0f, 4e4f);  // around the clamp's limit
  for (int i = 0; i < 12; ++i) values.push_back(normal(rng));
  std::vector<float> a, b;
  for (const float x : values) {
    for (const float y : values) {
      a.push_back(x);
      b.push_back(y);
    }
  }
  const int n = static_cast<int>(a.size());
  auto d_a = rt::DeviceBuffer<float>::create(a.size());
  auto d_b = rt::DeviceBuffer<float>::create(b.size());
  auto d_out = rt::DeviceBuffer<float>::create(3 * a.size());
  REQUIRE((d_a.ok() && d_b.ok() && d_out.ok()));
  REQUIRE(d_a->upload(a).ok());
  REQUIRE(d_b->upload(b).ok());
  REQUIRE(d_out->fill_bytes(0xAB).ok());
  const slimserve::Status status =
      rt::launch(&minmax_kernel, {dim3(static_cast<unsigned>((n + 127) / 128)), dim3(128), 0, nullptr},
                 d_a->data(), d_b->data(), d_out->data(), n);
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<float> got(3 * a.size());
  REQUIRE(d_out->download(got).ok());
  std::size_t wrong = 0, nan_results = 0, clamped = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::uint32_t want[3] = {maximum_reference(a[i], b[i]), minimum_reference(a[i], b[i]), clamp_reference(a[i])};
    for (int k = 0; k < 3; ++k) {
      const std::uint32_t result = bits(got[3 * i + static_cast<std::size_t>(k)]);
      if (result != want[k]) {
        ++wrong;
        UNSCOPED_INFO("op " << k << " of bits " << bits(a[i]) << ", " << bits(b[i]) << ": got " << result
                            << ", want " << want[k]);
      }
      nan_results += want[k] == canonical_nan;
    }
    clamped += std::fabs(a[i]) > 65504.0f;
  }
  CHECK(wrong == 0);
  CHECK(nan_results > values.size());  // the NaN cases are there
  CHECK(clamped > 0);
}
