// The C ABI's INT4 mixture-of-experts entry points (include/slimserve/c/slimserve.h): the
// routing plan / run shared by a layer's two grouped GEMMs, its device-side id check, and the
// grouped W4A16 GEMM plan / run over it (int4/moe.hpp). Each entry point reads its versioned
// struct, converts it to the C++ Arguments and calls the façade, whose preflight names what is
// wrong. Exported under the version node SLIMSERVE_C_2.
#include <cstddef>
#include <cstdint>
#include <utility>

#include "c_support.hpp"
#include "slimserve/c/slimserve.h"
#include "slimserve/int4/moe.hpp"

namespace int4 = slimserve::int4;

struct slimserve_moe_routing_plan {
  int4::MoeRoutingPlan plan;
};
struct slimserve_moe_gemm_plan {
  int4::MoeGemmPlan plan;
};

namespace {

using namespace slimserve_capi;

// The routing and its status word travel between the C caller and the façade as they are:
// keep the C structs mirrors of the C++ ones.
static_assert(sizeof(slimserve_moe_routing_status) == sizeof(int4::MoeRoutingStatusWord));
static_assert(offsetof(slimserve_moe_routing_status, first_invalid) ==
              offsetof(int4::MoeRoutingStatusWord, first_invalid));
static_assert(offsetof(slimserve_moe_routing_status, first_id) == offsetof(int4::MoeRoutingStatusWord, first_id));
static_assert(sizeof(slimserve_moe_routing) == sizeof(int4::MoeRouting));
static_assert(offsetof(slimserve_moe_routing, status) == offsetof(int4::MoeRouting, status));
static_assert(offsetof(slimserve_moe_routing, num_tokens) == offsetof(int4::MoeRouting, num_tokens));
static_assert(offsetof(slimserve_moe_routing, max_tiles) == offsetof(int4::MoeRouting, max_tiles));
static_assert(SLIMSERVE_MOE_DOWN_WEIGHTED_SUM == static_cast<int>(int4::MoeEpilogue::down_weighted_sum));
static_assert(SLIMSERVE_MOE_ALIGN_SERIAL == static_cast<int>(int4::MoeAlignMethod::serial));
static_assert(SLIMSERVE_MOE_ALIGN_DEVICE == static_cast<int>(int4::MoeAlignMethod::device));
static_assert(SLIMSERVE_SCALING_PER_GROUP_SUM == static_cast<int>(int4::GroupScaling::per_group_sum));

struct RoutingRequest {
  int4::MoeRoutingArguments args;
  int4::MoeRoutingOptions options;
};

Status to_routing(const slimserve_moe_routing_args* in, RoutingRequest& out) {
  slimserve_moe_routing_args a;
  SLIMSERVE_RETURN_IF_ERROR(read_versioned(in, "routing args", a));
  out.args = {a.num_tokens, a.top_k, a.num_experts, a.topk_ids};
  out.options.max_tokens = a.max_tokens;
  SLIMSERVE_RETURN_IF_ERROR(to_enum(a.align, "MoE align method", out.options.align));
  if (a.align > SLIMSERVE_MOE_ALIGN_DEVICE) {
    return make_status(StatusCode::invalid_argument, "unknown MoE align method ", a.align);
  }
  return {};
}

struct GemmRequest {
  int4::MoeGemmArguments args;
  int4::MoeGemmOptions options;
};

Status to_gemm(const slimserve_moe_gemm_args* in, GemmRequest& out) {
  slimserve_moe_gemm_args a;
  SLIMSERVE_RETURN_IF_ERROR(read_versioned(in, "MoE GEMM args", a));
  int4::MoeGemmArguments& g = out.args;
  SLIMSERVE_RETURN_IF_ERROR(to_activation(a.activation, "activation dtype", g.activation));
  SLIMSERVE_RETURN_IF_ERROR(to_enum(a.epilogue, "MoE epilogue", g.epilogue));  // the façade names others
  g.num_tokens = a.num_tokens;
  g.top_k = a.top_k;
  g.num_experts = a.num_experts;
  g.k = a.k;
  g.n = a.n;
  g.group_size = a.group_size;
  g.a = a.a;
  g.b = a.b;
  g.scales = a.scales;
  g.zeros = a.zeros;
  g.topk_ids = a.topk_ids;
  g.topk_weights = a.topk_weights;
  g.c = a.c;
  out.options.max_tokens = a.max_tokens;
  return int4::can_implement(g);
}

int4::MoeRouting to_cpp(const slimserve_moe_routing& r) {
  int4::MoeRouting out;
  out.topk_ids = r.topk_ids;
  out.tile_expert = r.tile_expert;
  out.tile_rows = r.tile_rows;
  out.tiles_used = r.tiles_used;
  out.status = reinterpret_cast<const int4::MoeRoutingStatusWord*>(r.status);
  out.num_tokens = r.num_tokens;
  out.top_k = r.top_k;
  out.num_experts = r.num_experts;
  out.max_tiles = r.max_tiles;
  return out;
}

slimserve_moe_routing to_c(const int4::MoeRouting& r) {
  return {r.topk_ids, r.tile_expert, r.tile_rows, r.tiles_used,
          reinterpret_cast<const slimserve_moe_routing_status*>(r.status),
          r.num_tokens, r.top_k, r.num_experts, r.max_tiles};
}

}  // namespace

extern "C" {

// ---- Routing ---------------------------------------------------------------------------------

slimserve_status slimserve_moe_routing_workspace_size(const slimserve_moe_routing_args* args, size_t* bytes) {
  return guarded([&]() -> Status {
    if (bytes == nullptr) return null_argument("bytes");
    RoutingRequest request;
    SLIMSERVE_RETURN_IF_ERROR(to_routing(args, request));
    auto plan = int4::plan_moe_routing(request.args, request.options);
    if (!plan.ok()) return plan.status();
    *bytes = plan->workspace_bytes();
    return {};
  });
}

slimserve_status slimserve_moe_routing_plan_create(const slimserve_moe_routing_args* args,
                                                   slimserve_moe_routing_plan** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    RoutingRequest request;
    SLIMSERVE_RETURN_IF_ERROR(to_routing(args, request));
    auto plan = int4::plan_moe_routing(request.args, request.options);
    if (!plan.ok()) return plan.status();
    *out = new slimserve_moe_routing_plan{*std::move(plan)};
    return {};
  });
}
void slimserve_moe_routing_plan_destroy(slimserve_moe_routing_plan* plan) { delete plan; }

slimserve_status slimserve_moe_routing_run(const slimserve_moe_routing_plan* plan,
                                           const slimserve_moe_routing_args* args, void* workspace,
                                           size_t workspace_bytes, slimserve_stream stream,
                                           slimserve_moe_routing* out) {
  return guarded([&]() -> Status {
    if (plan == nullptr) return null_argument("plan");
    if (out == nullptr) return null_argument("out");
    RoutingRequest request;
    SLIMSERVE_RETURN_IF_ERROR(to_routing(args, request));
    auto routing = int4::run_moe_routing(request.args, plan->plan, workspace, workspace_bytes, stream);
    if (!routing.ok()) return routing.status();
    *out = to_c(*routing);
    return {};
  });
}

slimserve_status slimserve_moe_routing_read_status(const slimserve_moe_routing* routing,
                                                   slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (routing == nullptr) return null_argument("routing");
    return int4::read_moe_routing_status(to_cpp(*routing), stream);
  });
}

slimserve_status slimserve_moe_validate_routing(const int32_t* host_topk_ids, int64_t num_tokens,
                                                int64_t top_k, int64_t num_experts) {
  return guarded([&]() -> Status {
    if (host_topk_ids == nullptr) return null_argument("host_topk_ids");
    if (num_tokens < 0 || top_k < 1 || num_experts < 1) {
      return make_status(StatusCode::invalid_argument, "num_tokens = ", num_tokens, ", top_k = ", top_k,
                         ", num_experts = ", num_experts, ": need num_tokens >= 0, top_k >= 1, num_experts >= 1");
    }
    return int4::validate_moe_routing(host_topk_ids, num_tokens, top_k, num_experts);
  });
}

// ---- Grouped GEMM ----------------------------------------------------------------------------

slimserve_status slimserve_moe_gemm_workspace_size(const slimserve_moe_gemm_args* args, size_t* bytes) {
  return guarded([&]() -> Status {
    if (bytes == nullptr) return null_argument("bytes");
    GemmRequest request;
    SLIMSERVE_RETURN_IF_ERROR(to_gemm(args, request));
    auto plan = int4::plan_moe_gemm(request.args, request.options);
    if (!plan.ok()) return plan.status();
    *bytes = plan->gemm_workspace_bytes();
    return {};
  });
}

slimserve_status slimserve_moe_gemm_plan_create(const slimserve_moe_gemm_args* args,
                                                slimserve_moe_gemm_plan** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    GemmRequest request;
    SLIMSERVE_RETURN_IF_ERROR(to_gemm(args, request));
    auto plan = int4::plan_moe_gemm(request.args, request.options);
    if (!plan.ok()) return plan.status();
    *out = new slimserve_moe_gemm_plan{*std::move(plan)};
    return {};
  });
}
void slimserve_moe_gemm_plan_destroy(slimserve_moe_gemm_plan* plan) { delete plan; }

slimserve_status slimserve_moe_gemm_plan_get_info(const slimserve_moe_gemm_plan* plan,
                                                  slimserve_moe_gemm_plan_info* info) {
  return guarded([&]() -> Status {
    if (plan == nullptr) return null_argument("plan");
    const int4::MoeGemmPlan& p = plan->plan;
    slimserve_moe_gemm_plan_info value{};
    value.max_tokens = p.max_tokens;
    value.max_tiles = p.max_tiles;
    value.workspace_bytes = p.gemm_workspace_bytes();
    value.scaling = static_cast<slimserve_group_scaling>(p.scaling);
    return write_versioned(value, "info", info);
  });
}

slimserve_status slimserve_moe_gemm_run(const slimserve_moe_gemm_plan* plan, const slimserve_moe_gemm_args* args,
                                        const slimserve_moe_routing* routing, void* workspace,
                                        size_t workspace_bytes, slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (plan == nullptr) return null_argument("plan");
    if (routing == nullptr) return null_argument("routing");
    GemmRequest request;
    SLIMSERVE_RETURN_IF_ERROR(to_gemm(args, request));
    return int4::run_moe_gemm(request.args, plan->plan, to_cpp(*routing), workspace, workspace_bytes, stream);
  });
}

}  // extern "C"
