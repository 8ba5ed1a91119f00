#pragma once
/// \file
/// \brief Paged decode attention: PLAN on the host, RUN on a stream (CUDA-graph capturable).
///
///   1. `decode_workspace_size(plan_args)` -> bytes; the caller allocates the workspace once.
///   2. `plan_decode(plan_args, workspace, bytes, stream)` checks the host page table, picks the
///      KV split and uploads the schedule into the workspace (not capturable: it copies from
///      the host). Re-plan when the batch changes shape or lengths outgrow the plan's balance.
///   3. `run_decode(args, plan, workspace, bytes, stream)` launches the attention kernel and,
///      when the plan splits the KV, the merge kernel. It reads lengths, page ids, scales and
///      tag-check verdicts from device memory at execution time, so a captured graph replays
///      correctly after appends.
/// Queries [batch_size * query_tokens, num_qo_heads, head_dim] (BF16/FP16; the query_tokens
/// tokens of a request are consecutive, the last one at the request's last position, with a
/// causal mask among them); outputs the same shape and type, plus the natural-log sum of
/// exp(scores) per row (lse, [batch_size * query_tokens, num_qo_heads], optional).
/// Aborted requests (tag check not ok, or an inconsistent device page table): none of their
/// pages is read; their output rows are NaN and their lse is -inf. An empty request (no
/// pages) outputs 0 with lse -inf.

#include <cstddef>
#include <cstdint>

#include "slimserve/attention/decode_plan.hpp"
#include "slimserve/attention/detail/stream.hpp"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/config.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

struct DecodeArguments {
  PagedKVCacheView cache;
  kv::PageTableView table;                            ///< device arrays
  const kv::RequestStatus* request_status = nullptr;  ///< [batch_size] device, or null
  const void* q = nullptr;  ///< [batch_size * query_tokens, num_qo_heads, head_dim]
  void* o = nullptr;        ///< same shape and dtype as q
  float* lse = nullptr;     ///< [batch_size * query_tokens, num_qo_heads] or null
  ActivationDtype q_dtype = ActivationDtype::bf16;
  float sm_scale = 0.0f;  ///< usually 1 / sqrt(head_dim)
};

/// Builds the plan (make_decode_plan) and uploads its schedule into the workspace.
Result<DecodePlan> plan_decode(const DecodePlanArguments& args, void* workspace,
                               std::size_t workspace_bytes, cudaStream_t stream);

/// Preflight of a run against its plan (shapes, enum ranges, pointers, alignment); no launch.
Status can_implement(const DecodeArguments& args, const DecodePlan& plan);

/// Launch only: preflight against the plan, then attention (+ merge). Capturable.
Status run_decode(const DecodeArguments& args, const DecodePlan& plan, void* workspace,
                  std::size_t workspace_bytes, cudaStream_t stream);

/// Merge of partial states, exposed for cascade use and tests (see kernels/merge_kernel.cuh).
struct MergeArguments {
  const float* partial_o = nullptr;            ///< [P, rows_per_request, head_dim]
  const float* partial_lse = nullptr;          ///< [P, rows_per_request] natural log
  const std::int32_t* split_indptr = nullptr;  ///< [batch_size + 1] device
  std::int32_t batch_size = 0;
  std::int32_t rows_per_request = 0;
  std::int32_t head_dim = 0;
  void* o = nullptr;     ///< [batch_size, rows_per_request, head_dim]
  float* lse = nullptr;  ///< [batch_size, rows_per_request] or null
  ActivationDtype out_dtype = ActivationDtype::bf16;
};
Status can_implement(const MergeArguments& args);
Status merge_attention_states(const MergeArguments& args, cudaStream_t stream);

}  // namespace attention
SLIMSERVE_NAMESPACE_END
