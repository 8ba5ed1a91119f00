#pragma once
// Runs the W4A16 GEMM façade on random inputs and compares every output element with an FP64
// reference built from the already-quantized weights (kernel tests: rt:: and the façade only).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "gemm_test_matrices.hpp"
#include "slimserve/int4/gemm.hpp"
#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/runtime/memory.hpp"

namespace slimserve_test {

struct GemmCase {
  MatrixSpec weights;
  std::int64_t m;
  bool bias;
  slimserve::int4::GemmOptions options;
};

/// Elements written past the end of C are caught by this many poisoned guard elements.
inline constexpr std::size_t c_guard = 64;

/// Uploads a host vector into a fresh device buffer (REQUIREs success).
template <class T>
slimserve::rt::DeviceBuffer<T> to_device(const std::vector<T>& host, std::size_t extra = 0) {
  auto buffer = slimserve::rt::DeviceBuffer<T>::create(host.size() + extra);
  REQUIRE(buffer.ok());
  if (extra != 0) REQUIRE(buffer->fill_bytes(0xFF).ok());
  REQUIRE(buffer->upload(host).ok());
  return std::move(buffer).value();
}

/// Random activation-type values in [-1, 1] (never all zero).
inline std::vector<std::uint16_t> random_activations(slimserve::int4::ActivationType type,
                                                     std::size_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<std::uint16_t> out(count);
  for (auto& v : out) v = slimserve::int4::to_activation_bits(type, value(rng));
  return out;
}

/// Runs one case and checks all m x n outputs; returns the plan it ran.
inline slimserve::int4::GemmPlan run_and_check(const GemmCase& test, std::mt19937_64& rng) {
  using namespace slimserve;
  using namespace slimserve::int4;
  const MatrixSpec& spec = test.weights;
  const ActivationType type = spec.activation;
  const std::int64_t m = test.m;
  const std::int64_t n = spec.n;
  const std::int64_t k = spec.k;
  CAPTURE(m, n, k, spec.group_size, spec.symmetric, spec.act_order, to_string(type), test.bias,
          test.options.split_k, static_cast<int>(test.options.path),
          static_cast<int>(test.options.schedule), test.options.sm_count);

  const QuantizedMatrix matrix = random_quantized_matrix(spec, rng);
  Result<GemmWeights> packed = repack_for_gemm(matrix, type);
  REQUIRE(packed.ok());
  const std::vector<std::uint16_t> a = random_activations(type, static_cast<std::size_t>(m * k), rng);
  const std::vector<std::uint16_t> bias =
      test.bias ? random_activations(type, static_cast<std::size_t>(n), rng) : std::vector<std::uint16_t>{};

  // Act-order: the kernel wants A's columns in the packed row order (gathered on the device).
  auto d_a = to_device(a);
  auto d_a_gathered = rt::DeviceBuffer<std::uint16_t>::create(a.size());
  REQUIRE(d_a_gathered.ok());
  if (!packed->k_order.empty()) {
    auto d_order = to_device(packed->k_order);
    REQUIRE(d_a_gathered->fill_bytes(0xFF).ok());
    const Status gathered =
        gather_activation_columns(d_a.data(), d_order.data(), d_a_gathered->data(), m, k, nullptr);
    INFO(gathered.to_string());
    REQUIRE(gathered.ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
  }
  auto d_b = to_device(packed->packed);
  auto d_scales = to_device(packed->scales);
  auto d_zeros = to_device(packed->zeros);
  auto d_bias = to_device(bias);
  auto d_c = rt::DeviceBuffer<std::uint16_t>::create(static_cast<std::size_t>(m * n) + c_guard);
  REQUIRE(d_c.ok());
  REQUIRE(d_c->fill_bytes(0xFF).ok());  // poison: NaN in both types

  GemmArguments args;
  args.activation = type;
  args.m = m;
  args.n = n;
  args.k = k;
  args.group_size = spec.group_size;
  args.a = packed->k_order.empty() ? d_a.data() : d_a_gathered->data();
  args.b = d_b.data();
  args.scales = d_scales.data();
  args.zeros = packed->zeros.empty() ? nullptr : d_zeros.data();
  args.bias = test.bias ? d_bias.data() : nullptr;
  args.c = d_c->data();
  Result<GemmPlan> plan = plan_gemm(args, test.options);
  REQUIRE(plan.ok());
  // 16 bytes more than planned: the second run uses a workspace that is only 16-byte aligned
  // (the stream-K slots must still start on a 128-byte L2 line: the emulated discard checks).
  constexpr std::size_t misalignment = 16;
  auto workspace = rt::DeviceBuffer<unsigned char>::create(plan->workspace_bytes() + misalignment);
  REQUIRE(workspace.ok());
  REQUIRE(workspace->fill_bytes(0xFF).ok());  // a reduce that reads unwritten partials fails
  const Status status = run_gemm(args, *plan, workspace->data(), plan->workspace_bytes(), nullptr);
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<std::uint16_t> c(static_cast<std::size_t>(m * n) + c_guard);
  REQUIRE(d_c->download(c).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());

  // Deterministic: a second run over re-poisoned C and workspace gives the same bits (split-K
  // and stream-K partials are added in a fixed order), wherever the workspace starts.
  REQUIRE(d_c->fill_bytes(0xFF).ok());
  REQUIRE(workspace->fill_bytes(0xFF).ok());
  const Status again = run_gemm(args, *plan, workspace->data() + misalignment,
                                plan->workspace_bytes(), nullptr);
  INFO(again.to_string());
  REQUIRE(again.ok());
  std::vector<std::uint16_t> c_again(c.size());
  REQUIRE(d_c->download(c_again).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  CHECK(c_again == c);

  // FP64 reference from the kernel's own weights (bit-exact, see the dequant test) and A as
  // given: round_T((q - z) s) where the plan scales every weight, (q - z) s exactly where it
  // scales each group's sum. The products a * w (or a * (q - z)) are exact in FP32 too, so the
  // kernel differs only by FP32 summation and the scaling of group sums (at most
  // ~(k + k / group + splits) * 2^-24 * sum |a w| in any order, with slack for the tensor
  // core's internal order) and the final rounding of a perturbed value to T (1 ulp).
  if (plan->path == GemmPath::expand) REQUIRE(plan->scaling == GroupScaling::per_weight);
  std::vector<double> w(static_cast<std::size_t>(k * n));
  for (std::int64_t row = 0; row < k; ++row) {
    for (std::int64_t col = 0; col < n; ++col) {
      const std::int64_t group = matrix.group_of_row(row);
      const auto at = static_cast<std::size_t>(gemm_layout::scale_index(group, col, n));
      w[static_cast<std::size_t>(row * n + col)] = model_weight(
          type, plan->scaling, matrix.code(row, col), matrix.zeros[at], packed->scales[at]);
    }
  }
  const int mantissa_bits = type == ActivationType::bf16 ? 7 : 10;
  const double min_normal = type == ActivationType::bf16 ? 1.1754943508222875e-38 : 6.103515625e-05;
  // FP32 partial sums added after the mainloop: split-K slices or stream-K blocks sharing a tile.
  const int partial_sums =
      plan->schedule == GemmSchedule::stream_k ? plan->stream_k_blocks : plan->splits;
  int mismatches = 0;
  for (std::int64_t row = 0; row < m; ++row) {
    for (std::int64_t col = 0; col < n; ++col) {
      double sum = test.bias ? activation_to_float(type, bias[static_cast<std::size_t>(col)]) : 0.0;
      double magnitude = std::fabs(sum);
      for (std::int64_t i = 0; i < k; ++i) {
        const double product = activation_to_float(type, a[static_cast<std::size_t>(row * k + i)]) *
                               w[static_cast<std::size_t>(i * n + col)];
        sum += product;
        magnitude += std::fabs(product);
      }
      const double got = activation_to_float(type, c[static_cast<std::size_t>(row * n + col)]);
      const double ulp = std::ldexp(1.0, std::ilogb(std::fmax(std::fabs(sum), min_normal)) - mantissa_bits);
      const double tolerance = 2.0 * static_cast<double>(k + 2 * partial_sums + 2) * std::ldexp(magnitude, -24) + ulp;
      if (!(std::fabs(got - sum) <= tolerance) && ++mismatches <= 8) {
        UNSCOPED_INFO("C[" << row << ", " << col << "] = " << got << ", reference " << sum
                           << ", tolerance " << tolerance);
      }
    }
  }
  CHECK(mismatches == 0);
  for (std::size_t i = 0; i < c_guard; ++i) {
    REQUIRE(c[static_cast<std::size_t>(m * n) + i] == 0xFFFF);  // nothing written past C
  }
  return *plan;
}

}  // namespace slimserve_test
