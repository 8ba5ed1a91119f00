#pragma once
/// \file
/// \brief Tensor-core paged attention: ragged prefill / append (chunked prefill over cached
/// pages), GQA decode and speculative verify, in one kernel family. PLAN on the host, RUN on a
/// stream (CUDA-graph capturable).
///
///   1. `paged_attention_workspace_size(plan_args)` -> bytes (the same code as the plan), or
///      `paged_attention_workspace_bound(bound)` for one allocation that serves every step up
///      to a maximum batch / token count / context.
///   2. `plan_paged_attention(plan_args, workspace, bytes, stream)` validates the host copies
///      of qo_indptr and the request lengths, picks the CTA shape and the KV split, and uploads
///      the schedule (not capturable).
///   3. `run_paged_attention(args, plan, workspace, bytes, stream)` launches (capturable): it
///      reads qo_indptr, page ids, lengths, scales and tag-check verdicts from device memory.
///
/// Request b owns query tokens [qo_indptr[b], qo_indptr[b + 1]) of q: they are the request's
/// last qo_len positions (the page table already counts them, as after `append_kv`), so a
/// prefill chunk attends to the cached prefix plus itself, causally. Decode is qo_len = 1,
/// speculative verify qo_len = k. Outputs: o in q's dtype and layout, and optionally the
/// natural-log LSE per (token, query head), including the sink when sinks are given.
/// Aborted requests (tag check not ok, inconsistent device table, qo_len > length): no page
/// is read; output rows are NaN and lse is -inf.
///
/// The page table comes in either form (the same as MLA decode's): CSR (`table`: indptr,
/// indices, last_page_len) or a 2-D block table (`block_table`: [batch, max_pages_per_request]
/// page ids + seq_lens, row b holding ceil(seq_lens[b] / page_size) valid entries). Both are
/// read from device memory at run time and give bit-identical outputs. Gate either with the
/// tag check of the same form (kv::check_page_tags), which covers exactly the entries a
/// request's length uses.
///
/// K and V are two allocations or one: `PagedKVCacheView::page_stride` is the distance
/// between consecutive pages in storage elements (bytes for NVFP4), so a combined
/// [num_pages, 2, page, H, D] cache is k_pages = base, v_pages = base + page * H * D,
/// page_stride = 2 * page * H * D (NVFP4: page * H * 9 D / 16 bytes in place of page * H * D).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "slimserve/attention/decode_plan.hpp"
#include "slimserve/attention/detail/stream.hpp"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/attention/rotation.hpp"
#include "slimserve/config.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

/// Shapes and types shared by plan and run; run refuses a plan made for another problem.
struct PagedAttentionProblem {
  std::int32_t batch_size = 0;
  std::int32_t num_qo_heads = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t page_size = 0;
  KvDtype kv_dtype = KvDtype::bf16;
  ActivationDtype q_dtype = ActivationDtype::bf16;  ///< q and o
  bool causal = true;
  friend bool operator==(const PagedAttentionProblem&, const PagedAttentionProblem&) = default;
};

/// Which kernel a plan runs, and why (see `choose_attention_kernel`).
enum class AttentionKernel : std::uint8_t { tensor_core, cuda_core };
struct AttentionKernelChoice {
  AttentionKernel kernel = AttentionKernel::tensor_core;
  std::string reason;
};
/// The static model's choice for a problem whose requests have at most `max_qo_len` query
/// tokens: the CUDA-core decode kernel only for decode (qo_len <= 8) at GQA group <= 2 on a
/// 16-bit cache, where it issues no more instructions per byte than the tensor-core kernel
/// and has no padded mma rows; the tensor-core kernel everywhere else. The plan then keeps the
/// CUDA-core choice only when every request has the same qo_len (its query layout) and the
/// batch fills the device unsplit (batch x KV heads >= SMs); otherwise it says why not.
AttentionKernelChoice choose_attention_kernel(const PagedAttentionProblem& problem,
                                              std::int32_t max_qo_len);

/// The wgmma prefill kernels (both take the plan's 64-row work items and give the same results):
///   automatic: the one the static model predicts faster without spilling (the default):
///     ping_pong for every KV type (4K causal, pessimistic end: BF16 0.69 of the tensor peak
///     against 0.55, FP8 0.56 against 0.51; docs/attention.md);
///   ping_pong: kernels/paged_prefill_pingpong_kernel.cuh, a producer warpgroup and two consumer
///     warpgroups whose softmax and tensor work alternate (one CTA per SM);
///   one_warpgroup: kernels/paged_prefill_wgmma_kernel.cuh, one warpgroup per CTA, two CTAs per
///     SM, each product waited for before its softmax.
enum class PrefillWgmmaKernel : std::uint8_t { automatic, ping_pong, one_warpgroup };

struct PagedAttentionPlanArguments {
  PagedAttentionProblem problem;
  std::span<const std::int32_t> qo_indptr_host;      ///< [batch_size + 1]
  /// Host copies of the lengths: the CSR table's indptr and last_page_len, or (block table)
  /// seq_lens; exactly one form.
  std::span<const std::int32_t> kv_indptr_host;      ///< [batch_size + 1] (page table indptr)
  std::span<const std::int32_t> last_page_len_host;  ///< [batch_size]
  std::span<const std::int32_t> seq_lens_host = {};  ///< [batch_size]
  /// Streaming multiprocessors to fill; 0 = ask the current device (plan_paged_attention and
  /// paged_attention_workspace_size; make_paged_attention_plan needs it set).
  std::int32_t num_sms = 0;
  std::int32_t ctas_per_sm = 2;
  /// No split chunk shorter than this many tokens.
  std::int32_t min_chunk_tokens = 512;
  bool allow_split = true;
  /// Run prefill on the sm_90a warpgroup-MMA (wgmma) kernel where it applies: 64-row
  /// schedules (more than 32 packed rows in some request) over a head_dim of
  /// PagedWgmmaHeadDims. Off by default until measured on a GPU; the plan's `choice.reason`
  /// says whether it was taken, and the run keeps the mma.sync kernel for per-token scales
  /// and fused chunk K/V (runs_warpgroup_mma).
  bool warpgroup_mma = false;
  /// Which wgmma prefill kernel runs when warpgroup_mma applies (PrefillWgmmaKernel).
  PrefillWgmmaKernel wgmma_kernel = PrefillWgmmaKernel::automatic;
};

struct PagedAttentionWorkspaceLayout {
  std::size_t work_request = 0;  ///< byte offsets into the workspace
  std::size_t work_row_tile = 0;
  std::size_t work_split = 0;
  std::size_t work_num_splits = 0;
  std::size_t unit_request = 0;
  std::size_t unit_row_tile = 0;
  std::size_t unit_indptr = 0;
  std::size_t partial_o = 0;
  std::size_t partial_lse = 0;
  std::size_t int_bytes = 0;  ///< bytes of the int32 head (uploaded by the plan)
  std::size_t total_bytes = 0;
};

struct PagedAttentionPlan {
  PagedAttentionProblem problem;
  std::int32_t warps_m = 1;   ///< CTA = warps_m x (4 / warps_m) warps
  std::int32_t cta_rows = 16; ///< packed (token x head) rows per CTA
  std::int32_t stage_tokens = 0;
  bool split_kv = false;
  std::int32_t chunk_tokens = 0;
  std::int32_t num_work_items = 0;  ///< grid.x
  std::int32_t num_units = 0;       ///< (request, row tile) pairs: merge grid.x
  std::int64_t max_kv_tokens = 0;   ///< longest request (a block table must hold its pages)
  PagedAttentionWorkspaceLayout layout;
  std::vector<std::int32_t> host_ints;
  AttentionKernelChoice choice;
  /// The tensor-core work runs on the wgmma kernel (asked for and applicable; see
  /// PagedAttentionPlanArguments::warpgroup_mma).
  bool warpgroup_mma = false;
  PrefillWgmmaKernel wgmma_kernel = PrefillWgmmaKernel::ping_pong;  ///< the arguments' choice, resolved
  /// choice == cuda_core: the CUDA-core decode schedule, uploaded at `decode_offset` of the
  /// same workspace. run_paged_attention runs it unless the run asks for what only the
  /// tensor-core kernel has (window, soft-cap, sinks, strided q/o, fused chunk K/V).
  std::optional<DecodePlan> decode;
  std::size_t decode_offset = 0;

  /// Bytes of workspace this plan uses (the CUDA-core decode schedule included): what
  /// paged_attention_workspace_size returned for its arguments. Named as the INT4 plans'.
  std::size_t workspace_bytes() const noexcept { return layout.total_bytes; }
};

/// Shape checks: head_dim, page size, GQA ratio, dtype pairing.
Status validate_paged_attention_problem(const PagedAttentionProblem& problem);

/// Validates the host arrays (monotone qo_indptr from 0, qo_len <= request length, page-table
/// lengths in one form) and builds the plan. `num_sms` must be set (plan_paged_attention fills it).
Result<PagedAttentionPlan> make_paged_attention_plan(const PagedAttentionPlanArguments& args);

/// Workspace bytes the plan for `args` needs.
Result<std::size_t> paged_attention_workspace_size(const PagedAttentionPlanArguments& args);

/// Upper bound of the workspace of every plan with at most these sizes (one allocation for a
/// CUDA-graph engine): batch, total query tokens of a step, and tokens of the longest request.
struct PagedAttentionWorkspaceBound {
  PagedAttentionProblem problem;  ///< batch_size = the maximum batch
  std::int64_t max_total_qo_tokens = 0;
  std::int64_t max_kv_tokens = 0;
  std::int32_t num_sms = 0;  ///< 0 = the current device
  std::int32_t ctas_per_sm = 2;
};
Result<std::size_t> paged_attention_workspace_bound(const PagedAttentionWorkspaceBound& bound);

/// Fused (mixed-dtype) prefill: the chunk's own K/V, in q's dtype (e.g. the K/V columns of a
/// fused QKV projection). When given, run_paged_attention writes them into the chunk's slots —
/// the bytes `append_kv` writes with append_indptr = qo_indptr, per-token scales (NVFP4: block
/// scales) included, on packed pages (any format) —
/// and the chunk's queries attend to them as given (not to their stored codes); the prefix
/// before the chunk is read from the pages. Do not append the chunk beforehand: the page
/// table already counts its tokens, their slots are what this call fills. No other request of
/// the batch may read the chunk's slots (a shared prefix page is never a chunk's page).
struct PagedAttentionChunkKv {
  const void* k = nullptr;  ///< k[token * token_stride + kv_head * head_stride + d], token as in q
  const void* v = nullptr;  ///< same indexing
  /// Strides in elements; 0 means packed [tokens, num_kv_heads, head_dim]. Multiples of 8.
  std::int64_t token_stride = 0, head_stride = 0;
};

struct PagedAttentionArguments {
  PagedKVCacheView cache;
  /// The page table: CSR (table.indptr non-null) or block table (block_table.block_table),
  /// exactly one; device arrays. expected_tags are not read here (the tag check reads them).
  kv::PageTableView table;
  kv::BlockTableView block_table;
  const kv::RequestStatus* request_status = nullptr;  ///< [batch_size] device, or null
  const std::int32_t* qo_indptr = nullptr;            ///< [batch_size + 1] device
  const void* q = nullptr;  ///< q[token * q_token_stride + head * q_head_stride + d]
  void* o = nullptr;        ///< o[token * o_token_stride + head * o_head_stride + d]
  float* lse = nullptr;     ///< [total query tokens, num_qo_heads] natural log, or null
  /// Strides in elements; 0 means packed [tokens, heads, head_dim]. Multiples of 8.
  std::int64_t q_token_stride = 0, q_head_stride = 0;
  std::int64_t o_token_stride = 0, o_head_stride = 0;
  std::optional<float> sm_scale;  ///< default 1 / sqrt(head_dim)
  std::int32_t window_left = -1;  ///< >= 0: keys at positions >= query position - window_left
  float logit_soft_cap = 0.0f;    ///< > 0: s = cap * tanh(s / cap), s = sm_scale * q.k
  const float* sinks = nullptr;   ///< [num_qo_heads] device natural-log sink logits, or null
  PagedAttentionChunkKv chunk_kv;  ///< fused prefill when chunk_kv.k is set (see above)
  /// The rotation the cache was appended with (AppendArguments::rotation; rotation.hpp): the
  /// kernel rotates each query row in FP32 before the score and, for keys_and_values, rotates
  /// the output back, so q, o are the unrotated ones (no rotate_heads around the call). Head
  /// dims 64, 128, 256; the tensor-core mma.sync kernel only (the CUDA-core decode and the
  /// wgmma prefill kernels are not taken; the fused prefill, chunk_kv, is refused).
  KvRotation rotation = KvRotation::none;
};

/// Builds the plan (make_paged_attention_plan; num_sms 0 asks the device) and uploads it.
Result<PagedAttentionPlan> plan_paged_attention(PagedAttentionPlanArguments args, void* workspace,
                                                std::size_t workspace_bytes, cudaStream_t stream);

/// The kernel run_paged_attention launches for these arguments under this plan.
AttentionKernel kernel_for_run(const PagedAttentionArguments& args, const PagedAttentionPlan& plan);

/// Whether run_paged_attention launches the wgmma kernel for these arguments under this plan:
/// the plan took it, and the run needs nothing it lacks (per-token scales, fused chunk K/V).
bool runs_warpgroup_mma(const PagedAttentionArguments& args, const PagedAttentionPlan& plan);

/// Launch only: preflight against the plan, attention, and the merge when split. Capturable.
Status run_paged_attention(const PagedAttentionArguments& args, const PagedAttentionPlan& plan,
                           void* workspace, std::size_t workspace_bytes, cudaStream_t stream);

}  // namespace attention
SLIMSERVE_NAMESPACE_END
