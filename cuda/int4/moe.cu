// Grouped (MoE) W4A16 GEMM façade: preflight, workspace, routing alignment, dispatch.
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "slimserve/int4/moe.hpp"
#include "slimserve/int4/moe_kernel.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"

#if defined(SLIMSERVE_PLATFORM_CUDA)
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {
namespace {

// One m16 x n128 tile, 4 warps side by side, 4 stages. Weights keep the normal L2 policy: a
// hot expert's weights are re-read by its other row tiles.
using MoeTile = GemmTileConfig<moe_tile_rows, 128, 1, 4, 4, false>;

constexpr unsigned helper_threads = 256;
#if defined(SLIMSERVE_PLATFORM_CUDA)
constexpr unsigned helper_max_blocks = 1024;
#else
constexpr unsigned helper_max_blocks = 4;  // emulated grids stay small; the loops stride
#endif
constexpr std::int64_t max_grid_y = 65535;

struct MoeKernel {
  ActivationType activation;
  MoeEpilogue epilogue;
  GroupSpan span;
  Status (*launch)(const MoeGemmParams& params, dim3 grid, cudaStream_t stream);
};

template <class T, MoeEpilogue Epilogue, GroupSpan Span>
Status launch_moe(const MoeGemmParams& params, dim3 grid, cudaStream_t stream) {
  return rt::launch(moe_w4a16_kernel<T, MoeTile, Span, Epilogue>,
                    rt::LaunchConfig{grid, dim3(MoeTile::threads),
                                     sizeof(GemmSharedStorage<MoeTile, Span>), stream},
                    params);
}

template <class T>
constexpr ActivationType activation_of() {
  return std::is_same_v<T, bf16> ? ActivationType::bf16 : ActivationType::fp16;
}

template <class T, MoeEpilogue Epilogue>
constexpr std::array<MoeKernel, 3> moe_rows() {
  return {{{activation_of<T>(), Epilogue, GroupSpan::k16, &launch_moe<T, Epilogue, GroupSpan::k16>},
           {activation_of<T>(), Epilogue, GroupSpan::k32, &launch_moe<T, Epilogue, GroupSpan::k32>},
           {activation_of<T>(), Epilogue, GroupSpan::stage, &launch_moe<T, Epilogue, GroupSpan::stage>}}};
}

/// The one list of MoE kernels: {bf16, fp16} x {gate_up_silu, down_weighted_sum} x span.
const std::array<std::array<MoeKernel, 3>, 4> moe_kernels = {{
    moe_rows<bf16, MoeEpilogue::gate_up_silu>(),
    moe_rows<bf16, MoeEpilogue::down_weighted_sum>(),
    moe_rows<fp16, MoeEpilogue::gate_up_silu>(),
    moe_rows<fp16, MoeEpilogue::down_weighted_sum>(),
}};

const MoeKernel* find_moe_kernel(ActivationType activation, MoeEpilogue epilogue, GroupSpan span) {
  for (const auto& rows : moe_kernels) {
    for (const MoeKernel& kernel : rows) {
      if (kernel.activation == activation && kernel.epilogue == epilogue && kernel.span == span) {
        return &kernel;
      }
    }
  }
  return nullptr;
}

std::size_t align_up(std::size_t bytes, std::size_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

Status check_pointer(const void* pointer, const char* name, std::size_t alignment, bool required) {
  if (pointer == nullptr) {
    if (required) return make_status(StatusCode::invalid_argument, name, " is null");
    return {};
  }
  if (reinterpret_cast<std::uintptr_t>(pointer) % alignment != 0) {
    return make_status(StatusCode::invalid_argument, name, " (", pointer, ") is not ",
                       alignment, "-byte aligned");
  }
  return {};
}

std::int64_t max_tiles_for(std::int64_t pairs, std::int64_t experts) {
  // sum over experts with rows of ceil(rows / 16) <= (P + min(E, P) * 15) / 16
  return (pairs + std::min(experts, pairs) * (moe_tile_rows - 1)) / moe_tile_rows;
}

MoeAlignMethod resolve_align(MoeAlignMethod method) {
#if defined(SLIMSERVE_PLATFORM_CUDA)
  return method == MoeAlignMethod::automatic ? MoeAlignMethod::device : method;
#else
  (void)method;
  return MoeAlignMethod::serial;  // the emulator has no CUB
#endif
}

/// CUB's scratch for sorting `pairs` keys below 2^bits and scanning E + 1 tile counts.
Result<std::size_t> sort_scratch_bytes(std::int64_t pairs, std::int64_t experts) {
#if defined(SLIMSERVE_PLATFORM_CUDA)
  std::size_t sort_bytes = 0;
  std::size_t scan_bytes = 0;
  const int end_bit = std::max(1, static_cast<int>(std::bit_width(static_cast<std::uint32_t>(experts))));
  cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr),
      static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr),
      static_cast<int>(pairs), 0, end_bit);
  if (err == cudaSuccess) {
    err = cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const std::int32_t*>(nullptr),
                                        static_cast<std::int32_t*>(nullptr),
                                        static_cast<int>(experts + 1));
  }
  if (err != cudaSuccess) {
    return make_status(StatusCode::device_error, "CUB scratch query: ", cudaGetErrorString(err));
  }
  return std::max(sort_bytes, scan_bytes);
#else
  (void)pairs;
  (void)experts;
  return std::size_t{0};
#endif
}

}  // namespace

namespace detail {

/// The one function that lays out the routing workspace (the alignment's outputs, its status
/// word and CUB's scratch); `layout_moe_workspace` appends the GEMM's part to it.
MoeWorkspaceLayout layout_moe_routing(std::int64_t pairs, std::int64_t experts,
                                      std::int64_t max_tiles, std::size_t scratch_bytes) {
  constexpr std::size_t alignment = 256;
  MoeWorkspaceLayout layout;
  std::size_t offset = 0;
  auto take = [&](std::size_t& at, std::size_t bytes) {
    at = offset;
    offset = align_up(offset + bytes, alignment);
  };
  const auto p = static_cast<std::size_t>(pairs);
  const auto e1 = static_cast<std::size_t>(experts + 1);
  const auto tiles = static_cast<std::size_t>(max_tiles);
  take(layout.pair_keys_offset, p * 4);
  take(layout.pair_ids_offset, p * 4);
  take(layout.sorted_keys_offset, p * 4);
  take(layout.sorted_pairs_offset, p * 4);
  take(layout.expert_start_offset, e1 * 4);
  take(layout.tile_count_offset, e1 * 4);
  take(layout.tile_offset_offset, e1 * 4);
  take(layout.tile_expert_offset, tiles * 4);
  take(layout.tile_rows_offset, tiles * moe_tile_rows * 4);
  take(layout.status_offset, sizeof(MoeRoutingStatusWord));
  layout.sort_scratch_bytes = scratch_bytes;
  take(layout.sort_scratch_offset, scratch_bytes);
  layout.gemm_offset = offset;
  layout.partials_offset = offset;
  layout.total_bytes = offset;
  return layout;
}

/// The one function that lays out the MoE workspace (plan sizes it, run carves it): the
/// routing part, then the GEMM's (FP32 partials for down_weighted_sum).
MoeWorkspaceLayout layout_moe_workspace(std::int64_t pairs, std::int64_t experts,
                                        std::int64_t max_tiles, std::int64_t n,
                                        MoeEpilogue epilogue, std::size_t scratch_bytes) {
  MoeWorkspaceLayout layout = layout_moe_routing(pairs, experts, max_tiles, scratch_bytes);
  if (epilogue == MoeEpilogue::down_weighted_sum) {
    const std::size_t bytes = static_cast<std::size_t>(pairs) * static_cast<std::size_t>(n) * sizeof(float);
    layout.total_bytes = align_up(layout.gemm_offset + bytes, 256);
  }
  return layout;
}

}  // namespace detail

namespace {

Status check_routing_shape(std::int64_t num_tokens, std::int64_t top_k, std::int64_t num_experts) {
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  if (num_experts < 1 || num_experts > int_max / 2) {
    return make_status(StatusCode::invalid_argument, "num_experts = ", num_experts,
                       " must be in 1..", int_max / 2);
  }
  if (top_k < 1 || top_k > num_experts) {
    return make_status(StatusCode::invalid_argument, "top_k = ", top_k, " must be in 1..",
                       num_experts, " (num_experts)");
  }
  if (num_tokens < 1 || num_tokens > int_max / top_k) {
    return make_status(StatusCode::invalid_argument, "num_tokens = ", num_tokens,
                       " must be >= 1 with num_tokens * top_k < 2^31");
  }
  return {};
}

/// max_tokens for a plan (0: num_tokens), bounded like num_tokens.
Result<std::int64_t> resolve_max_tokens(std::int64_t requested, std::int64_t num_tokens,
                                        std::int64_t top_k) {
  const std::int64_t max_tokens = requested == 0 ? num_tokens : requested;
  if (max_tokens < num_tokens || max_tokens > std::numeric_limits<int>::max() / top_k) {
    return make_status(StatusCode::invalid_argument, "max_tokens = ", requested,
                       " must be 0 or in ", num_tokens, "..",
                       std::numeric_limits<int>::max() / top_k);
  }
  return max_tokens;
}

}  // namespace

Status validate_moe_routing(const std::int32_t* host_topk_ids, std::int64_t num_tokens,
                            std::int64_t top_k, std::int64_t num_experts) {
  if (host_topk_ids == nullptr) return make_status(StatusCode::invalid_argument, "topk_ids is null");
  for (std::int64_t token = 0; token < num_tokens; ++token) {
    for (std::int64_t slot = 0; slot < top_k; ++slot) {
      const std::int32_t id = host_topk_ids[token * top_k + slot];
      if (id < 0 || id >= num_experts) {
        return make_status(StatusCode::out_of_range, "topk_ids[", token, ", ", slot, "] = ", id,
                           " is outside 0..", num_experts - 1, " (num_experts = ", num_experts, ")");
      }
    }
  }
  return {};
}

Status can_implement(const MoeGemmArguments& args) {
  if (args.activation != ActivationType::bf16 && args.activation != ActivationType::fp16) {
    return make_status(StatusCode::invalid_argument, "unknown activation type ",
                       static_cast<int>(args.activation));
  }
  if (args.epilogue != MoeEpilogue::gate_up_silu && args.epilogue != MoeEpilogue::down_weighted_sum) {
    return make_status(StatusCode::invalid_argument, "unknown MoE epilogue ",
                       static_cast<int>(args.epilogue));
  }
  SLIMSERVE_RETURN_IF_ERROR(check_routing_shape(args.num_tokens, args.top_k, args.num_experts));
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  const std::int64_t column_multiple = args.epilogue == MoeEpilogue::gate_up_silu ? 32 : 16;
  if (args.n < column_multiple || args.n % column_multiple != 0 || args.n > int_max) {
    return make_status(StatusCode::unsupported, "n = ", args.n, " must be a positive multiple of ",
                       column_multiple,
                       args.epilogue == MoeEpilogue::gate_up_silu
                           ? " (gate and up halves of multiples of 16 columns)" : "");
  }
  if (args.k < 16 || args.k % 16 != 0 || args.k > int_max) {
    return make_status(StatusCode::unsupported, "k = ", args.k, " must be a positive multiple of 16");
  }
  if (!gemm_layout::supported_group_size(args.k, args.group_size)) {
    return make_status(StatusCode::unsupported, "group_size ", args.group_size, " with k = ",
                       args.k, ": k must be a multiple of the group size, a power of two >= 16 "
                       "(or the group is k itself)");
  }
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.a, "a", 16, true));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.b, "b (packed weights)", 16, true));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.scales, "scales", 16, true));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.zeros, "zeros", 16, false));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.topk_ids, "topk_ids", 4, true));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.topk_weights, "topk_weights", 4,
                                          args.epilogue == MoeEpilogue::down_weighted_sum));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.c, "c", 16, true));
  return {};
}

namespace {

/// The routing part of a plan: the row tiles' bound and CUB's scratch for max_tokens.
Result<MoeRoutingPlan> plan_routing_part(std::int64_t max_tokens, std::int64_t top_k,
                                         std::int64_t num_experts, MoeAlignMethod requested) {
#if !defined(SLIMSERVE_PLATFORM_CUDA)
  if (requested == MoeAlignMethod::device) {
    return make_status(StatusCode::unsupported,
                       "MoeAlignMethod::device needs the GPU build (CUB); the emulator aligns serially");
  }
#endif
  MoeRoutingPlan plan;
  plan.max_tokens = max_tokens;
  plan.top_k = top_k;
  plan.num_experts = num_experts;
  plan.align = resolve_align(requested);
  const std::int64_t pairs = max_tokens * top_k;
  plan.max_tiles = max_tiles_for(pairs, num_experts);
  if (plan.max_tiles > max_grid_y) {
    return make_status(StatusCode::unsupported, "max_tokens * top_k = ", pairs, " with ",
                       num_experts, " experts needs up to ", plan.max_tiles,
                       " row tiles; the grid allows ", max_grid_y);
  }
  std::size_t scratch = 0;
  if (plan.align == MoeAlignMethod::device) {
    Result<std::size_t> bytes = sort_scratch_bytes(pairs, num_experts);
    if (!bytes.ok()) return bytes.status();
    scratch = *bytes;
  }
  plan.workspace = detail::layout_moe_routing(pairs, num_experts, plan.max_tiles, scratch);
  return plan;
}

}  // namespace

Result<MoeRoutingPlan> plan_moe_routing(const MoeRoutingArguments& args,
                                        const MoeRoutingOptions& options) {
  SLIMSERVE_RETURN_IF_ERROR(check_routing_shape(args.num_tokens, args.top_k, args.num_experts));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.topk_ids, "topk_ids", 4, true));
  Result<std::int64_t> max_tokens = resolve_max_tokens(options.max_tokens, args.num_tokens, args.top_k);
  if (!max_tokens.ok()) return max_tokens.status();
  return plan_routing_part(*max_tokens, args.top_k, args.num_experts, options.align);
}

Result<MoeGemmPlan> plan_moe_gemm(const MoeGemmArguments& args, const MoeGemmOptions& options) {
  SLIMSERVE_RETURN_IF_ERROR(can_implement(args));
  Result<std::int64_t> max_tokens = resolve_max_tokens(options.max_tokens, args.num_tokens, args.top_k);
  if (!max_tokens.ok()) return max_tokens.status();
  Result<MoeRoutingPlan> routing = plan_routing_part(*max_tokens, args.top_k, args.num_experts, options.align);
  if (!routing.ok()) return routing.status();
  MoeGemmPlan plan;
  plan.activation = args.activation;
  plan.epilogue = args.epilogue;
  plan.max_tokens = *max_tokens;
  plan.top_k = args.top_k;
  plan.num_experts = args.num_experts;
  plan.k = args.k;
  plan.n = args.n;
  plan.group_size = args.group_size;
  plan.scaling = decode_tile_group_scaling(args.group_size);  // the grouped kernel's 16-row tile
  plan.align = routing->align;
  plan.validate_routing = options.validate_routing;
  plan.max_tiles = routing->max_tiles;
  plan.workspace = detail::layout_moe_workspace(*max_tokens * args.top_k, args.num_experts,
                                                plan.max_tiles, args.n, args.epilogue,
                                                routing->workspace.sort_scratch_bytes);
  return plan;
}

namespace {

rt::LaunchConfig helper_config(std::int64_t items, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(std::clamp<std::int64_t>(
      (items + helper_threads - 1) / helper_threads, 1, helper_max_blocks));
  return rt::LaunchConfig{dim3(blocks), dim3(helper_threads), 0, stream};
}

Status run_alignment(const MoeRoutingView& view, MoeAlignMethod method, unsigned char* scratch,
                     std::size_t scratch_bytes, cudaStream_t stream) {
  if (method == MoeAlignMethod::serial) {
    SLIMSERVE_RETURN_IF_ERROR(
        rt::launch(moe_align_serial_kernel, rt::LaunchConfig{dim3(1), dim3(1), 0, stream}, view));
  } else {
#if defined(SLIMSERVE_PLATFORM_CUDA)
    SLIMSERVE_RETURN_IF_ERROR(rt::launch(moe_pair_keys_kernel, helper_config(view.pairs, stream), view));
    const int end_bit = std::max(1, static_cast<int>(std::bit_width(static_cast<std::uint32_t>(view.experts))));
    std::size_t bytes = scratch_bytes;
    cudaError_t err = cub::DeviceRadixSort::SortPairs(scratch, bytes, view.pair_keys, view.sorted_keys,
                                                      view.pair_ids, view.sorted_pairs, view.pairs,
                                                      0, end_bit, stream);
    if (err != cudaSuccess) {
      return make_status(StatusCode::device_error, "cub::DeviceRadixSort::SortPairs: ",
                         cudaGetErrorString(err));
    }
    SLIMSERVE_RETURN_IF_ERROR(
        rt::launch(moe_expert_ranges_kernel, helper_config(view.experts + 1, stream), view));
    bytes = scratch_bytes;
    err = cub::DeviceScan::ExclusiveSum(scratch, bytes, view.tile_count, view.tile_offset,
                                        view.experts + 1, stream);
    if (err != cudaSuccess) {
      return make_status(StatusCode::device_error, "cub::DeviceScan::ExclusiveSum: ",
                         cudaGetErrorString(err));
    }
#else
    (void)scratch;
    (void)scratch_bytes;
    return make_status(StatusCode::unsupported, "device alignment needs the GPU build");
#endif
  }
  return rt::launch(moe_fill_tiles_kernel, helper_config(view.max_tiles, stream), view);
}


Status check_workspace(const void* workspace, std::size_t workspace_bytes, std::size_t needed,
                       const char* what) {
  if (needed == 0) return {};
  if (workspace_bytes < needed || workspace == nullptr) {
    return make_status(StatusCode::resource_exhausted, what, " of ", workspace_bytes,
                       " bytes; the plan needs ", needed);
  }
  if (reinterpret_cast<std::uintptr_t>(workspace) % 256 != 0) {
    return make_status(StatusCode::invalid_argument, what, " is not 256-byte aligned");
  }
  return {};
}

/// Carves the routing part of `layout` out of `workspace` and aligns `num_tokens` tokens'
/// pairs into it (launches only).
Result<MoeRouting> align_routing(const std::int32_t* topk_ids, std::int64_t num_tokens,
                                 std::int64_t top_k, std::int64_t num_experts,
                                 MoeAlignMethod method, const MoeWorkspaceLayout& layout,
                                 void* workspace, cudaStream_t stream) {
  const std::int64_t pairs = num_tokens * top_k;
  auto* bytes = static_cast<unsigned char*>(workspace);
  auto at = [&](std::size_t offset) { return reinterpret_cast<std::int32_t*>(bytes + offset); };
  MoeRoutingView view{};
  view.topk_ids = topk_ids;
  view.pair_keys = at(layout.pair_keys_offset);
  view.pair_ids = at(layout.pair_ids_offset);
  view.sorted_keys = at(layout.sorted_keys_offset);
  view.sorted_pairs = at(layout.sorted_pairs_offset);
  view.expert_start = at(layout.expert_start_offset);
  view.tile_count = at(layout.tile_count_offset);
  view.tile_offset = at(layout.tile_offset_offset);
  view.tile_expert = at(layout.tile_expert_offset);
  view.tile_rows = at(layout.tile_rows_offset);
  view.status = reinterpret_cast<MoeRoutingStatusWord*>(bytes + layout.status_offset);
  view.pairs = static_cast<int>(pairs);
  view.experts = static_cast<int>(num_experts);
  view.max_tiles = static_cast<int>(max_tiles_for(pairs, num_experts));
  SLIMSERVE_RETURN_IF_ERROR(run_alignment(view, method, bytes + layout.sort_scratch_offset,
                                          layout.sort_scratch_bytes, stream));
  MoeRouting routing;
  routing.topk_ids = topk_ids;
  routing.tile_expert = view.tile_expert;
  routing.tile_rows = view.tile_rows;
  routing.tiles_used = view.tile_offset + num_experts;
  routing.status = view.status;
  routing.num_tokens = num_tokens;
  routing.top_k = top_k;
  routing.num_experts = num_experts;
  routing.max_tiles = view.max_tiles;
  return routing;
}

/// The grouped GEMM (and the down combine) over an aligned routing; `gemm_workspace` holds
/// the GEMM's part of the layout (partials at 0).
Status launch_moe_gemm(const MoeGemmArguments& args, const MoeRouting& routing,
                       void* gemm_workspace, cudaStream_t stream) {
  const MoeKernel* kernel =
      find_moe_kernel(args.activation, args.epilogue, group_span_of(args.group_size));
  if (kernel == nullptr) return make_status(StatusCode::internal, "no MoE kernel");
  const std::int64_t pairs = args.num_tokens * args.top_k;
  MoeGemmParams params{};
  params.a = static_cast<const std::uint16_t*>(args.a);
  params.b = args.b;
  params.scales = static_cast<const std::uint16_t*>(args.scales);
  params.zeros = static_cast<const std::uint16_t*>(args.zeros);
  params.topk_weights = args.topk_weights;
  params.tile_expert = routing.tile_expert;
  params.tile_rows = routing.tile_rows;
  params.tiles_used = routing.tiles_used;
  params.c = static_cast<std::uint16_t*>(args.c);
  params.partials = args.epilogue == MoeEpilogue::down_weighted_sum
                        ? static_cast<float*>(gemm_workspace)
                        : nullptr;
  params.expert_words = args.k / 16 * (args.n / 16) * 32;
  params.expert_scales = args.k / args.group_size * args.n;
  params.pairs = static_cast<int>(pairs);
  params.top_k = static_cast<int>(args.top_k);
  params.k = static_cast<int>(args.k);
  params.n = static_cast<int>(args.n);
  params.group_shift = gemm_layout::group_shift(args.k, args.group_size);
  const std::int64_t block_columns = args.epilogue == MoeEpilogue::gate_up_silu
                                         ? MoeTile::block_n / 2  // of the intermediate
                                         : MoeTile::block_n;
  const std::int64_t out_columns = args.epilogue == MoeEpilogue::gate_up_silu ? args.n / 2 : args.n;
  const dim3 grid(static_cast<unsigned>((out_columns + block_columns - 1) / block_columns),
                  static_cast<unsigned>(routing.max_tiles));
  SLIMSERVE_RETURN_IF_ERROR(kernel->launch(params, grid, stream));
  if (args.epilogue == MoeEpilogue::gate_up_silu) return {};

  const rt::LaunchConfig config = helper_config(args.num_tokens * args.n, stream);
  auto* c = static_cast<std::uint16_t*>(args.c);
  const int experts = static_cast<int>(args.num_experts);
  if (args.activation == ActivationType::bf16) {
    return rt::launch(moe_combine_kernel<bf16>, config, params.partials, routing.topk_ids, c,
                      args.num_tokens, params.top_k, args.n, experts);
  }
  return rt::launch(moe_combine_kernel<fp16>, config, params.partials, routing.topk_ids, c,
                    args.num_tokens, params.top_k, args.n, experts);
}

Status check_plan_matches(const MoeGemmArguments& args, const MoeGemmPlan& plan) {
  if (plan.activation != args.activation || plan.epilogue != args.epilogue ||
      plan.top_k != args.top_k || plan.num_experts != args.num_experts || plan.k != args.k ||
      plan.n != args.n || plan.group_size != args.group_size || args.num_tokens > plan.max_tokens) {
    return make_status(StatusCode::invalid_argument, "the plan was made for max_tokens=",
                       plan.max_tokens, " top_k=", plan.top_k, " E=", plan.num_experts, " k=",
                       plan.k, " n=", plan.n, " group_size=", plan.group_size,
                       "; these arguments have T=", args.num_tokens, " top_k=", args.top_k,
                       " E=", args.num_experts, " k=", args.k, " n=", args.n,
                       " group_size=", args.group_size, " (plan again)");
  }
  const std::int64_t max_pairs = plan.max_tokens * plan.top_k;
  const MoeWorkspaceLayout layout = detail::layout_moe_workspace(
      max_pairs, plan.num_experts, max_tiles_for(max_pairs, plan.num_experts), plan.n,
      plan.epilogue, plan.workspace.sort_scratch_bytes);
  if (layout.total_bytes != plan.workspace.total_bytes || layout.gemm_offset != plan.workspace.gemm_offset) {
    return make_status(StatusCode::invalid_argument, "the plan's workspace (",
                       plan.workspace.total_bytes, " bytes) does not match its problem (",
                       layout.total_bytes, ")");
  }
  return {};
}

}  // namespace

Result<MoeRouting> run_moe_routing(const MoeRoutingArguments& args, const MoeRoutingPlan& plan,
                                   void* workspace, std::size_t workspace_bytes,
                                   cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(check_routing_shape(args.num_tokens, args.top_k, args.num_experts));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.topk_ids, "topk_ids", 4, true));
  if (plan.top_k != args.top_k || plan.num_experts != args.num_experts ||
      args.num_tokens > plan.max_tokens) {
    return make_status(StatusCode::invalid_argument, "the routing plan was made for max_tokens=",
                       plan.max_tokens, " top_k=", plan.top_k, " E=", plan.num_experts,
                       "; these arguments have T=", args.num_tokens, " top_k=", args.top_k,
                       " E=", args.num_experts, " (plan again)");
  }
  const std::int64_t max_pairs = plan.max_tokens * plan.top_k;
  const MoeWorkspaceLayout layout = detail::layout_moe_routing(
      max_pairs, plan.num_experts, max_tiles_for(max_pairs, plan.num_experts),
      plan.workspace.sort_scratch_bytes);
  if (layout.total_bytes != plan.workspace.total_bytes) {
    return make_status(StatusCode::invalid_argument, "the routing plan's workspace (",
                       plan.workspace.total_bytes, " bytes) does not match its problem (",
                       layout.total_bytes, ")");
  }
  SLIMSERVE_RETURN_IF_ERROR(check_workspace(workspace, workspace_bytes, layout.total_bytes,
                                            "routing workspace"));
  return align_routing(args.topk_ids, args.num_tokens, args.top_k, args.num_experts, plan.align,
                       layout, workspace, stream);
}

Status run_moe_gemm(const MoeGemmArguments& args, const MoeGemmPlan& plan,
                    const MoeRouting& routing, void* workspace, std::size_t workspace_bytes,
                    cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(can_implement(args));
  SLIMSERVE_RETURN_IF_ERROR(check_plan_matches(args, plan));
  if (routing.tile_expert == nullptr || routing.tile_rows == nullptr ||
      routing.tiles_used == nullptr || routing.topk_ids != args.topk_ids ||
      routing.num_tokens != args.num_tokens || routing.top_k != args.top_k ||
      routing.num_experts != args.num_experts ||
      routing.max_tiles != max_tiles_for(args.num_tokens * args.top_k, args.num_experts)) {
    return make_status(StatusCode::invalid_argument, "the routing was aligned for T=",
                       routing.num_tokens, " top_k=", routing.top_k, " E=", routing.num_experts,
                       " from ids at ", static_cast<const void*>(routing.topk_ids),
                       "; these arguments have T=", args.num_tokens, " top_k=", args.top_k,
                       " E=", args.num_experts, " ids at ", static_cast<const void*>(args.topk_ids),
                       " (run_moe_routing on these ids)");
  }
  SLIMSERVE_RETURN_IF_ERROR(check_workspace(workspace, workspace_bytes, plan.gemm_workspace_bytes(),
                                            "GEMM workspace"));
  return launch_moe_gemm(args, routing, workspace, stream);
}

Status run_moe_gemm(const MoeGemmArguments& args, const MoeGemmPlan& plan, void* workspace,
                    std::size_t workspace_bytes, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(can_implement(args));
  SLIMSERVE_RETURN_IF_ERROR(check_plan_matches(args, plan));
  const MoeWorkspaceLayout& layout = plan.workspace;
  if (workspace == nullptr || workspace_bytes < layout.total_bytes) {
    return make_status(StatusCode::resource_exhausted, "workspace of ", workspace_bytes,
                       " bytes; the plan needs ", layout.total_bytes);
  }
  SLIMSERVE_RETURN_IF_ERROR(check_workspace(workspace, workspace_bytes, layout.total_bytes, "workspace"));
  if (plan.validate_routing) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(args.num_tokens * args.top_k));
    SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(ids.data(), args.topk_ids, ids.size() * sizeof(std::int32_t),
                                             rt::CopyDirection::device_to_host, stream));
    SLIMSERVE_RETURN_IF_ERROR(rt::stream_synchronize(stream));
    SLIMSERVE_RETURN_IF_ERROR(
        validate_moe_routing(ids.data(), args.num_tokens, args.top_k, args.num_experts));
  }
  Result<MoeRouting> routing = align_routing(args.topk_ids, args.num_tokens, args.top_k,
                                             args.num_experts, plan.align, layout, workspace, stream);
  if (!routing.ok()) return routing.status();
  return launch_moe_gemm(args, *routing, static_cast<unsigned char*>(workspace) + layout.gemm_offset,
                         stream);
}

Status read_moe_routing_status(const MoeRouting& routing, cudaStream_t stream) {
  if (routing.status == nullptr) {
    return make_status(StatusCode::invalid_argument, "the routing has no status word (run_moe_routing makes one)");
  }
  MoeRoutingStatusWord word{};
  SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(&word, routing.status, sizeof(word),
                                           rt::CopyDirection::device_to_host, stream));
  SLIMSERVE_RETURN_IF_ERROR(rt::stream_synchronize(stream));
  if (word.invalid_pairs == 0) return {};
  const std::int64_t top_k = std::max<std::int64_t>(routing.top_k, 1);
  return make_status(StatusCode::out_of_range, "topk_ids[", word.first_invalid / top_k, ", ",
                     word.first_invalid % top_k, "] = ", word.first_id, " is outside 0..",
                     routing.num_experts - 1, " (num_experts = ", routing.num_experts, "); ",
                     word.invalid_pairs, " pair(s) with out-of-range ids were skipped");
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
