// The grouped (MoE) W4A16 GEMM against a loop of FP64 dense GEMMs per expert, every element.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gemm_test_matrices.hpp"
#include "gemm_test_runner.hpp"
#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/int4/moe.hpp"
#include "slimserve/runtime/memory.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::int4;
using slimserve_test::MatrixSpec;
using slimserve_test::to_device;

namespace {

/// E experts' weights, packed per expert and stacked; `w` holds the kernel's exact weights.
struct ExpertWeights {
  std::int64_t k = 0;
  std::int64_t n = 0;
  std::int64_t group_size = 0;
  std::vector<std::uint32_t> packed;
  std::vector<std::uint16_t> scales;
  std::vector<std::uint16_t> zeros;
  std::vector<std::vector<double>> w;  // [E][k * n]
};

ExpertWeights make_experts(std::int64_t experts, const MatrixSpec& spec, std::mt19937_64& rng) {
  ExpertWeights out;
  out.k = spec.k;
  out.n = spec.n;
  out.group_size = spec.group_size;
  for (std::int64_t e = 0; e < experts; ++e) {
    const QuantizedMatrix matrix = slimserve_test::random_quantized_matrix(spec, rng);
    Result<GemmWeights> packed = repack_for_gemm(matrix, spec.activation);
    REQUIRE(packed.ok());
    out.packed.insert(out.packed.end(), packed->packed.begin(), packed->packed.end());
    out.scales.insert(out.scales.end(), packed->scales.begin(), packed->scales.end());
    out.zeros.insert(out.zeros.end(), packed->zeros.begin(), packed->zeros.end());
    std::vector<double> w(static_cast<std::size_t>(spec.k * spec.n));
    for (std::int64_t row = 0; row < spec.k; ++row) {
      for (std::int64_t col = 0; col < spec.n; ++col) {
        const auto at = static_cast<std::size_t>(
            gemm_layout::scale_index(matrix.group_of_row(row), col, spec.n));
        w[static_cast<std::size_t>(row * spec.n + col)] =
            model_weight(spec.activation, decode_tile_group_scaling(spec.group_size),
                         matrix.code(row, col), matrix.zeros[at], packed->scales[at]);
      }
    }
    out.w.push_back(std::move(w));
  }
  return out;
}

enum class RoutingKind { random, empty_experts, one_hot_expert, with_invalid };

/// top_k distinct experts per token (as a router picks them), and router weights in (0.05, 1).
struct Routing {
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
};

Routing make_routing(RoutingKind kind, std::int64_t tokens, std::int64_t top_k,
                     std::int64_t experts, std::mt19937_64& rng) {
  Routing r;
  std::vector<std::int32_t> pool(static_cast<std::size_t>(experts));
  std::iota(pool.begin(), pool.end(), 0);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<std::int32_t> candidates = pool;
    if (kind == RoutingKind::empty_experts) {
      // only the experts 0 .. top_k + 1 ever get tokens: the rest are empty
      candidates.resize(static_cast<std::size_t>(std::min(experts, top_k + 2)));
    }
    std::shuffle(candidates.begin(), candidates.end(), rng);
    if (kind == RoutingKind::one_hot_expert) {
      // expert 1 takes every token (in slot t % top_k)
      auto it = std::find(candidates.begin(), candidates.end(), 1);
      std::swap(*it, candidates[static_cast<std::size_t>(t % top_k)]);
    }
    for (std::int64_t s = 0; s < top_k; ++s) {
      r.ids.push_back(candidates[static_cast<std::size_t>(s)]);
      r.weights.push_back(weight(rng));
    }
  }
  if (kind == RoutingKind::with_invalid) {
    r.ids[0] = static_cast<std::int32_t>(experts);  // dropped on the device
    if (r.ids.size() > 3) r.ids[3] = -1;
  }
  return r;
}

bool valid_id(std::int32_t id, std::int64_t experts) { return id >= 0 && id < experts; }

struct MoeCase {
  ActivationType type;
  MoeEpilogue epilogue;
  std::int64_t tokens;
  std::int64_t top_k;
  std::int64_t experts;
  std::int64_t k;
  std::int64_t n;           // expert weight columns
  std::int64_t group_size;  // 0: per-channel
  bool symmetric;
  RoutingKind routing;
};

double ulp_of(ActivationType type, double value) {
  const int mantissa_bits = type == ActivationType::bf16 ? 7 : 10;
  const double min_normal = type == ActivationType::bf16 ? 1.1754943508222875e-38 : 6.103515625e-05;
  return std::ldexp(1.0, std::ilogb(std::fmax(std::fabs(value), min_normal)) - mantissa_bits);
}

void check_against_reference(const MoeCase& test, const ExpertWeights& experts,
                             const Routing& routing, const std::vector<std::uint16_t>& a,
                             const std::vector<std::uint16_t>& first);

/// Runs one case twice (bitwise equal: deterministic) and checks every element.
void run_moe_case(const MoeCase& test, std::mt19937_64& rng) {
  const ActivationType type = test.type;
  const bool gate_up = test.epilogue == MoeEpilogue::gate_up_silu;
  const std::int64_t group = test.group_size == 0 ? test.k : test.group_size;
  CAPTURE(to_string(type), gate_up, test.tokens, test.top_k, test.experts, test.k, test.n, group,
          test.symmetric, static_cast<int>(test.routing));
  const std::int64_t pairs = test.tokens * test.top_k;
  const ExpertWeights experts =
      make_experts(test.experts, MatrixSpec{test.k, test.n, group, test.symmetric, false, type}, rng);
  const Routing routing = make_routing(test.routing, test.tokens, test.top_k, test.experts, rng);
  const std::int64_t a_rows = gate_up ? test.tokens : pairs;
  const std::vector<std::uint16_t> a =
      slimserve_test::random_activations(type, static_cast<std::size_t>(a_rows * test.k), rng);
  const std::int64_t out_rows = gate_up ? pairs : test.tokens;
  const std::int64_t out_cols = gate_up ? test.n / 2 : test.n;
  const std::size_t out_count = static_cast<std::size_t>(out_rows * out_cols);

  auto d_a = to_device(a);
  auto d_b = to_device(experts.packed);
  auto d_scales = to_device(experts.scales);
  auto d_zeros = to_device(experts.zeros);
  auto d_ids = to_device(routing.ids);
  auto d_weights = to_device(routing.weights);
  auto d_c = rt::DeviceBuffer<std::uint16_t>::create(out_count + slimserve_test::c_guard);
  REQUIRE(d_c.ok());

  MoeGemmArguments args;
  args.activation = type;
  args.epilogue = test.epilogue;
  args.num_tokens = test.tokens;
  args.top_k = test.top_k;
  args.num_experts = test.experts;
  args.k = test.k;
  args.n = test.n;
  args.group_size = group;
  args.a = d_a.data();
  args.b = d_b.data();
  args.scales = d_scales.data();
  args.zeros = test.symmetric ? nullptr : d_zeros.data();
  args.topk_ids = d_ids.data();
  args.topk_weights = d_weights.data();
  args.c = d_c->data();
  Result<MoeGemmPlan> plan = plan_moe_gemm(args);
  INFO(plan.status().to_string());
  REQUIRE(plan.ok());
  REQUIRE(plan->scaling == decode_tile_group_scaling(args.group_size));  // the reference's model
  auto workspace = rt::DeviceBuffer<unsigned char>::create(plan->workspace_bytes());
  REQUIRE(workspace.ok());

  // The second run aligns once through the explicit routing (as a layer does for up and
  // down) and must give the same bits as the convenience path.
  const MoeRoutingArguments routing_args{test.tokens, test.top_k, test.experts, d_ids.data()};
  Result<MoeRoutingPlan> routing_plan = plan_moe_routing(routing_args);
  REQUIRE(routing_plan.ok());
  auto routing_workspace = rt::DeviceBuffer<unsigned char>::create(routing_plan->workspace_bytes());
  REQUIRE(routing_workspace.ok());
  auto gemm_workspace =
      rt::DeviceBuffer<unsigned char>::create(std::max<std::size_t>(plan->gemm_workspace_bytes(), 1));
  REQUIRE(gemm_workspace.ok());
  const bool all_valid = test.routing != RoutingKind::with_invalid;

  std::vector<std::uint16_t> first;
  for (int run = 0; run < 2; ++run) {
    REQUIRE(d_c->fill_bytes(0xFF).ok());        // poison: NaN in both types
    REQUIRE(workspace->fill_bytes(run == 0 ? 0xFF : 0x7F).ok());  // stale workspace is ignored
    if (run == 0) {
      const Status status = run_moe_gemm(args, *plan, workspace->data(), workspace->size_bytes(), nullptr);
      INFO(status.to_string());
      REQUIRE(status.ok());
    } else {
      REQUIRE(routing_workspace->fill_bytes(0x7F).ok());
      REQUIRE(gemm_workspace->fill_bytes(0x7F).ok());
      Result<MoeRouting> aligned = run_moe_routing(routing_args, *routing_plan, routing_workspace->data(),
                                                   routing_workspace->size_bytes(), nullptr);
      REQUIRE(aligned.ok());
      const Status status = run_moe_gemm(args, *plan, *aligned, gemm_workspace->data(),
                                         gemm_workspace->size_bytes(), nullptr);
      INFO(status.to_string());
      REQUIRE(status.ok());
      const Status check = read_moe_routing_status(*aligned, nullptr);
      INFO(check.to_string());
      CHECK(check.ok() == all_valid);
      if (!all_valid) {
        CHECK(check.code() == StatusCode::out_of_range);
        CHECK(check.message().find("topk_ids[0, 0] = " + std::to_string(test.experts)) !=
              std::string_view::npos);
      }
    }
    std::vector<std::uint16_t> c(out_count + slimserve_test::c_guard);
    REQUIRE(d_c->download(c).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    for (std::size_t i = 0; i < slimserve_test::c_guard; ++i) REQUIRE(c[out_count + i] == 0xFFFF);
    c.resize(out_count);
    if (run == 0) {
      first = c;
    } else {
      CHECK(c == first);  // deterministic, bit for bit
    }
  }

  check_against_reference(test, experts, routing, a, first);
}

/// FP64 reference: each pair's row times its expert's exact weights (a loop of dense GEMMs),
/// every element of `first` (the kernel's output).
void check_against_reference(const MoeCase& test, const ExpertWeights& experts,
                             const Routing& routing, const std::vector<std::uint16_t>& a,
                             const std::vector<std::uint16_t>& first) {
  const ActivationType type = test.type;
  const bool gate_up = test.epilogue == MoeEpilogue::gate_up_silu;
  const std::int64_t pairs = test.tokens * test.top_k;
  auto a_at = [&](std::int64_t row, std::int64_t i) {
    return activation_to_float(type, a[static_cast<std::size_t>(row * test.k + i)]);
  };
  constexpr double eps = 5.9604644775390625e-08;  // 2^-24
  const double sum_tolerance = 2.0 * static_cast<double>(test.k + 2) * eps;
  int mismatches = 0;
  auto report = [&](std::int64_t row, std::int64_t col, double got, double want, double tol) {
    if (!(std::fabs(got - want) <= tol) && ++mismatches <= 8) {
      UNSCOPED_INFO("C[" << row << ", " << col << "] = " << got << ", reference " << want
                         << ", tolerance " << tol);
    }
  };
  if (gate_up) {
    const std::int64_t half = test.n / 2;
    for (std::int64_t pair = 0; pair < pairs; ++pair) {
      const std::int32_t expert = routing.ids[static_cast<std::size_t>(pair)];
      const std::int64_t token = pair / test.top_k;
      for (std::int64_t col = 0; col < half; ++col) {
        const double got = activation_to_float(type, first[static_cast<std::size_t>(pair * half + col)]);
        if (!valid_id(expert, test.experts)) {
          CHECK(std::isnan(got));  // a dropped pair's row is not written
          continue;
        }
        const std::vector<double>& w = experts.w[static_cast<std::size_t>(expert)];
        double g = 0, u = 0, mg = 0, mu = 0;
        for (std::int64_t i = 0; i < test.k; ++i) {
          const double x = a_at(token, i);
          const double wg = w[static_cast<std::size_t>(i * test.n + col)];
          const double wu = w[static_cast<std::size_t>(i * test.n + half + col)];
          g += x * wg;
          u += x * wu;
          mg += std::fabs(x * wg);
          mu += std::fabs(x * wu);
        }
        const double silu = g / (1.0 + std::exp(-g));
        const double want = silu * u;
        const double tol_g = sum_tolerance * mg;
        const double tol_u = sum_tolerance * mu;
        const double tol = 1.1 * tol_g * (std::fabs(u) + tol_u) + (std::fabs(silu) + 1.1 * tol_g) * tol_u +
                           16.0 * eps * std::fabs(want) + ulp_of(type, want);
        report(pair, col, got, want, tol);
      }
    }
  } else {
    for (std::int64_t token = 0; token < test.tokens; ++token) {
      for (std::int64_t col = 0; col < test.n; ++col) {
        double want = 0;
        double tol = 0;
        for (std::int64_t slot = 0; slot < test.top_k; ++slot) {
          const std::int64_t pair = token * test.top_k + slot;
          const std::int32_t expert = routing.ids[static_cast<std::size_t>(pair)];
          if (!valid_id(expert, test.experts)) continue;
          const std::vector<double>& w = experts.w[static_cast<std::size_t>(expert)];
          const double r = routing.weights[static_cast<std::size_t>(pair)];  // applied once
          double sum = 0, magnitude = 0;
          for (std::int64_t i = 0; i < test.k; ++i) {
            const double product = a_at(pair, i) * w[static_cast<std::size_t>(i * test.n + col)];
            sum += product;
            magnitude += std::fabs(product);
          }
          want += r * sum;
          tol += r * (sum_tolerance * magnitude + static_cast<double>(test.top_k + 2) * eps * std::fabs(sum));
        }
        const double got = activation_to_float(type, first[static_cast<std::size_t>(token * test.n + col)]);
        report(token, col, got, want, tol + ulp_of(type, want));
      }
    }
  }
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("MoE gate+up (SiLU . mul) and down (router-weighted sum): types, groups, top-k, T") {
  auto rng = slimserve_test::make_rng(41);
  const std::array<std::int64_t, 5> groups = {16, 32, 64, 128, 0};
  const std::array<std::int64_t, 3> top_ks = {1, 2, 8};
  const std::array<std::int64_t, 3> token_counts = {1, 7, 64};
  int index = 0;
  for (ActivationType type : {ActivationType::bf16, ActivationType::fp16}) {
    for (MoeEpilogue epilogue : {MoeEpilogue::gate_up_silu, MoeEpilogue::down_weighted_sum}) {
      for (std::int64_t tokens : token_counts) {
        const std::int64_t top_k = top_ks[static_cast<std::size_t>(index % 3)];
        const std::int64_t group = groups[static_cast<std::size_t>(index % 5)];
        const std::int64_t k = group == 0 ? 80 : std::max<std::int64_t>(128, group);
        // gate_up: 2 x 48 columns (the intermediate's 48: a partial 64-column block)
        const std::int64_t n = epilogue == MoeEpilogue::gate_up_silu ? 96 : 144;
        MoeCase test{type, epilogue, tokens, top_k, top_k == 8 ? 10 : 6, k, n, group,
                     index % 2 == 0, RoutingKind::random};
        run_moe_case(test, rng);
        ++index;
      }
    }
  }
}

TEST_CASE("MoE routings: empty experts, one expert takes every token, dropped invalid ids") {
  auto rng = slimserve_test::make_rng(42);
  int index = 0;
  for (RoutingKind kind : {RoutingKind::empty_experts, RoutingKind::one_hot_expert,
                           RoutingKind::with_invalid}) {
    for (MoeEpilogue epilogue : {MoeEpilogue::gate_up_silu, MoeEpilogue::down_weighted_sum}) {
      const ActivationType type = index % 2 == 0 ? ActivationType::bf16 : ActivationType::fp16;
      const std::int64_t top_k = kind == RoutingKind::one_hot_expert ? 1 + index % 2 : 2;
      // one_hot with top_k 1: 40 tokens on expert 1 = 3 row tiles of one expert
      MoeCase test{type, epilogue, 40, top_k, 9, 64, epilogue == MoeEpilogue::gate_up_silu ? 64 : 32,
                   32, index % 3 == 0, kind};
      run_moe_case(test, rng);
      ++index;
    }
  }
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
TEST_CASE("MoE layer: the up and down projections share one alignment") {
  auto rng = slimserve_test::make_rng(46);
  struct LayerCase {
    ActivationType type;
    std::int64_t tokens, top_k, experts;
    RoutingKind kind;
  };
  const std::array<LayerCase, 4> cases = {{
      {ActivationType::bf16, 1, 1, 4, RoutingKind::random},
      {ActivationType::fp16, 7, 2, 6, RoutingKind::one_hot_expert},
      {ActivationType::bf16, 64, 8, 12, RoutingKind::empty_experts},
      {ActivationType::fp16, 9, 2, 5, RoutingKind::with_invalid},
  }};
  const std::int64_t hidden = 64, intermediate = 48, group = 16;
  for (const LayerCase& layer : cases) {
    CAPTURE(layer.tokens, layer.top_k, layer.experts, static_cast<int>(layer.kind));
    const std::int64_t pairs = layer.tokens * layer.top_k;
    const MoeCase up_case{layer.type, MoeEpilogue::gate_up_silu, layer.tokens, layer.top_k,
                          layer.experts, hidden, 2 * intermediate, group, true, layer.kind};
    const MoeCase down_case{layer.type, MoeEpilogue::down_weighted_sum, layer.tokens, layer.top_k,
                            layer.experts, intermediate, hidden, group, false, layer.kind};
    const ExpertWeights up_w = make_experts(
        layer.experts, MatrixSpec{hidden, 2 * intermediate, group, true, false, layer.type}, rng);
    const ExpertWeights down_w = make_experts(
        layer.experts, MatrixSpec{intermediate, hidden, group, false, false, layer.type}, rng);
    const Routing routing = make_routing(layer.kind, layer.tokens, layer.top_k, layer.experts, rng);
    const std::vector<std::uint16_t> x = slimserve_test::random_activations(
        layer.type, static_cast<std::size_t>(layer.tokens * hidden), rng);
    auto d_x = to_device(x);
    auto d_up_b = to_device(up_w.packed);
    auto d_up_s = to_device(up_w.scales);
    auto d_down_b = to_device(down_w.packed);
    auto d_down_s = to_device(down_w.scales);
    auto d_down_z = to_device(down_w.zeros);
    auto d_ids = to_device(routing.ids);
    auto d_weights = to_device(routing.weights);
    auto d_inter = rt::DeviceBuffer<std::uint16_t>::create(static_cast<std::size_t>(pairs * intermediate));
    auto d_out = rt::DeviceBuffer<std::uint16_t>::create(static_cast<std::size_t>(layer.tokens * hidden));
    REQUIRE(d_inter.ok());
    REQUIRE(d_out.ok());
    REQUIRE(d_inter->fill_bytes(0xFF).ok());
    REQUIRE(d_out->fill_bytes(0xFF).ok());

    MoeGemmArguments up;
    up.activation = layer.type;
    up.epilogue = MoeEpilogue::gate_up_silu;
    up.num_tokens = layer.tokens;
    up.top_k = layer.top_k;
    up.num_experts = layer.experts;
    up.k = hidden;
    up.n = 2 * intermediate;
    up.group_size = group;
    up.a = d_x.data();
    up.b = d_up_b.data();
    up.scales = d_up_s.data();
    up.topk_ids = d_ids.data();
    up.topk_weights = d_weights.data();
    up.c = d_inter->data();
    MoeGemmArguments down = up;
    down.epilogue = MoeEpilogue::down_weighted_sum;
    down.k = intermediate;
    down.n = hidden;
    down.a = d_inter->data();
    down.b = d_down_b.data();
    down.scales = d_down_s.data();
    down.zeros = d_down_z.data();
    down.c = d_out->data();

    const MoeRoutingArguments routing_args{layer.tokens, layer.top_k, layer.experts, d_ids.data()};
    Result<MoeRoutingPlan> routing_plan = plan_moe_routing(routing_args);
    Result<MoeGemmPlan> up_plan = plan_moe_gemm(up);
    Result<MoeGemmPlan> down_plan = plan_moe_gemm(down);
    REQUIRE(routing_plan.ok());
    REQUIRE(up_plan.ok());
    REQUIRE(down_plan.ok());
    CHECK(up_plan->gemm_workspace_bytes() == 0);  // gate+up writes its output directly
    CHECK(down_plan->gemm_workspace_bytes() >= static_cast<std::size_t>(pairs * hidden) * sizeof(float));
    auto routing_workspace = rt::DeviceBuffer<unsigned char>::create(routing_plan->workspace_bytes());
    auto gemm_workspace = rt::DeviceBuffer<unsigned char>::create(down_plan->gemm_workspace_bytes());
    REQUIRE(routing_workspace.ok());
    REQUIRE(gemm_workspace.ok());
    REQUIRE(routing_workspace->fill_bytes(0xFF).ok());
    REQUIRE(gemm_workspace->fill_bytes(0xFF).ok());

    // One plan+run step aligns the layer; both projections read that routing.
    Result<MoeRouting> aligned = run_moe_routing(routing_args, *routing_plan, routing_workspace->data(),
                                                 routing_workspace->size_bytes(), nullptr);
    REQUIRE(aligned.ok());
    REQUIRE(run_moe_gemm(up, *up_plan, *aligned, nullptr, 0, nullptr).ok());
    REQUIRE(run_moe_gemm(down, *down_plan, *aligned, gemm_workspace->data(),
                         gemm_workspace->size_bytes(), nullptr).ok());
    const Status check = read_moe_routing_status(*aligned, nullptr);
    CHECK(check.ok() == (layer.kind != RoutingKind::with_invalid));

    std::vector<std::uint16_t> inter(static_cast<std::size_t>(pairs * intermediate));
    std::vector<std::uint16_t> out(static_cast<std::size_t>(layer.tokens * hidden));
    REQUIRE(d_inter->download(inter).ok());
    REQUIRE(d_out->download(out).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    check_against_reference(up_case, up_w, routing, x, inter);
    if (layer.kind == RoutingKind::with_invalid) {
      // the skipped pairs' intermediate rows are never written (NaN poison); the down
      // projection skips those pairs too, so give the reference finite values there
      for (std::size_t pair = 0; pair < routing.ids.size(); ++pair) {
        if (valid_id(routing.ids[pair], layer.experts)) continue;
        for (std::int64_t i = 0; i < intermediate; ++i) {
          inter[pair * static_cast<std::size_t>(intermediate) + static_cast<std::size_t>(i)] = 0;
        }
      }
    }
    check_against_reference(down_case, down_w, routing, inter, out);
  }
}

TEST_CASE("MoE with T = 1000, top-8 (release only: heavy under the sanitizers)") {
  auto rng = slimserve_test::make_rng(43);
  run_moe_case({ActivationType::bf16, MoeEpilogue::down_weighted_sum, 1000, 8, 16, 64, 16, 64,
                false, RoutingKind::random}, rng);
}
#endif

TEST_CASE("MoE preflight: top_k > E, K not a group multiple, bad ids, short workspace") {
  auto rng = slimserve_test::make_rng(44);
  const std::int64_t tokens = 3, top_k = 2, experts = 4, k = 64, n = 32;
  const ExpertWeights w = make_experts(experts, MatrixSpec{k, n, 32, true, false, ActivationType::bf16}, rng);
  std::vector<std::int32_t> ids = {0, 1, 2, 3, 1, 2};
  const std::vector<float> weights(6, 0.5f);
  auto d_a = to_device(slimserve_test::random_activations(ActivationType::bf16, tokens * k, rng));
  auto d_b = to_device(w.packed);
  auto d_scales = to_device(w.scales);
  auto d_ids = to_device(ids);
  auto d_weights = to_device(weights);
  auto d_c = rt::DeviceBuffer<std::uint16_t>::create(tokens * top_k * n);
  REQUIRE(d_c.ok());
  REQUIRE(d_c->fill_bytes(0xFF).ok());

  MoeGemmArguments good;
  good.epilogue = MoeEpilogue::gate_up_silu;
  good.num_tokens = tokens;
  good.top_k = top_k;
  good.num_experts = experts;
  good.k = k;
  good.n = n;
  good.group_size = 32;
  good.a = d_a.data();
  good.b = d_b.data();
  good.scales = d_scales.data();
  good.topk_ids = d_ids.data();
  good.topk_weights = d_weights.data();
  good.c = d_c->data();
  REQUIRE(can_implement(good).ok());

  auto expect = [](const MoeGemmArguments& args, StatusCode code, std::string_view text) {
    const Status status = can_implement(args);
    INFO(status.to_string());
    CHECK(status.code() == code);
    CHECK(status.message().find(text) != std::string_view::npos);
    CHECK(plan_moe_gemm(args).status().code() == code);
  };
  MoeGemmArguments args = good;
  args.top_k = 5;
  expect(args, StatusCode::invalid_argument, "top_k = 5");
  args = good;
  args.k = 80;  // not a multiple of group 32
  expect(args, StatusCode::unsupported, "k = 80");
  args = good;
  args.n = 48;  // gate+up halves of 24 columns
  expect(args, StatusCode::unsupported, "n = 48");
  args = good;
  args.topk_ids = nullptr;
  expect(args, StatusCode::invalid_argument, "topk_ids");
  args = good;
  args.epilogue = MoeEpilogue::down_weighted_sum;
  args.topk_weights = nullptr;
  expect(args, StatusCode::invalid_argument, "topk_weights");

  Result<MoeGemmPlan> plan = plan_moe_gemm(good, MoeGemmOptions{0, MoeAlignMethod::automatic, true});
  REQUIRE(plan.ok());
  auto workspace = rt::DeviceBuffer<unsigned char>::create(plan->workspace_bytes());
  REQUIRE(workspace.ok());
  const Status short_workspace =
      run_moe_gemm(good, *plan, workspace->data(), plan->workspace_bytes() - 1, nullptr);
  CHECK(short_workspace.code() == StatusCode::resource_exhausted);

  ids[4] = 7;  // token 2, slot 0
  REQUIRE(d_ids.upload(ids).ok());
  const Status status = run_moe_gemm(good, *plan, workspace->data(), workspace->size_bytes(), nullptr);
  INFO(status.to_string());
  CHECK(status.code() == StatusCode::out_of_range);
  CHECK(status.message().find("topk_ids[2, 0] = 7") != std::string_view::npos);
  std::vector<std::uint16_t> c(static_cast<std::size_t>(tokens * top_k * n));
  REQUIRE(d_c->download(c).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  CHECK(std::all_of(c.begin(), c.end(), [](std::uint16_t v) { return v == 0xFFFF; }));  // untouched

  MoeGemmArguments more = good;
  more.num_tokens = tokens + 1;
  CHECK(run_moe_gemm(more, *plan, workspace->data(), workspace->size_bytes(), nullptr).code() ==
        StatusCode::invalid_argument);  // beyond the plan's max_tokens
#if !defined(SLIMSERVE_PLATFORM_CUDA)
  CHECK(plan_moe_gemm(good, MoeGemmOptions{0, MoeAlignMethod::device, false}).status().code() ==
        StatusCode::unsupported);
#endif

  // The explicit routing: top_k > E refused at plan; bad ids reported by the device-side
  // check after the step (no host sync in the run), their pairs skipped.
  MoeRoutingArguments routing_args{tokens, top_k, experts, d_ids.data()};
  MoeRoutingArguments too_many = routing_args;
  too_many.top_k = experts + 1;
  CHECK(plan_moe_routing(too_many).status().code() == StatusCode::invalid_argument);
  CHECK(plan_moe_routing(too_many).status().message().find("top_k = 5") != std::string_view::npos);
  MoeRoutingArguments no_ids = routing_args;
  no_ids.topk_ids = nullptr;
  CHECK(plan_moe_routing(no_ids).status().code() == StatusCode::invalid_argument);
  Result<MoeRoutingPlan> routing_plan = plan_moe_routing(routing_args);
  REQUIRE(routing_plan.ok());
  auto routing_workspace = rt::DeviceBuffer<unsigned char>::create(routing_plan->workspace_bytes());
  REQUIRE(routing_workspace.ok());
  CHECK(run_moe_routing(routing_args, *routing_plan, routing_workspace->data(),
                        routing_plan->workspace_bytes() - 1, nullptr)
            .status()
            .code() == StatusCode::resource_exhausted);
  MoeRoutingArguments longer = routing_args;
  longer.num_tokens = tokens + 1;
  CHECK(run_moe_routing(longer, *routing_plan, routing_workspace->data(),
                        routing_workspace->size_bytes(), nullptr)
            .status()
            .code() == StatusCode::invalid_argument);
  const std::vector<std::vector<std::int32_t>> bad_routings = {
      {0, 1, 2, -1, 1, 2},  // token 1, slot 1: < 0
      {0, 4, 2, 3, 9, 2},   // token 0, slot 1: == E (and token 2, slot 0: > E)
      {0, 1, 2, 3, 1, 2},   // all in range
  };
  const std::vector<std::string> messages = {"topk_ids[1, 1] = -1", "topk_ids[0, 1] = 4", ""};
  for (std::size_t i = 0; i < bad_routings.size(); ++i) {
    REQUIRE(d_ids.upload(bad_routings[i]).ok());
    REQUIRE(routing_workspace->fill_bytes(0xFF).ok());
    Result<MoeRouting> aligned = run_moe_routing(routing_args, *routing_plan, routing_workspace->data(),
                                                 routing_workspace->size_bytes(), nullptr);
    REQUIRE(aligned.ok());
    const Status routing_status = read_moe_routing_status(*aligned, nullptr);
    INFO(routing_status.to_string());
    if (messages[i].empty()) {
      CHECK(routing_status.ok());
      continue;
    }
    CHECK(routing_status.code() == StatusCode::out_of_range);
    CHECK(routing_status.message().find(messages[i]) != std::string_view::npos);
    CHECK(routing_status.message().find(i == 1 ? "2 pair(s)" : "1 pair(s)") != std::string_view::npos);
    // a routing aligned from other ids or another T is refused by the GEMM
    MoeGemmArguments other = good;
    auto d_other_ids = to_device(bad_routings[i]);
    other.topk_ids = d_other_ids.data();
    Result<MoeGemmPlan> gemm_plan = plan_moe_gemm(good);
    REQUIRE(gemm_plan.ok());
    CHECK(run_moe_gemm(other, *gemm_plan, *aligned, nullptr, 0, nullptr).code() ==
          StatusCode::invalid_argument);
  }
}

#if defined(SLIMSERVE_PLATFORM_CUDA)
TEST_CASE("MoE alignment: CUB radix sort + scan equals the serial (emulator) method") {
  auto rng = slimserve_test::make_rng(45);
  for (RoutingKind kind : {RoutingKind::random, RoutingKind::empty_experts,
                           RoutingKind::one_hot_expert, RoutingKind::with_invalid}) {
    const std::int64_t tokens = 300, top_k = 8, experts = 64, k = 32, n = 32;
    const ExpertWeights w = make_experts(experts, MatrixSpec{k, n, 32, true, false, ActivationType::bf16}, rng);
    const Routing routing = make_routing(kind, tokens, top_k, experts, rng);
    auto d_a = to_device(slimserve_test::random_activations(ActivationType::bf16, tokens * k, rng));
    auto d_b = to_device(w.packed);
    auto d_scales = to_device(w.scales);
    auto d_ids = to_device(routing.ids);
    auto d_c = rt::DeviceBuffer<std::uint16_t>::create(tokens * top_k * n / 2);
    REQUIRE(d_c.ok());
    MoeGemmArguments args;
    args.num_tokens = tokens;
    args.top_k = top_k;
    args.num_experts = experts;
    args.k = k;
    args.n = n;
    args.group_size = 32;
    args.a = d_a.data();
    args.b = d_b.data();
    args.scales = d_scales.data();
    args.topk_ids = d_ids.data();
    args.c = d_c->data();
    std::vector<std::vector<std::int32_t>> results;
    for (MoeAlignMethod method : {MoeAlignMethod::device, MoeAlignMethod::serial}) {
      Result<MoeGemmPlan> plan = plan_moe_gemm(args, MoeGemmOptions{0, method, false});
      REQUIRE(plan.ok());
      auto workspace = rt::DeviceBuffer<unsigned char>::create(plan->workspace_bytes());
      REQUIRE(workspace.ok());
      REQUIRE(workspace->fill_bytes(0xFF).ok());
      REQUIRE(run_moe_gemm(args, *plan, workspace->data(), workspace->size_bytes(), nullptr).ok());
      // Everything from expert_start up to the end of tile_rows is the alignment's output.
      const MoeWorkspaceLayout& layout = plan->workspace;
      std::vector<unsigned char> bytes(workspace->size_bytes());
      REQUIRE(workspace->download(bytes).ok());
      REQUIRE(rt::stream_synchronize(nullptr).ok());
      std::vector<std::int32_t> out;
      auto append = [&](std::size_t offset, std::size_t count) {
        const auto* p = reinterpret_cast<const std::int32_t*>(bytes.data() + offset);
        out.insert(out.end(), p, p + count);
      };
      const auto pairs = static_cast<std::size_t>(tokens * top_k);
      append(layout.sorted_pairs_offset, pairs);
      append(layout.expert_start_offset, experts + 1);
      append(layout.tile_offset_offset, experts + 1);
      append(layout.tile_expert_offset, static_cast<std::size_t>(plan->max_tiles));
      append(layout.tile_rows_offset, static_cast<std::size_t>(plan->max_tiles) * moe_tile_rows);
      results.push_back(out);
    }
    CHECK(results[0] == results[1]);
  }
}
#endif
