#pragma once
/// \file
/// \brief Host PLAN step of paged decode attention: split-KV scheduling and workspace layout.
///
/// The plan reads host copies of the page table's lengths (indptr, last_page_len), picks how
/// many KV chunks each request is split into, and lays out the caller-owned workspace:
///   int32 work_request[W], work_split[W]   one entry per CTA column (W work items)
///   int32 split_indptr[B + 1]             partials of request b: [split_indptr[b], [b+1])
///   float partial_o[P, query_tokens, num_qo_heads, head_dim]   (split_kv only)
///   float partial_lse[P, query_tokens, num_qo_heads]           (split_kv only)
/// `decode_workspace_size` and `make_decode_plan` run the same function, so the size query can
/// never disagree with what the plan carves. Plain C++ (no device access): the upload and the
/// RUN step are in decode.hpp.
///
/// Lengths at run time: the kernels read the current lengths from the device page table; split
/// s of request b covers tokens [s * chunk_tokens, (s + 1) * chunk_tokens) and its last planned
/// split runs to the request's end. A plan made from upper bounds of the lengths therefore stays
/// correct when replayed (in a CUDA graph) for shorter or longer requests; only the balance
/// degrades.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/config.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

/// Shapes shared by plan and run; run refuses a plan made for different shapes.
struct DecodeProblem {
  std::int32_t batch_size = 0;
  std::int32_t num_qo_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t page_size = 0;
  std::int32_t query_tokens = 1;  ///< tokens per request (1 = decode; 2..8 = speculative)
  KvDtype kv_dtype = KvDtype::bf16;
  friend bool operator==(const DecodeProblem&, const DecodeProblem&) = default;
};

inline constexpr std::int32_t max_query_tokens = 8;
/// The decode kernel is compiled for at most this many threads (keeps it under 128 registers).
inline constexpr std::int32_t max_decode_block_threads = 512;

/// Thread-block shape of the decode kernel for a problem (see kernels/decode_kernel.cuh):
/// `lanes` threads hold one head_dim vector (16 bytes of the stored type each), `rows` (the
/// query rows of one KV head, padded to a power of two) groups of lanes, and `token_groups`
/// copies of that working on different tokens.
struct DecodeBlockShape {
  std::int32_t lanes = 0;
  std::int32_t rows = 0;          ///< query_tokens * group size
  std::int32_t padded_rows = 0;   ///< next power of two >= rows
  std::int32_t token_groups = 0;
  std::int32_t threads() const { return lanes * padded_rows * token_groups; }
};
DecodeBlockShape decode_block_shape(const DecodeProblem& problem);

/// Shape checks: supported head_dim / page size / GQA ratio / query tokens, block fits.
Status validate_decode_problem(const DecodeProblem& problem);
/// The preflight name every component uses (same as validate_decode_problem).
inline Status can_implement(const DecodeProblem& problem) { return validate_decode_problem(problem); }

struct DecodePlanArguments {
  DecodeProblem problem;
  std::span<const std::int32_t> indptr_host;         ///< [batch_size + 1]
  std::span<const std::int32_t> last_page_len_host;  ///< [batch_size]
  /// CTAs the device keeps resident at once (SM count x CTAs per SM); splits fill up to this.
  std::int32_t max_ctas = 132 * 4;
  /// No split chunk shorter than this many tokens (rounded up to whole pages).
  std::int32_t min_chunk_tokens = 512;
  bool allow_split = true;
};

struct DecodeWorkspaceLayout {
  std::size_t work_request = 0;  ///< byte offsets into the workspace
  std::size_t work_split = 0;
  std::size_t split_indptr = 0;
  std::size_t partial_o = 0;
  std::size_t partial_lse = 0;
  std::size_t int_bytes = 0;     ///< bytes of the int32 head (uploaded by the plan)
  std::size_t total_bytes = 0;
};

struct DecodePlan {
  DecodeProblem problem;
  bool split_kv = false;
  std::int32_t chunk_tokens = 0;    ///< tokens per split (a multiple of page_size)
  std::int32_t num_work_items = 0;  ///< grid.x of the attention kernel
  std::int32_t num_partials = 0;    ///< P: partial states (== num_work_items)
  DecodeWorkspaceLayout layout;
  /// The int32 head of the workspace, ready to upload: work_request, work_split, split_indptr.
  std::vector<std::int32_t> host_ints;
};

/// Validates the host page table (indptr[0] == 0, non-decreasing, 1 <= last_page_len <=
/// page_size for non-empty requests) and builds the plan.
Result<DecodePlan> make_decode_plan(const DecodePlanArguments& args);

/// Workspace bytes the plan for `args` needs (same code path as make_decode_plan).
Result<std::size_t> decode_workspace_size(const DecodePlanArguments& args);

}  // namespace attention
SLIMSERVE_NAMESPACE_END
