// INT4 mixture-of-experts part of the demo: a small MoE layer (8 experts, top-2) with INT4
// expert weights, run as the grouped W4A16 GEMM twice (gate+up with SiLU.mul, then down with
// the router weights), compared with the same layer on the BF16 weights. This is the compiled
// example that docs/int4-gemm.md refers to.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/int4/moe.hpp"
#include "slimserve/int4/quantize.hpp"
#include "slimserve/int4/tensor.hpp"
#include "slimserve/runtime/memory.hpp"

namespace {

using namespace slimserve;
using namespace slimserve::int4;

template <class T>
rt::DeviceBuffer<T> upload_vector(const std::vector<T>& host) {
  auto buffer = rt::DeviceBuffer<T>::create(host.size());
  if (!buffer.ok() || !buffer->upload(host).ok()) return {};
  return std::move(buffer).value();
}

/// E expert matrices [k, n] in BF16 (kept as floats for the reference), quantized (group
/// `group`, symmetric) and packed per expert, stacked: [E][k/16, n/16, 32] and [E][k/g, n].
struct StackedExperts {
  std::vector<std::vector<float>> weights;  // [E][k * n]
  std::vector<std::uint32_t> packed;
  std::vector<std::uint16_t> scales;
};

Result<StackedExperts> make_experts(int experts, std::int64_t k, std::int64_t n, std::int64_t group,
                                    std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 0.05f);
  StackedExperts out;
  for (int e = 0; e < experts; ++e) {
    Tensor weight(ElementType::bfloat16, {k, n});
    std::vector<float> w(static_cast<std::size_t>(k * n));
    for (std::size_t i = 0; i < w.size(); ++i) {
      const std::uint16_t bits = to_activation_bits(ActivationType::bf16, normal(rng));
      w[i] = activation_to_float(ActivationType::bf16, bits);
      std::memcpy(weight.bytes.data() + 2 * i, &bits, sizeof(bits));
    }
    QuantizeOptions options;
    options.group_size = group;
    options.symmetric = true;
    Result<QuantizedMatrix> quantized = quantize(weight.view(), WeightLayout::k_by_n, options);
    if (!quantized.ok()) return quantized.status();
    Result<GemmWeights> packed = repack_for_gemm(*quantized, ActivationType::bf16);
    if (!packed.ok()) return packed.status();
    out.packed.insert(out.packed.end(), packed->packed.begin(), packed->packed.end());
    out.scales.insert(out.scales.end(), packed->scales.begin(), packed->scales.end());
    out.weights.push_back(std::move(w));
  }
  return out;
}

}  // namespace

int demo_int4_moe() {
  constexpr int experts = 8;
  constexpr std::int64_t top_k = 2;
  constexpr std::int64_t tokens = 6;
  constexpr std::int64_t hidden = 256;
  constexpr std::int64_t intermediate = 128;
  constexpr std::int64_t group = 64;
  constexpr ActivationType type = ActivationType::bf16;
  std::mt19937 rng(7);

  // Expert weights: gate+up [E][hidden, 2 * intermediate] (gate columns first), down
  // [E][intermediate, hidden].
  Result<StackedExperts> gate_up = make_experts(experts, hidden, 2 * intermediate, group, rng);
  Result<StackedExperts> down = make_experts(experts, intermediate, hidden, group, rng);
  if (!gate_up.ok() || !down.ok()) {
    fmt::print("int4 moe: quantize failed\n");
    return 1;
  }

  // Tokens and the router's output: top-2 experts of random logits, softmax weights.
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<std::uint16_t> x(static_cast<std::size_t>(tokens * hidden));
  for (auto& v : x) v = to_activation_bits(type, uniform(rng));
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<float> logits(experts);
    for (auto& l : logits) l = 2.0f * uniform(rng);
    std::vector<std::int32_t> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int a, int b) { return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)]; });
    float total = 0.0f;
    for (std::int64_t s = 0; s < top_k; ++s) total += std::exp(logits[static_cast<std::size_t>(order[static_cast<std::size_t>(s)])]);
    for (std::int64_t s = 0; s < top_k; ++s) {
      const std::int32_t e = order[static_cast<std::size_t>(s)];
      ids.push_back(e);
      weights.push_back(std::exp(logits[static_cast<std::size_t>(e)]) / total);
    }
  }

  auto d_x = upload_vector(x);
  auto d_ids = upload_vector(ids);
  auto d_weights = upload_vector(weights);
  auto d_w13 = upload_vector(gate_up->packed);
  auto d_s13 = upload_vector(gate_up->scales);
  auto d_w2 = upload_vector(down->packed);
  auto d_s2 = upload_vector(down->scales);
  auto d_mid = rt::DeviceBuffer<std::uint16_t>::create(static_cast<std::size_t>(tokens * top_k * intermediate));
  auto d_out = rt::DeviceBuffer<std::uint16_t>::create(static_cast<std::size_t>(tokens * hidden));
  if (!d_mid.ok() || !d_out.ok()) return 1;

  // Up projection: mid[pair, :] = silu(x W_gate) * (x W_up), pair = token * top_k + slot.
  MoeGemmArguments up;
  up.activation = type;
  up.epilogue = MoeEpilogue::gate_up_silu;
  up.num_tokens = tokens;
  up.top_k = top_k;
  up.num_experts = experts;
  up.k = hidden;
  up.n = 2 * intermediate;
  up.group_size = group;
  up.a = d_x.data();
  up.b = d_w13.data();
  up.scales = d_s13.data();
  up.topk_ids = d_ids.data();
  up.c = d_mid->data();
  // Down projection: out[token, :] = sum over slots of router weight * (mid[pair] W_down).
  MoeGemmArguments dn = up;
  dn.epilogue = MoeEpilogue::down_weighted_sum;
  dn.k = intermediate;
  dn.n = hidden;
  dn.a = d_mid->data();
  dn.b = d_w2.data();
  dn.scales = d_s2.data();
  dn.topk_weights = d_weights.data();
  dn.c = d_out->data();

  // Plan once for the largest batch (graph-friendly: runs only launch). The layer aligns its
  // routing once; the up and down projections both read that alignment.
  MoeGemmOptions options;
  options.max_tokens = 64;
  const MoeRoutingArguments routing_args{tokens, top_k, experts, d_ids.data()};
  Result<MoeRoutingPlan> routing_plan = plan_moe_routing(routing_args, {options.max_tokens});
  Result<MoeGemmPlan> up_plan = plan_moe_gemm(up, options);
  Result<MoeGemmPlan> down_plan = plan_moe_gemm(dn, options);
  if (!routing_plan.ok() || !up_plan.ok() || !down_plan.ok()) {
    const Status failed = !routing_plan.ok() ? routing_plan.status()
                          : !up_plan.ok()    ? up_plan.status()
                                             : down_plan.status();
    fmt::print("int4 moe: plan failed: {}\n", failed.to_string());
    return 1;
  }
  auto routing_workspace = rt::DeviceBuffer<unsigned char>::create(routing_plan->workspace_bytes());
  auto gemm_workspace = rt::DeviceBuffer<unsigned char>::create(
      std::max(up_plan->gemm_workspace_bytes(), down_plan->gemm_workspace_bytes()));
  if (!routing_workspace.ok() || !gemm_workspace.ok()) return 1;
  Result<MoeRouting> routing = run_moe_routing(routing_args, *routing_plan, routing_workspace->data(),
                                               routing_workspace->size_bytes(), nullptr);
  Status status = routing.status();
  if (status.ok()) {
    status = run_moe_gemm(up, *up_plan, *routing, gemm_workspace->data(),
                          gemm_workspace->size_bytes(), nullptr);
  }
  if (status.ok()) {
    status = run_moe_gemm(dn, *down_plan, *routing, gemm_workspace->data(),
                          gemm_workspace->size_bytes(), nullptr);
  }
  // After the step: the device-side check of the router's ids (an engine reads this word
  // with its other per-step outputs; here it synchronizes).
  if (status.ok()) status = read_moe_routing_status(*routing, nullptr);
  std::vector<std::uint16_t> out(static_cast<std::size_t>(tokens * hidden));
  if (status.ok()) status = d_out->download(out);
  if (status.ok()) status = rt::stream_synchronize(nullptr);
  if (!status.ok()) {
    fmt::print("int4 moe: run failed: {}\n", status.to_string());
    return 1;
  }

  // The same layer on the BF16 weights, in FP64.
  double error_sq = 0.0;
  double reference_sq = 0.0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<double> y(static_cast<std::size_t>(hidden), 0.0);
    for (std::int64_t s = 0; s < top_k; ++s) {
      const auto pair = static_cast<std::size_t>(t * top_k + s);
      const std::vector<float>& w13 = gate_up->weights[static_cast<std::size_t>(ids[pair])];
      const std::vector<float>& w2 = down->weights[static_cast<std::size_t>(ids[pair])];
      std::vector<double> mid(static_cast<std::size_t>(intermediate));
      for (std::int64_t j = 0; j < intermediate; ++j) {
        double g = 0.0;
        double u = 0.0;
        for (std::int64_t i = 0; i < hidden; ++i) {
          const double xi = activation_to_float(type, x[static_cast<std::size_t>(t * hidden + i)]);
          g += xi * w13[static_cast<std::size_t>(i * 2 * intermediate + j)];
          u += xi * w13[static_cast<std::size_t>(i * 2 * intermediate + intermediate + j)];
        }
        mid[static_cast<std::size_t>(j)] = g / (1.0 + std::exp(-g)) * u;
      }
      for (std::int64_t col = 0; col < hidden; ++col) {
        double sum = 0.0;
        for (std::int64_t j = 0; j < intermediate; ++j) {
          sum += mid[static_cast<std::size_t>(j)] * w2[static_cast<std::size_t>(j * hidden + col)];
        }
        y[static_cast<std::size_t>(col)] += weights[pair] * sum;
      }
    }
    for (std::int64_t col = 0; col < hidden; ++col) {
      const double got = activation_to_float(type, out[static_cast<std::size_t>(t * hidden + col)]);
      const double want = y[static_cast<std::size_t>(col)];
      error_sq += (got - want) * (got - want);
      reference_sq += want * want;
    }
  }
  fmt::print("int4 moe: {} tokens, {} experts, top-{}, hidden {}, intermediate {} (group {}): "
             "relative error of the INT4 layer vs BF16 weights {:.4f}\n",
             tokens, experts, top_k, hidden, intermediate, group, std::sqrt(error_sq / reference_sq));
  return 0;
}
