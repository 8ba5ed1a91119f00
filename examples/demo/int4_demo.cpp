// INT4 part of the demo: quantize a random BF16 weight, run the W4A16 GEMM (on the CPU
// emulator in this build) and compare with the BF16 GEMM.
#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "slimserve/int4/gemm.hpp"
#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/int4/quantize.hpp"
#include "slimserve/int4/quantized_matrix.hpp"
#include "slimserve/int4/tensor.hpp"
#include "slimserve/runtime/memory.hpp"

namespace {

using namespace slimserve;
using namespace slimserve::int4;

template <class T>
rt::DeviceBuffer<T> upload(const std::vector<T>& host) {
  auto buffer = rt::DeviceBuffer<T>::create(host.size());
  if (!buffer.ok() || !buffer->upload(host).ok()) return {};
  return std::move(buffer).value();
}

}  // namespace

int demo_int4() {
  constexpr std::int64_t m = 4;
  constexpr std::int64_t k = 512;
  constexpr std::int64_t n = 256;
  constexpr std::int64_t group_size = 128;
  constexpr ActivationType type = ActivationType::bf16;
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 0.02f);

  // BF16 weight [k, n] and activations [m, k].
  Tensor weight(ElementType::bfloat16, {k, n});
  std::vector<float> w(static_cast<std::size_t>(k * n));
  for (std::size_t i = 0; i < w.size(); ++i) {
    const std::uint16_t bits = to_activation_bits(type, normal(rng));
    w[i] = activation_to_float(type, bits);
    std::memcpy(weight.bytes.data() + 2 * i, &bits, sizeof(bits));
  }
  std::vector<std::uint16_t> a(static_cast<std::size_t>(m * k));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (auto& v : a) v = to_activation_bits(type, uniform(rng));

  // The library's quantizer (round to nearest, symmetric, group 128), then the GEMM layout.
  QuantizeOptions options;
  options.group_size = group_size;
  options.symmetric = true;
  Result<QuantizedMatrix> quantized = quantize(weight.view(), WeightLayout::k_by_n, options);
  if (!quantized.ok()) {
    fmt::print("int4: quantize failed: {}\n", quantized.status().to_string());
    return 1;
  }
  Result<GemmWeights> packed = repack_for_gemm(*quantized, type);
  if (!packed.ok()) {
    fmt::print("int4: repack failed: {}\n", packed.status().to_string());
    return 1;
  }
  auto d_a = upload(a);
  auto d_b = upload(packed->packed);
  auto d_scales = upload(packed->scales);
  auto d_c = rt::DeviceBuffer<std::uint16_t>::create(static_cast<std::size_t>(m * n));
  if (!d_c.ok()) return 1;

  GemmArguments args;
  args.activation = type;
  args.m = m;
  args.n = n;
  args.k = k;
  args.group_size = group_size;
  args.a = d_a.data();
  args.b = d_b.data();
  args.scales = d_scales.data();
  args.c = d_c->data();
  Result<GemmPlan> plan = plan_gemm(args);
  if (!plan.ok()) {
    fmt::print("int4: plan failed: {}\n", plan.status().to_string());
    return 1;
  }
  auto workspace = rt::DeviceBuffer<unsigned char>::create(plan->workspace_bytes());
  if (!workspace.ok()) return 1;
  Status status = run_gemm(args, *plan, workspace->data(), workspace->size_bytes(), nullptr);
  std::vector<std::uint16_t> c(static_cast<std::size_t>(m * n));
  if (status.ok()) status = d_c->download(c);
  if (status.ok()) status = rt::stream_synchronize(nullptr);
  if (!status.ok()) {
    fmt::print("int4: GEMM failed: {}\n", status.to_string());
    return 1;
  }

  // Error of the W4A16 result against the BF16-weight GEMM (computed in FP64).
  double error_sq = 0.0;
  double reference_sq = 0.0;
  double max_error = 0.0;
  for (std::int64_t row = 0; row < m; ++row) {
    for (std::int64_t col = 0; col < n; ++col) {
      double reference = 0.0;
      for (std::int64_t i = 0; i < k; ++i) {
        reference += static_cast<double>(activation_to_float(type, a[static_cast<std::size_t>(row * k + i)])) *
                     w[static_cast<std::size_t>(i * n + col)];
      }
      const double got = activation_to_float(type, c[static_cast<std::size_t>(row * n + col)]);
      error_sq += (got - reference) * (got - reference);
      reference_sq += reference * reference;
      max_error = std::max(max_error, std::fabs(got - reference));
    }
  }
  fmt::print(
      "int4: W4A16 GEMM m={} n={} k={} (group {}, symmetric, {} path, {}): relative "
      "error vs BF16 weights {:.4f}, max abs error {:.5f}\n",
      m, n, k, group_size, plan->path == GemmPath::fused ? "fused" : "expansion",
      plan->schedule == GemmSchedule::stream_k
          ? fmt::format("stream-K over {} blocks", plan->stream_k_blocks)
          : fmt::format("{} split(s)", plan->splits),
      std::sqrt(error_sq / reference_sq), max_error);
  return 0;
}
