// Façade of paged decode attention: plan upload, preflight, dispatch, split merge.
#include <cmath>
#include <cstdint>

#include "kernel_tables.cuh"
#include "slimserve/attention/decode.hpp"
#include "slimserve/attention/kernels/merge_kernel.cuh"
#include "slimserve/detail/preflight.hpp"
#include "slimserve/runtime/memory.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {
namespace {

using preflight::aligned16;

using detail::decode_table;

std::int32_t log2_exact(std::int32_t x) {
  std::int32_t shift = 0;
  while ((1 << shift) < x) ++shift;
  return shift;
}

Status check_workspace(const DecodePlan& plan, const void* workspace, std::size_t bytes) {
  if (workspace == nullptr) {
    return make_status(StatusCode::invalid_argument, "decode workspace is null; the plan needs ",
                       plan.layout.total_bytes, " bytes");
  }
  if (bytes < plan.layout.total_bytes) {
    return make_status(StatusCode::resource_exhausted, "decode workspace of ", bytes,
                       " bytes (", workspace == nullptr ? "null" : "non-null", "); the plan needs ",
                       plan.layout.total_bytes);
  }
  if (!aligned16(workspace)) {
    return make_status(StatusCode::invalid_argument, "decode workspace must be 16-byte aligned");
  }
  return {};
}

Status check_run_arguments(const DecodeArguments& a, const DecodeProblem& p) {
  SLIMSERVE_RETURN_IF_ERROR(validate_cache_view(a.cache));
  SLIMSERVE_RETURN_IF_ERROR(require_packed_pages(a.cache, "CUDA-core decode"));
  if (!is_valid(a.q_dtype)) {
    return make_status(StatusCode::invalid_argument, "unknown activation dtype ",
                       static_cast<int>(a.q_dtype));
  }
  if (a.cache.dtype != p.kv_dtype || a.cache.head_dim != p.head_dim ||
      a.cache.page_size != p.page_size || a.cache.num_kv_heads != p.num_kv_heads) {
    return make_status(StatusCode::invalid_argument, "the plan was made for a ",
                       to_string(p.kv_dtype), " cache with page_size ", p.page_size, ", ",
                       p.num_kv_heads, " KV heads of head_dim ", p.head_dim, "; the cache is ",
                       to_string(a.cache.dtype), " with ", a.cache.page_size, ", ",
                       a.cache.num_kv_heads, ", ", a.cache.head_dim);
  }
  if (a.table.batch_size != p.batch_size || a.table.page_size != p.page_size) {
    return make_status(StatusCode::invalid_argument, "page table has batch_size ",
                       a.table.batch_size, " and page_size ", a.table.page_size,
                       "; the plan has ", p.batch_size, " and ", p.page_size);
  }
  if (p.batch_size > 0 && (a.table.indptr == nullptr || a.table.indices == nullptr ||
                           a.table.last_page_len == nullptr)) {
    return make_status(StatusCode::invalid_argument, "page table arrays must be non-null");
  }
  if (a.q == nullptr || a.o == nullptr) {
    return make_status(StatusCode::invalid_argument, "q and o must be non-null");
  }
  if (!aligned16(a.q) || !aligned16(a.o) || !aligned16(a.cache.k_pages) || !aligned16(a.cache.v_pages)) {
    return make_status(StatusCode::invalid_argument, "q, o and the K/V pages must be 16-byte aligned");
  }
  if (!std::isfinite(a.sm_scale) || !(a.sm_scale > 0.0f)) {
    return make_status(StatusCode::invalid_argument, "sm_scale must be finite and > 0, got ", a.sm_scale);
  }
  return {};
}

}  // namespace

Result<DecodePlan> plan_decode(const DecodePlanArguments& args, void* workspace,
                               std::size_t workspace_bytes, cudaStream_t stream) {
  Result<DecodePlan> plan = make_decode_plan(args);
  if (!plan.ok()) return plan;
  SLIMSERVE_RETURN_IF_ERROR(check_workspace(*plan, workspace, workspace_bytes));
  // From pageable memory: the copy has consumed the host buffer when this returns.
  SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(workspace, plan->host_ints.data(), plan->layout.int_bytes,
                                           rt::CopyDirection::host_to_device, stream));
  return plan;
}

Status can_implement(const DecodeArguments& a, const DecodePlan& plan) {
  SLIMSERVE_RETURN_IF_ERROR(validate_decode_problem(plan.problem));
  return check_run_arguments(a, plan.problem);
}

Status run_decode(const DecodeArguments& a, const DecodePlan& plan, void* workspace,
                  std::size_t workspace_bytes, cudaStream_t stream) {
  const DecodeProblem& p = plan.problem;
  SLIMSERVE_RETURN_IF_ERROR(can_implement(a, plan));
  SLIMSERVE_RETURN_IF_ERROR(check_workspace(plan, workspace, workspace_bytes));
  if (p.batch_size == 0) return {};

  detail::DecodeLauncher launch = nullptr;
  for (const auto& entry : decode_table(p.kv_dtype)) {
    if (entry.q_dtype == a.q_dtype && entry.head_dim == p.head_dim) launch = entry.launch;
  }
  if (launch == nullptr) {
    return make_status(StatusCode::unsupported, "no decode kernel for a ", to_string(p.kv_dtype),
                       " cache with head_dim ", p.head_dim);
  }

  auto* base = static_cast<unsigned char*>(workspace);
  const DecodeBlockShape shape = decode_block_shape(p);
  kernels::DecodeParams params{};
  detail::fill_paged_cache_fields(params, a.cache, a.table, a.request_status);
  params.page_size = p.page_size;
  params.page_shift = log2_exact(p.page_size);
  params.num_kv_heads = p.num_kv_heads;
  params.q = a.q;
  params.o = a.o;
  params.lse = a.lse;
  params.num_qo_heads = p.num_qo_heads;
  params.group_size = p.num_qo_heads / p.num_kv_heads;
  params.query_tokens = p.query_tokens;
  params.sm_scale = a.sm_scale;
  params.rows = shape.rows;
  params.padded_rows = shape.padded_rows;
  params.token_groups = shape.token_groups;
  params.work_request = reinterpret_cast<const std::int32_t*>(base + plan.layout.work_request);
  params.work_split = reinterpret_cast<const std::int32_t*>(base + plan.layout.work_split);
  params.split_indptr = reinterpret_cast<const std::int32_t*>(base + plan.layout.split_indptr);
  params.chunk_tokens = plan.chunk_tokens;
  params.split_kv = plan.split_kv;
  params.partial_o = reinterpret_cast<float*>(base + plan.layout.partial_o);
  params.partial_lse = reinterpret_cast<float*>(base + plan.layout.partial_lse);

  const dim3 grid(static_cast<unsigned>(plan.num_work_items), static_cast<unsigned>(p.num_kv_heads));
  SLIMSERVE_RETURN_IF_ERROR(launch(params, grid, dim3(static_cast<unsigned>(shape.threads())), stream));
  if (!plan.split_kv) return {};

  MergeArguments merge;
  merge.partial_o = params.partial_o;
  merge.partial_lse = params.partial_lse;
  merge.split_indptr = params.split_indptr;
  merge.batch_size = p.batch_size;
  merge.rows_per_request = p.query_tokens * p.num_qo_heads;
  merge.head_dim = p.head_dim;
  merge.o = a.o;
  merge.lse = a.lse;
  merge.out_dtype = a.q_dtype;
  return merge_attention_states(merge, stream);
}

Status can_implement(const MergeArguments& a) {
  if (!is_valid(a.out_dtype)) {
    return make_status(StatusCode::invalid_argument, "unknown activation dtype ",
                       static_cast<int>(a.out_dtype));
  }
  if (!supported_head_dim(a.head_dim)) {
    return make_status(StatusCode::unsupported, "head_dim ", a.head_dim, " is not supported");
  }
  if (a.batch_size < 0 || a.rows_per_request < 0 || a.rows_per_request > 65535) {
    return make_status(StatusCode::invalid_argument, "merge of batch_size ", a.batch_size, " x ",
                       a.rows_per_request, " rows per request is out of range");
  }
  if (a.batch_size == 0 || a.rows_per_request == 0) return {};
  if (a.partial_o == nullptr || a.partial_lse == nullptr || a.split_indptr == nullptr || a.o == nullptr) {
    return make_status(StatusCode::invalid_argument, "merge inputs and output must be non-null");
  }
  return {};
}

Status merge_attention_states(const MergeArguments& a, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(can_implement(a));
  if (a.batch_size == 0 || a.rows_per_request == 0) return {};
  kernels::MergeParams params{a.partial_o, a.partial_lse, a.split_indptr, a.o, a.lse,
                              a.rows_per_request, a.head_dim};
  const rt::LaunchConfig config{dim3(static_cast<unsigned>(a.batch_size), static_cast<unsigned>(a.rows_per_request)),
                                dim3(static_cast<unsigned>(a.head_dim)), 0, stream};
  return a.out_dtype == ActivationDtype::bf16
             ? rt::launch(kernels::merge_states_kernel<bf16>, config, params)
             : rt::launch(kernels::merge_states_kernel<fp16>, config, params);
}

}  // namespace attention
SLIMSERVE_NAMESPACE_END
