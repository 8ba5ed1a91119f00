// W4A16 GEMM façade: preflight, planning, the typed dispatch table and the launches.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "gemm_internal.hpp"
#include "slimserve/int4/gemm.hpp"
#include "slimserve/int4/gemm_kernel.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {
namespace {

// The fused kernel's tiles. Decode reads every weight once per launch (one M tile), so its
// weights are marked evict-first in L2; the wide tile's are re-read by the other M tiles.
using DecodeTile = GemmTileConfig<16, 128, 1, 4, 4, true>;  // GemmTile::m16_n128
using WideTile = GemmTileConfig<64, 128, 2, 2, 4, false>;   // GemmTile::m64_n128
// Groups spanning whole stages: 256 columns per block, 64 per warp, so a warp's fixed costs
// per stage (loop, barrier, A fragments, group start) are spread over twice the weights.
using DecodeStageTile = GemmTileConfig<16, 256, 1, 4, 4, true>;  // GemmTile::m16_n128
// Stream-K runs the decode tiles with 8 stages (6 in flight after each wait: 49 KB of
// weights for 256 columns, 25 KB for 128, against ~33 KB per SM that Little's law asks at
// 1 us and 4.3 TB/s): one block per SM, so its own copies are all the SM has in flight. The
// split-K grid has several blocks per SM and keeps 4 (with 8 its blocks per SM halve by shared
// memory and the 256-column m = 1 rows lose 2 points of the model).
template <class Config, int Stages>
using WithStages = GemmTileConfig<Config::block_m, Config::block_n, Config::warps_m,
                                  Config::warps_n, Stages, Config::evict_first_b>;
using DecodeTileStreamK = WithStages<DecodeTile, 8>;
using DecodeStageTileStreamK = WithStages<DecodeStageTile, 8>;
constexpr int block_k = DecodeTile::block_k;
static_assert(WideTile::block_k == block_k, "split-K slices are sized by one block_k");

#if defined(SLIMSERVE_PLATFORM_CUDA)
constexpr unsigned reduce_max_blocks = 2048;
#else
constexpr unsigned reduce_max_blocks = 16;  // emulated grids stay small; the loop strides
#endif
constexpr unsigned reduce_threads = 256;
constexpr int max_auto_splits = 16;

/// One row of the dispatch table: an (activation, tile, group span) key and its launcher.
struct FusedKernel {
  ActivationType activation;
  GemmTile tile;
  GroupSpan span;
  int block_m;
  int block_n;
  std::size_t shared_memory_bytes;            ///< split-K kernel
  std::size_t stream_k_shared_memory_bytes;   ///< stream-K kernel (deeper pipeline)
  Status (*launch)(const GemmParams& params, dim3 grid, cudaStream_t stream);
  /// Stream-K: the persistent kernel (shared tiles are reduced in place by their last block).
  Status (*launch_stream_k)(const GemmParams& params, const StreamKSchedule& schedule,
                            const StreamKWorkspace& workspace, cudaStream_t stream);
};

template <class T, class Config, GroupSpan Span>
Status launch_fused(const GemmParams& params, dim3 grid, cudaStream_t stream) {
  return rt::launch(w4a16_gemm_kernel<T, Config, Span>,
                    rt::LaunchConfig{grid, dim3(Config::threads),
                                     sizeof(GemmSharedStorage<Config, Span>), stream},
                    params);
}

template <class T, class Config, GroupSpan Span>
Status launch_stream_k(const GemmParams& params, const StreamKSchedule& schedule,
                       const StreamKWorkspace& workspace, cudaStream_t stream) {
  if constexpr (Config::m16_per_warp == 1) {
    // The decode tile's persistent pipeline moves from tile to tile along one row of tiles
    // (StreamKLoader); the plan picks it for m <= 16 only.
    if (params.m > Config::block_m) {
      return make_status(StatusCode::invalid_argument, "the decode tile's stream-K kernel takes m <= ",
                         Config::block_m, ", not m = ", params.m);
    }
  }
  return rt::launch(
      w4a16_gemm_stream_k_kernel<T, Config, Span>,
      rt::LaunchConfig{dim3(static_cast<unsigned>(schedule.blocks)), dim3(Config::threads),
                       sizeof(GemmSharedStorage<Config, Span>), stream},
      params, schedule, workspace);
}

template <class T>
constexpr ActivationType activation_of() {
  return std::is_same_v<T, bf16> ? ActivationType::bf16 : ActivationType::fp16;
}

/// The rows of one (type, tile): one per group span. `StreamKConfig`: the same tile with the
/// stream-K kernel's pipeline depth.
template <class T, class Config, class StreamKConfig, GemmTile Tile, GroupSpan... Spans>
constexpr std::array<FusedKernel, sizeof...(Spans)> fused_rows() {
  static_assert(StreamKConfig::block_m == Config::block_m && StreamKConfig::block_n == Config::block_n &&
                    StreamKConfig::threads == Config::threads,
                "one tile, two pipeline depths");
  return {{FusedKernel{activation_of<T>(), Tile, Spans, Config::block_m, Config::block_n,
                       sizeof(GemmSharedStorage<Config, Spans>),
                       sizeof(GemmSharedStorage<StreamKConfig, Spans>),
                       &launch_fused<T, Config, Spans>,
                       &launch_stream_k<T, StreamKConfig, Spans>}...}};
}

template <class T, std::size_t A, std::size_t B>
constexpr std::array<T, A + B> concat(const std::array<T, A>& a, const std::array<T, B>& b) {
  std::array<T, A + B> out{};
  for (std::size_t i = 0; i < A; ++i) out[i] = a[i];
  for (std::size_t i = 0; i < B; ++i) out[A + i] = b[i];
  return out;
}

// One width per key. A 128-column decode tile for groups >= 64 under stream-K with M > 1
// would halve the FP32 partials of each tile two blocks share (M = 16, n = 28672, k = 8192,
// 132 SMs: 1.8% of the weight bytes instead of 3.6%), but its mainloop costs 2.98 (BF16) /
// 2.79 (FP16) warp-instructions per 16 B against 2.40 / 2.20 for 256 columns (sm_90a SASS
// report): by the static model a tie for BF16 and 1.7% faster for FP16 only if the partials
// reach DRAM. The stream-K slots are now stored evict-last and discarded from L2 after the
// reduction (predicted to never reach DRAM), which leaves the 128-column tile only its
// costlier mainloop (docs/int4-gemm.md, "Partials in L2").
/// The one list of supported fused kernels: {bf16, fp16} x {decode, wide tile} x group span
/// {16, 32, >= 64 (incl. per-channel)}. Adding a span or a tile is an edit here (a second
/// width of one key too: `find_fused_kernel` takes the plan's block_n).
template <class T>
constexpr auto fused_rows_for_type() {
  return concat(
      concat(fused_rows<T, DecodeTile, DecodeTileStreamK, GemmTile::m16_n128, GroupSpan::k16,
                        GroupSpan::k32>(),
             fused_rows<T, DecodeStageTile, DecodeStageTileStreamK, GemmTile::m16_n128,
                        GroupSpan::stage>()),
      fused_rows<T, WideTile, WideTile, GemmTile::m64_n128, GroupSpan::k16, GroupSpan::k32,
                 GroupSpan::stage>());
}
const auto fused_kernels = concat(fused_rows_for_type<bf16>(), fused_rows_for_type<fp16>());

/// The row of (activation, tile, span) with `block_n` columns; block_n 0 (or no row that
/// wide): the first row of the key.
const FusedKernel* find_fused_kernel(ActivationType activation, GemmTile tile, GroupSpan span,
                                     int block_n = 0) {
  const FusedKernel* found = nullptr;
  for (const FusedKernel& kernel : fused_kernels) {
    if (kernel.activation == activation && kernel.tile == tile && kernel.span == span) {
      if (kernel.block_n == block_n) return &kernel;
      if (found == nullptr) found = &kernel;
    }
  }
  return found;
}

bool aligned(const void* pointer, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(pointer) % alignment == 0;
}

Status check_pointer(const void* pointer, const char* name, std::size_t alignment,
                     bool required) {
  if (pointer == nullptr) {
    if (required) return make_status(StatusCode::invalid_argument, name, " is null");
    return {};
  }
  if (!aligned(pointer, alignment)) {
    return make_status(StatusCode::invalid_argument, name, " (", pointer, ") is not ",
                       alignment, "-byte aligned");
  }
  return {};
}

int device_sm_count() {
#if defined(SLIMSERVE_PLATFORM_CUDA)
  int device = 0;
  int count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  return std::max(count, 1);
#else
  return 8;  // the emulator has no SMs; a small number keeps emulated grids small
#endif
}

/// Stream-K partial slots start on an L2 line (`discard_tile_slots` drops whole lines).
constexpr std::size_t stream_k_slot_alignment = arch::l2_line_bytes;

std::size_t align_up(std::size_t bytes, std::size_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

/// Automatic split-K. The busiest SM's work, in full-K tile units, is
/// ceil(tiles * s / sm_count) / s; take the s (1..16) that minimizes it, the largest such s
/// on ties (more blocks in flight hide memory latency), keeping each slice at least two K
/// steps long and the FP32 partials' round trip (written and read: 8 * s * m * n bytes)
/// within 2% of the packed weight bytes (k * n / 2): s * m <= k / 800. UNMEASURED: a model.
int choose_split(std::int64_t tiles, int sm_count, int k_steps, std::int64_t m, std::int64_t k) {
  const std::int64_t most = std::clamp<std::int64_t>(
      std::min<std::int64_t>({max_auto_splits, k_steps / 2, k / (800 * m)}), 1, max_auto_splits);
  int best = 1;
  double best_cost = std::numeric_limits<double>::max();
  for (std::int64_t s = 1; s <= most; ++s) {
    const std::int64_t waves = (tiles * s + sm_count - 1) / sm_count;
    const double cost = static_cast<double>(waves) / static_cast<double>(s);
    if (cost <= best_cost * (1.0 + 1e-9)) {
      best_cost = cost;
      best = static_cast<int>(s);
    }
  }
  return best;
}

}  // namespace

namespace detail {

GemmWorkspaceLayout layout_workspace(const GemmArguments& args, const GemmPlan& plan) {
  constexpr std::size_t alignment = 256;
  GemmWorkspaceLayout layout;
  std::size_t offset = 0;
  const GemmPath path = plan.path;
  if (path == GemmPath::fused && plan.schedule == GemmSchedule::split_k && plan.splits > 1) {
    layout.partials_offset = offset;
    layout.partials_bytes = static_cast<std::size_t>(plan.splits) *
                            static_cast<std::size_t>(args.m) * static_cast<std::size_t>(args.n) *
                            sizeof(float);
    offset = align_up(offset + layout.partials_bytes, alignment);
  }
  if (path == GemmPath::fused && plan.schedule == GemmSchedule::stream_k) {
    const FusedKernel* kernel = find_fused_kernel(args.activation, plan.tile,
                                                  group_span_of(args.group_size), plan.block_n);
    const std::size_t tile_elements =
        kernel == nullptr ? 0 : static_cast<std::size_t>(kernel->block_m * kernel->block_n);
    // The slots are discarded from L2 by 128-byte lines: run_gemm rounds their start up to a
    // line (the workspace itself need only be 16-byte aligned), so one line of slack.
    layout.partials_offset = offset;
    layout.partials_bytes =
        2 * static_cast<std::size_t>(plan.stream_k_blocks) * tile_elements * sizeof(float) +
        (tile_elements == 0 ? 0 : stream_k_slot_alignment);
    offset = align_up(offset + layout.partials_bytes, alignment);
    // One arrival counter per tile (zeroed by run_gemm before each launch).
    const std::size_t tiles =
        kernel == nullptr ? 0
                          : static_cast<std::size_t>((args.n + kernel->block_n - 1) / kernel->block_n) *
                                static_cast<std::size_t>((args.m + kernel->block_m - 1) / kernel->block_m);
    layout.arrivals_offset = offset;
    layout.arrivals_bytes = tiles * sizeof(unsigned);
    offset = align_up(offset + layout.arrivals_bytes, alignment);
  }
  if (path == GemmPath::expand) {
    layout.dense_offset = offset;
    layout.dense_bytes =
        static_cast<std::size_t>(args.k) * static_cast<std::size_t>(args.n) * sizeof(std::uint16_t);
    offset = align_up(offset + layout.dense_bytes, alignment);
    layout.library_offset = offset;
    layout.library_bytes = dense_library_workspace_bytes();
    offset = align_up(offset + layout.library_bytes, alignment);
  }
  layout.total_bytes = offset;
  return layout;
}

}  // namespace detail

Status can_implement(const GemmArguments& args) {
  if (!is_valid(args.activation)) {
    return make_status(StatusCode::invalid_argument, "unknown activation type ",
                       static_cast<int>(args.activation));
  }
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  if (args.m < 1 || args.m > int_max) {
    return make_status(StatusCode::invalid_argument, "m = ", args.m, " must be in 1..", int_max);
  }
  if (args.n < 16 || args.n % 16 != 0 || args.n > int_max) {
    return make_status(StatusCode::unsupported, "n = ", args.n,
                       " must be a positive multiple of 16 (pad the weight's columns)");
  }
  if (args.k < 16 || args.k % 16 != 0 || args.k > int_max) {
    return make_status(StatusCode::unsupported, "k = ", args.k,
                       " must be a positive multiple of 16 (pad the weight's rows)");
  }
  if (!gemm_layout::supported_group_size(args.k, args.group_size)) {
    return make_status(StatusCode::unsupported, "group_size ", args.group_size, " with k = ",
                       args.k, ": needs a power of two >= 16 that divides k, or k itself");
  }
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.a, "a", 16, true));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.b, "b (packed weights)", 16, true));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.scales, "scales", 16, true));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.zeros, "zeros", 16, false));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.bias, "bias", 16, false));
  SLIMSERVE_RETURN_IF_ERROR(check_pointer(args.c, "c", 16, true));
  return {};
}

Result<GemmPlan> plan_gemm(const GemmArguments& args, const GemmOptions& options) {
  SLIMSERVE_RETURN_IF_ERROR(can_implement(args));
  if (options.path != GemmPath::automatic && options.path != GemmPath::fused &&
      options.path != GemmPath::expand) {
    return make_status(StatusCode::invalid_argument, "unknown GEMM path ",
                       static_cast<int>(options.path));
  }
  if (options.split_k < 0) {
    return make_status(StatusCode::invalid_argument, "split_k = ", options.split_k,
                       " (0: automatic, s >= 1: s slices)");
  }
  GemmPlan plan;
  plan.activation = args.activation;
  plan.m = args.m;
  plan.n = args.n;
  plan.k = args.k;
  plan.group_size = args.group_size;
  plan.path = options.path;
  if (plan.path == GemmPath::automatic) {
    plan.path = args.m >= options.expand_min_m ? GemmPath::expand : GemmPath::fused;
  }
  plan.tile = args.m <= 16 ? GemmTile::m16_n128 : GemmTile::m64_n128;
  plan.scaling = plan.path == GemmPath::fused && plan.tile == GemmTile::m16_n128
                     ? decode_tile_group_scaling(args.group_size)
                     : GroupScaling::per_weight;
  const int k_steps = static_cast<int>((args.k + block_k - 1) / block_k);
  const int sm_count = options.sm_count > 0 ? options.sm_count : device_sm_count();
  plan.schedule = options.schedule;
  if (plan.schedule == GemmSchedule::automatic) {
    plan.schedule = options.split_k > 0 ? GemmSchedule::split_k : GemmSchedule::stream_k;
  }
  if (plan.schedule == GemmSchedule::stream_k && options.split_k > 1) {
    return make_status(StatusCode::invalid_argument, "split_k = ", options.split_k,
                       " asks for slices, but the schedule is stream-K");
  }
  if (options.stream_k_blocks_per_sm < 0) {
    return make_status(StatusCode::invalid_argument, "stream_k_blocks_per_sm = ",
                       options.stream_k_blocks_per_sm, " (0: one per SM)");
  }
  const GroupSpan span = group_span_of(args.group_size);
  const FusedKernel* kernel = nullptr;
  std::int64_t tiles = 0;
  const auto choose_kernel = [&] {
    kernel = find_fused_kernel(args.activation, plan.tile, span);
    if (kernel != nullptr) {
      tiles = ((args.n + kernel->block_n - 1) / kernel->block_n) *
              ((args.m + kernel->block_m - 1) / kernel->block_m);
    }
  };
  choose_kernel();
  if (plan.path == GemmPath::fused && plan.schedule == GemmSchedule::stream_k && kernel != nullptr &&
      tiles * k_steps > std::numeric_limits<int>::max()) {
    plan.schedule = GemmSchedule::split_k;  // stream-K counts units in 32 bits
    choose_kernel();
  }
  if (kernel == nullptr) {
    return make_status(StatusCode::internal, "no fused kernel for ", to_string(args.activation));
  }
  plan.block_n = kernel->block_n;
  int splits = 1;
  if (plan.path == GemmPath::fused && plan.schedule == GemmSchedule::stream_k) {
    // Persistent blocks: one (or stream_k_blocks_per_sm) per SM, never more than units.
    const std::int64_t units = tiles * k_steps;
    const std::int64_t wanted =
        static_cast<std::int64_t>(sm_count) * std::max(1, options.stream_k_blocks_per_sm);
    plan.stream_k_blocks = static_cast<int>(std::min(units, wanted));
  } else if (plan.path == GemmPath::fused) {
    plan.schedule = GemmSchedule::split_k;
    if (options.split_k > 0) {
      if (options.split_k > k_steps) {
        return make_status(StatusCode::invalid_argument, "split_k = ", options.split_k,
                           " is more than the ", k_steps, " K steps of ", block_k,
                           " rows (k = ", args.k, ")");
      }
      splits = options.split_k;
    } else {
      splits = choose_split(tiles, sm_count, k_steps, args.m, args.k);
    }
  }
  const int steps_per_split = (k_steps + splits - 1) / splits;
  plan.k_per_split = steps_per_split * block_k;
  plan.splits = (k_steps + steps_per_split - 1) / steps_per_split;  // no empty slices
  plan.workspace = detail::layout_workspace(args, plan);
  return plan;
}

Status run_gemm(const GemmArguments& args, const GemmPlan& plan, void* workspace,
                std::size_t workspace_bytes, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(can_implement(args));
  if (plan.activation != args.activation || plan.m != args.m || plan.n != args.n ||
      plan.k != args.k || plan.group_size != args.group_size) {
    return make_status(StatusCode::invalid_argument, "the plan was made for m=", plan.m,
                       " n=", plan.n, " k=", plan.k, " group_size=", plan.group_size,
                       "; these arguments have m=", args.m, " n=", args.n, " k=", args.k,
                       " group_size=", args.group_size, " (plan again)");
  }
  const GemmWorkspaceLayout layout = detail::layout_workspace(args, plan);
  if (layout.total_bytes != plan.workspace.total_bytes) {
    return make_status(StatusCode::invalid_argument,
                       "the plan was made for other arguments (workspace ",
                       plan.workspace.total_bytes, " bytes, these need ", layout.total_bytes, ")");
  }
  if (layout.total_bytes > 0 && workspace == nullptr) {
    return make_status(StatusCode::invalid_argument, "workspace is null; the plan needs ",
                       layout.total_bytes, " bytes");
  }
  if (workspace_bytes < layout.total_bytes) {
    return make_status(StatusCode::resource_exhausted, "workspace of ", workspace_bytes,
                       " bytes; the plan needs ", layout.total_bytes);
  }
  if (layout.total_bytes > 0 && !aligned(workspace, 16)) {
    return make_status(StatusCode::invalid_argument, "workspace is not 16-byte aligned");
  }
  auto* bytes = static_cast<unsigned char*>(workspace);
  if (plan.path == GemmPath::expand) {
    return detail::run_expansion_path(args, layout, bytes, stream);
  }
  if (plan.path != GemmPath::fused || plan.splits < 1 || plan.k_per_split % block_k != 0 ||
      static_cast<std::int64_t>(plan.splits - 1) * plan.k_per_split >= args.k ||
      static_cast<std::int64_t>(plan.splits) * plan.k_per_split < args.k) {
    return make_status(StatusCode::invalid_argument, "the plan is not a fused-path plan for k = ",
                       args.k, " (splits ", plan.splits, ", k_per_split ", plan.k_per_split, ")");
  }
  const FusedKernel* kernel = find_fused_kernel(args.activation, plan.tile,
                                                group_span_of(args.group_size), plan.block_n);
  if (kernel == nullptr || kernel->block_n != plan.block_n) {
    return make_status(StatusCode::invalid_argument, "the plan's ", plan.block_n,
                       "-column tile is not a fused kernel of this problem (plan again)");
  }
  GemmParams params{};
  params.a = static_cast<const std::uint16_t*>(args.a);
  params.b = args.b;
  params.scales = static_cast<const std::uint16_t*>(args.scales);
  params.zeros = static_cast<const std::uint16_t*>(args.zeros);
  params.bias = static_cast<const std::uint16_t*>(args.bias);
  params.c = static_cast<std::uint16_t*>(args.c);
  params.m = static_cast<int>(args.m);
  params.n = static_cast<int>(args.n);
  params.k = static_cast<int>(args.k);
  params.group_shift = gemm_layout::group_shift(args.k, args.group_size);
  if (plan.schedule == GemmSchedule::stream_k) {
    StreamKSchedule schedule{};
    const std::int64_t k_steps = (args.k + block_k - 1) / block_k;
    const std::int64_t tiles_n = (args.n + kernel->block_n - 1) / kernel->block_n;
    const std::int64_t units = tiles_n * ((args.m + kernel->block_m - 1) / kernel->block_m) * k_steps;
    if (plan.stream_k_blocks < 1 || plan.stream_k_blocks > units ||
        units > std::numeric_limits<int>::max()) {
      return make_status(StatusCode::invalid_argument, "the plan's ", plan.stream_k_blocks,
                         " stream-K blocks do not fit its ", units, " units");
    }
    schedule.units = static_cast<int>(units);
    schedule.blocks = plan.stream_k_blocks;
    schedule.k_steps = static_cast<int>(k_steps);
    schedule.tiles_n = static_cast<int>(tiles_n);
    schedule.units_per_block = schedule.units / schedule.blocks;
    schedule.remainder = schedule.units % schedule.blocks;
    schedule.by_k_steps = FastDivisor::make(schedule.k_steps);
    schedule.by_tiles_n = FastDivisor::make(schedule.tiles_n);
    params.k_per_split = static_cast<int>(args.k);
    params.splits = 1;
    StreamKWorkspace stream_k_workspace{};
    stream_k_workspace.partials = reinterpret_cast<float*>(align_up(
        reinterpret_cast<std::uintptr_t>(bytes + layout.partials_offset), stream_k_slot_alignment));
    stream_k_workspace.arrivals = reinterpret_cast<unsigned*>(bytes + layout.arrivals_offset);
    // The counters start at zero in every launch (a memset node when captured in a graph);
    // the workspace may hold anything between calls.
    SLIMSERVE_RETURN_IF_ERROR(
        rt::memset_async(stream_k_workspace.arrivals, 0, layout.arrivals_bytes, stream));
    return kernel->launch_stream_k(params, schedule, stream_k_workspace, stream);
  }
  constexpr std::int64_t max_grid_y = 65535;  // CUDA's limit on gridDim.y (M tiles)
  if ((args.m + kernel->block_m - 1) / kernel->block_m > max_grid_y) {
    return make_status(StatusCode::unsupported, "m = ", args.m, " needs more than ", max_grid_y,
                       " row tiles of ", kernel->block_m, " on the fused path; use the "
                       "expansion path for such M");
  }

  params.partials =
      plan.splits > 1 ? reinterpret_cast<float*>(bytes + layout.partials_offset) : nullptr;
  params.k_per_split = plan.k_per_split;
  params.splits = plan.splits;
  const dim3 grid(static_cast<unsigned>((args.n + kernel->block_n - 1) / kernel->block_n),
                  static_cast<unsigned>((args.m + kernel->block_m - 1) / kernel->block_m),
                  static_cast<unsigned>(plan.splits));
  SLIMSERVE_RETURN_IF_ERROR(kernel->launch(params, grid, stream));
  if (plan.splits == 1) return {};

  const std::int64_t count = args.m * args.n;
  const auto blocks = static_cast<unsigned>(
      std::clamp<std::int64_t>((count + reduce_threads - 1) / reduce_threads, 1, reduce_max_blocks));
  const rt::LaunchConfig config{dim3(blocks), dim3(reduce_threads), 0, stream};
  if (args.activation == ActivationType::bf16) {
    return rt::launch(splitk_reduce_kernel<bf16>, config, params.partials, params.bias, params.c,
                      args.m, args.n, plan.splits);
  }
  return rt::launch(splitk_reduce_kernel<fp16>, config, params.partials, params.bias, params.c,
                    args.m, args.n, plan.splits);
}

std::size_t gemm_shared_memory_bytes(ActivationType activation, GemmTile tile) {
  std::size_t most = 0;  // the largest over the group spans
  for (const FusedKernel& kernel : fused_kernels) {
    if (kernel.activation == activation && kernel.tile == tile) {
      most = std::max({most, kernel.shared_memory_bytes, kernel.stream_k_shared_memory_bytes});
    }
  }
  return most;
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
