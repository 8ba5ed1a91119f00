#pragma once
/// \file
/// \brief Grouped W4A16 GEMM for mixture-of-experts layers (host façade).
///
/// An MoE layer routes each token to `top_k` of `E` experts. The engine's router gives, per
/// token, the expert ids and their weights ([T, top_k] each, device memory). One call of
/// `run_moe_gemm` multiplies every (token, slot) pair's activation row by its expert's INT4
/// weights:
///
///   1. alignment (on the device): the T * top_k pairs are sorted by expert, stably (so the
///      result does not depend on timing), and each expert's rows are padded to the tile's M
///      (16): tile t belongs to one expert and holds up to 16 of its pairs. CUB's radix sort
///      and scan on the GPU; a serial kernel with the same output in the emulator (and on the
///      GPU on request, which the GPU test compares with CUB).
///   2. the grouped GEMM: one thread block per (row tile, column tile), the expert's weights
///      packed exactly as a dense GEMM's (`[E]` stacked `repack_for_gemm` outputs). Experts
///      without tokens get no tiles; a hot expert gets many row tiles x column tiles.
///   3. the epilogue:
///      - `gate_up_silu` (the up projection): the expert's n columns are [gate | up], n / 2
///        each; c[pair, j] = round(silu(gate_j) * up_j), an intermediate [T * top_k, n / 2] in
///        pair order (pair = token * top_k + slot);
///      - `down_weighted_sum` (the down projection): a is that intermediate; the epilogue
///        multiplies by the router weight and a combine step sums each token's top_k rows in
///        slot order (FP32, deterministic): c[token, j] = round(sum_slot w_slot * (a . W)).
///
/// Everything is FP32-accumulated, deterministic, CUDA-graph friendly: the plan bounds every
/// size by (max_tokens, top_k, E) and `run_moe_gemm` only launches (unless asked to validate
/// the routing on the host, which synchronizes).
///
/// One alignment per layer: the up and down projections of a layer route the same pairs, so
/// an engine aligns once (`plan_moe_routing` + `run_moe_routing` give a `MoeRouting`) and
/// passes that routing to both `run_moe_gemm` calls; each GEMM then needs only its own
/// `gemm_workspace_bytes()` (the down projection's FP32 partials; none for gate+up). The
/// alignment validates the ids on the device: out-of-range ids (< 0 or >= E) are counted in a
/// device status word and their pairs skipped by both GEMMs; `read_moe_routing_status` turns
/// that word into a Status after the step (it synchronizes; the engine may instead copy the
/// word itself, e.g. with its other per-step outputs).

#include <cstddef>
#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/status.hpp"

struct CUstream_st;

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

enum class MoeEpilogue : std::uint8_t {
  gate_up_silu,       ///< c[pair, n/2] = silu(gate) * up  (the expert's columns: [gate | up])
  down_weighted_sum,  ///< c[token, n] = sum over slots of router weight * (a[pair] . W)
};

/// How the alignment step sorts pairs by expert.
enum class MoeAlignMethod : std::uint8_t {
  automatic,  ///< CUB on the GPU, serial in the emulator
  serial,     ///< one thread, stable counting sort: the emulator's method (also runs on the GPU)
  device,     ///< CUB radix sort + scan (GPU build only)
};

/// Device pointers and shapes. The element type of a, c, scales and zeros is `activation`.
struct MoeGemmArguments {
  ActivationType activation = ActivationType::bf16;
  MoeEpilogue epilogue = MoeEpilogue::gate_up_silu;
  std::int64_t num_tokens = 0;   ///< T >= 1
  std::int64_t top_k = 0;        ///< 1..num_experts
  std::int64_t num_experts = 0;  ///< E
  std::int64_t k = 0;            ///< reduction size, multiple of 16 and of group_size
  std::int64_t n = 0;            ///< expert weight columns (gate_up: 2 x intermediate), multiple of 16 (32 for gate_up)
  std::int64_t group_size = 0;   ///< power of two >= 16 dividing k, or k
  /// gate_up_silu: [T, k] tokens; down_weighted_sum: [T * top_k, k] in pair order.
  const void* a = nullptr;
  const std::uint32_t* b = nullptr;  ///< [E][k/16, n/16, 32] packed per expert (gemm_layout)
  const void* scales = nullptr;      ///< [E][k/group_size, n]
  const void* zeros = nullptr;       ///< [E][k/group_size, n], or null (symmetric, z = 8)
  const std::int32_t* topk_ids = nullptr;   ///< [T, top_k] expert ids in 0..E-1
  const float* topk_weights = nullptr;      ///< [T, top_k]; read by down_weighted_sum only
  /// gate_up_silu: [T * top_k, n / 2] in pair order; down_weighted_sum: [T, n].
  void* c = nullptr;
};

struct MoeGemmOptions {
  /// The largest T this plan serves (its workspace and grids); 0: num_tokens.
  std::int64_t max_tokens = 0;
  MoeAlignMethod align = MoeAlignMethod::automatic;
  /// Copy topk_ids to the host and check every id before launching anything (synchronizes
  /// the stream; not for graph capture). Without it, out-of-range ids are dropped on the
  /// device (their pairs contribute nothing) and no memory outside the inputs is touched.
  bool validate_routing = false;
};

/// Byte ranges inside the workspace; one function computes them for the size query and the
/// carving.
struct MoeWorkspaceLayout {
  std::size_t pair_keys_offset = 0;     ///< int32 [P]: expert of each pair (E if invalid)
  std::size_t pair_ids_offset = 0;      ///< int32 [P]: 0..P-1
  std::size_t sorted_keys_offset = 0;   ///< int32 [P]
  std::size_t sorted_pairs_offset = 0;  ///< int32 [P]: pairs sorted by expert, stable
  std::size_t expert_start_offset = 0;  ///< int32 [E + 1]: first sorted index of each expert
  std::size_t tile_count_offset = 0;    ///< int32 [E + 1]: row tiles per expert (0 for E)
  std::size_t tile_offset_offset = 0;   ///< int32 [E + 1]: exclusive scan; [E] = tiles used
  std::size_t tile_expert_offset = 0;   ///< int32 [max_tiles]
  std::size_t tile_rows_offset = 0;     ///< int32 [max_tiles * 16]: pair per row, P = padding
  std::size_t status_offset = 0;        ///< MoeRoutingStatusWord: the device-side id check
  std::size_t sort_scratch_offset = 0;  ///< CUB's temporary storage (GPU build)
  std::size_t sort_scratch_bytes = 0;
  /// End of the routing part (everything above); the GEMM's own part starts here.
  std::size_t gemm_offset = 0;
  std::size_t partials_offset = 0;      ///< FP32 [P, n] (down_weighted_sum), at gemm_offset
  std::size_t total_bytes = 0;
  std::size_t routing_bytes() const { return gemm_offset; }
  std::size_t gemm_bytes() const { return total_bytes - gemm_offset; }
};

/// The alignment's device-side check of the ids, written by every run of the alignment.
struct MoeRoutingStatusWord {
  std::int32_t invalid_pairs;  ///< pairs whose id is outside 0..E-1 (skipped by the GEMMs)
  std::int32_t first_invalid;  ///< the smallest such pair index (token * top_k + slot), or -1
  std::int32_t first_id;       ///< its id
  std::int32_t reserved;
};

/// The routing of one step: the router's output, as the alignment reads it.
struct MoeRoutingArguments {
  std::int64_t num_tokens = 0;   ///< T >= 1
  std::int64_t top_k = 0;        ///< 1..num_experts
  std::int64_t num_experts = 0;  ///< E
  const std::int32_t* topk_ids = nullptr;  ///< [T, top_k] device ids
};

struct MoeRoutingOptions {
  std::int64_t max_tokens = 0;  ///< the largest T this plan serves; 0: num_tokens
  MoeAlignMethod align = MoeAlignMethod::automatic;
};

struct MoeRoutingPlan {
  std::int64_t max_tokens = 0;
  std::int64_t top_k = 0;
  std::int64_t num_experts = 0;
  MoeAlignMethod align = MoeAlignMethod::serial;
  std::int64_t max_tiles = 0;
  MoeWorkspaceLayout workspace;  ///< the routing part only (gemm_bytes() == 0)
  std::size_t workspace_bytes() const { return workspace.total_bytes; }
};

/// One step's aligned routing (device pointers into the routing workspace): valid until that
/// workspace is reused or the ids change. Pass it to the up and the down `run_moe_gemm`.
struct MoeRouting {
  const std::int32_t* topk_ids = nullptr;     ///< [T, top_k] the ids it was aligned from
  const std::int32_t* tile_expert = nullptr;  ///< [max_tiles]
  const std::int32_t* tile_rows = nullptr;    ///< [max_tiles, 16] pair per row (P: padding)
  const std::int32_t* tiles_used = nullptr;   ///< [1]
  const MoeRoutingStatusWord* status = nullptr;  ///< the device-side id check
  std::int64_t num_tokens = 0;
  std::int64_t top_k = 0;
  std::int64_t num_experts = 0;
  std::int64_t max_tiles = 0;  ///< row tiles for num_tokens in the worst routing (the grid)
};

struct MoeGemmPlan {
  ActivationType activation = ActivationType::bf16;
  MoeEpilogue epilogue = MoeEpilogue::gate_up_silu;
  std::int64_t max_tokens = 0;
  std::int64_t top_k = 0;
  std::int64_t num_experts = 0;
  std::int64_t k = 0;
  std::int64_t n = 0;
  std::int64_t group_size = 0;
  MoeAlignMethod align = MoeAlignMethod::serial;
  bool validate_routing = false;
  std::int64_t max_tiles = 0;  ///< row tiles for max_tokens in the worst routing
  /// Where the group scales are applied (the FP64 model the results match).
  GroupScaling scaling = GroupScaling::per_weight;
  MoeWorkspaceLayout workspace;
  /// Routing + GEMM: what `run_moe_gemm` without a MoeRouting needs.
  std::size_t workspace_bytes() const { return workspace.total_bytes; }
  /// The GEMM's own part: what `run_moe_gemm` with a MoeRouting needs.
  std::size_t gemm_workspace_bytes() const { return workspace.gemm_bytes(); }
};

/// Rows per tile of the grouped kernel (each expert's rows are padded to a multiple).
inline constexpr int moe_tile_rows = 16;

/// Preflight: shapes, group size, top_k <= E, pointers and alignment. Launches nothing.
Status can_implement(const MoeGemmArguments& args);

/// Preflight plus the workspace for up to options.max_tokens tokens.
Result<MoeGemmPlan> plan_moe_gemm(const MoeGemmArguments& args, const MoeGemmOptions& options = {});

/// Alignment, grouped GEMM and (down) combine on `stream`. `args.num_tokens` may be any value
/// up to the plan's max_tokens. Convenience for a lone GEMM: a layer aligns once instead
/// (below). Its routing part's status word is at `plan.workspace.status_offset`.
Status run_moe_gemm(const MoeGemmArguments& args, const MoeGemmPlan& plan, void* workspace,
                    std::size_t workspace_bytes, CUstream_st* stream);

/// Preflight (top_k in 1..E, T >= 1, ids pointer) and the routing workspace for up to
/// options.max_tokens tokens. Launches nothing.
Result<MoeRoutingPlan> plan_moe_routing(const MoeRoutingArguments& args,
                                        const MoeRoutingOptions& options = {});

/// The alignment on `stream` (launches only: graph-capturable). The ids are checked on the
/// device (see MoeRoutingStatusWord); nothing here synchronizes.
Result<MoeRouting> run_moe_routing(const MoeRoutingArguments& args, const MoeRoutingPlan& plan,
                                   void* workspace, std::size_t workspace_bytes,
                                   CUstream_st* stream);

/// The grouped GEMM and (down) combine over an aligned routing (shared by the layer's up and
/// down projections); `workspace` is the GEMM's own part (`plan.gemm_workspace_bytes()`, may
/// be null when that is 0). The routing must have been aligned from args' ids, T, top_k, E.
Status run_moe_gemm(const MoeGemmArguments& args, const MoeGemmPlan& plan,
                    const MoeRouting& routing, void* workspace, std::size_t workspace_bytes,
                    CUstream_st* stream);

/// After the step: copies the routing's status word to the host (synchronizes `stream`) and
/// returns out_of_range naming the first bad token, slot and id, with the count of skipped
/// pairs; ok when every id was in range.
Status read_moe_routing_status(const MoeRouting& routing, CUstream_st* stream);

/// Host check of a routing: every id in 0..num_experts-1 (the message names the first bad
/// token, slot and id).
Status validate_moe_routing(const std::int32_t* host_topk_ids, std::int64_t num_tokens,
                            std::int64_t top_k, std::int64_t num_experts);

}  // namespace int4
SLIMSERVE_NAMESPACE_END
