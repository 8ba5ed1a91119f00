// Façade of tensor-core paged attention: plan upload, preflight, dispatch, split merge.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "paged_attention_tables.cuh"
#include "slimserve/attention/decode.hpp"
#include "slimserve/attention/paged_attention.hpp"
#include "slimserve/detail/preflight.hpp"
#include "slimserve/runtime/memory.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {
namespace {

using preflight::aligned16;

std::span<const detail::PagedAttentionKernelEntry> paged_table(KvDtype dtype) {
  return detail::paged_attention_table(dtype);
}

std::int32_t device_sm_count() {
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

std::int32_t log2_exact(std::int32_t x) {
  std::int32_t shift = 0;
  while ((1 << shift) < x) ++shift;
  return shift;
}

Status check_workspace(const PagedAttentionPlan& plan, const void* workspace, std::size_t bytes) {
  if (workspace == nullptr || bytes < plan.layout.total_bytes) {
    return make_status(StatusCode::resource_exhausted, "paged attention workspace of ", bytes,
                       " bytes (", workspace == nullptr ? "null" : "non-null",
                       "); the plan needs ", plan.layout.total_bytes);
  }
  if (!aligned16(workspace)) {
    return make_status(StatusCode::invalid_argument, "paged attention workspace must be 16-byte aligned");
  }
  return {};
}

/// The page table in exactly one form, shaped for the plan; a block table must hold the
/// pages of the plan's longest request (seq_len <= max_pages_per_request * page_size).
Status check_page_table(const PagedAttentionArguments& a, const PagedAttentionPlan& plan) {
  const PagedAttentionProblem& p = plan.problem;
  const bool csr = a.table.indptr != nullptr;
  if (csr == (a.block_table.block_table != nullptr)) {
    return make_status(StatusCode::invalid_argument,
                       "give the page table as CSR (table) or as a block table (block_table), exactly one");
  }
  if (csr) {
    if (a.table.batch_size != p.batch_size || a.table.page_size != p.page_size ||
        a.table.indices == nullptr || a.table.last_page_len == nullptr) {
      return make_status(StatusCode::invalid_argument, "CSR page table has batch_size ", a.table.batch_size,
                         " and page_size ", a.table.page_size, " (and needs indices, last_page_len); the plan has ",
                         p.batch_size, " and ", p.page_size);
    }
    return {};
  }
  const kv::BlockTableView& bt = a.block_table;
  if (bt.batch_size != p.batch_size || bt.page_size != p.page_size || bt.seq_lens == nullptr ||
      bt.max_pages_per_request < 1) {
    return make_status(StatusCode::invalid_argument, "block table has batch_size ", bt.batch_size,
                       ", page_size ", bt.page_size, " and ", bt.max_pages_per_request,
                       " pages per request (and needs seq_lens); the plan has ", p.batch_size, " and ",
                       p.page_size);
  }
  const std::int64_t capacity = static_cast<std::int64_t>(bt.max_pages_per_request) * bt.page_size;
  if (plan.max_kv_tokens > capacity) {
    return make_status(StatusCode::invalid_argument, "the plan's longest request has ", plan.max_kv_tokens,
                       " tokens; a block table row of ", bt.max_pages_per_request, " pages of ",
                       bt.page_size, " holds ", capacity);
  }
  return {};
}

/// Elements from one page to the next in k_pages and v_pages.
/// Storage elements between pages (bytes for NVFP4), the packed page's when page_stride is 0.
std::int64_t page_stride_of(const PagedKVCacheView& cache) {
  return cache.page_stride != 0 ? cache.page_stride : packed_page_elements(cache);
}

Status check_run_arguments(const PagedAttentionArguments& a, const PagedAttentionProblem& p) {
  SLIMSERVE_RETURN_IF_ERROR(validate_cache_view(a.cache));
  if (a.cache.dtype != p.kv_dtype || a.cache.head_dim != p.head_dim ||
      a.cache.page_size != p.page_size || a.cache.num_kv_heads != p.num_kv_heads) {
    return make_status(StatusCode::invalid_argument, "the plan was made for a ",
                       to_string(p.kv_dtype), " cache with page_size ", p.page_size, ", ",
                       p.num_kv_heads, " KV heads of head_dim ", p.head_dim, "; the cache is ",
                       to_string(a.cache.dtype), " with ", a.cache.page_size, ", ",
                       a.cache.num_kv_heads, ", ", a.cache.head_dim);
  }
  if (p.batch_size > 0 && a.qo_indptr == nullptr) {
    return make_status(StatusCode::invalid_argument, "qo_indptr must be non-null");
  }
  if (a.q == nullptr || a.o == nullptr) {
    return make_status(StatusCode::invalid_argument, "q and o must be non-null");
  }
  if (!aligned16(a.q) || !aligned16(a.o) || !aligned16(a.cache.k_pages) || !aligned16(a.cache.v_pages)) {
    return make_status(StatusCode::invalid_argument, "q, o and the K/V pages must be 16-byte aligned");
  }
  for (const std::int64_t stride : {a.q_token_stride, a.q_head_stride, a.o_token_stride, a.o_head_stride}) {
    if (stride < 0 || stride % 8 != 0) {
      return make_status(StatusCode::invalid_argument, "q/o strides must be non-negative multiples of 8 "
                         "elements (16-byte rows), got ", stride);
    }
  }
  if (a.sm_scale && (!std::isfinite(*a.sm_scale) || !(*a.sm_scale > 0.0f))) {
    return make_status(StatusCode::invalid_argument, "sm_scale must be finite and > 0, got ", *a.sm_scale);
  }
  if (a.window_left < -1) {
    return make_status(StatusCode::invalid_argument, "window_left must be >= 0 (or -1: no window), got ",
                       a.window_left);
  }
  const bool fused = a.chunk_kv.k != nullptr || a.chunk_kv.v != nullptr;
  if (fused) {
    if (a.chunk_kv.k == nullptr || a.chunk_kv.v == nullptr) {
      return make_status(StatusCode::invalid_argument, "fused prefill needs both chunk_kv.k and chunk_kv.v");
    }
    if (!aligned16(a.chunk_kv.k) || !aligned16(a.chunk_kv.v)) {
      return make_status(StatusCode::invalid_argument, "chunk_kv.k and chunk_kv.v must be 16-byte aligned");
    }
    for (const std::int64_t stride : {a.chunk_kv.token_stride, a.chunk_kv.head_stride}) {
      if (stride < 0 || stride % 8 != 0) {
        return make_status(StatusCode::invalid_argument, "chunk_kv strides must be non-negative multiples "
                           "of 8 elements (16-byte rows), got ", stride);
      }
    }
    // Every format takes it (NVFP4 too); what remains is the cache's geometry, checked after
    // chunk_kv's own arguments: the fused append writes slots with append_kv's page store,
    // whose offsets assume packed pages (a strided or combined K/V allocation is refused by
    // its page_stride, whatever the format).
    SLIMSERVE_RETURN_IF_ERROR(
        require_packed_pages(a.cache, "fused prefill (chunk_kv: quantize-and-append of the chunk)"));
  }
  if (!is_valid(a.rotation)) {
    return make_status(StatusCode::invalid_argument, "paged attention: unknown rotation ",
                       static_cast<int>(a.rotation), " (none, keys or keys_and_values)");
  }
  if (a.rotation != KvRotation::none) {
    if (!RotationHeadDims::contains(p.head_dim)) {
      return make_status(StatusCode::unsupported, "paged attention: rotation ", to_string(a.rotation),
                         " needs head_dim 64, 128 or 256, got ", p.head_dim);
    }
    if (fused) {
      return make_status(StatusCode::unsupported, "paged attention: rotation ", to_string(a.rotation),
                         " has no fused prefill (chunk_kv): append the chunk with append_kv and the same "
                         "rotation, then run paged attention over the pages");
    }
  }
  if (!std::isfinite(a.logit_soft_cap) || a.logit_soft_cap < 0.0f) {
    return make_status(StatusCode::invalid_argument, "logit_soft_cap must be finite and >= 0 (0: none), got ",
                       a.logit_soft_cap);
  }
  return {};
}

}  // namespace

Result<PagedAttentionPlan> plan_paged_attention(PagedAttentionPlanArguments args, void* workspace,
                                                std::size_t workspace_bytes, cudaStream_t stream) {
  if (args.num_sms == 0) args.num_sms = device_sm_count();
  Result<PagedAttentionPlan> plan = make_paged_attention_plan(args);
  if (!plan.ok()) return plan;
  SLIMSERVE_RETURN_IF_ERROR(check_workspace(*plan, workspace, workspace_bytes));
  // From pageable memory: the copy has consumed the host buffer when this returns.
  SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(workspace, plan->host_ints.data(), plan->layout.int_bytes,
                                           rt::CopyDirection::host_to_device, stream));
  if (plan->decode) {
    SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(static_cast<unsigned char*>(workspace) + plan->decode_offset,
                                             plan->decode->host_ints.data(), plan->decode->layout.int_bytes,
                                             rt::CopyDirection::host_to_device, stream));
  }
  return plan;
}

AttentionKernel kernel_for_run(const PagedAttentionArguments& a, const PagedAttentionPlan& plan) {
  const bool tensor_core_only = a.window_left >= 0 || a.logit_soft_cap > 0.0f || a.sinks != nullptr ||
                                a.q_token_stride != 0 || a.q_head_stride != 0 || a.o_token_stride != 0 ||
                                a.o_head_stride != 0 || a.chunk_kv.k != nullptr || a.chunk_kv.v != nullptr ||
                                a.rotation != KvRotation::none ||
                                a.table.indptr == nullptr ||  // block table: the CUDA-core decode takes CSR
                                (a.cache.page_stride != 0 &&  // ... and packed pages
                                 a.cache.page_stride != packed_page_elements(a.cache));
  return plan.decode && !tensor_core_only ? AttentionKernel::cuda_core : AttentionKernel::tensor_core;
}

bool runs_warpgroup_mma(const PagedAttentionArguments& a, const PagedAttentionPlan& plan) {
  return plan.warpgroup_mma && kernel_for_run(a, plan) == AttentionKernel::tensor_core &&
         a.cache.scale_mode != KvScaleMode::per_token && a.chunk_kv.k == nullptr && a.chunk_kv.v == nullptr &&
         a.rotation == KvRotation::none;
}

Status run_paged_attention(const PagedAttentionArguments& a, const PagedAttentionPlan& plan,
                           void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  const PagedAttentionProblem& p = plan.problem;
  SLIMSERVE_RETURN_IF_ERROR(validate_paged_attention_problem(p));
  SLIMSERVE_RETURN_IF_ERROR(check_run_arguments(a, p));
  SLIMSERVE_RETURN_IF_ERROR(check_workspace(plan, workspace, workspace_bytes));
  if (p.batch_size == 0 || plan.num_work_items == 0) return {};
  SLIMSERVE_RETURN_IF_ERROR(check_page_table(a, plan));
  if (kernel_for_run(a, plan) == AttentionKernel::cuda_core) {
    // The plan's choice (see choose_attention_kernel): the CUDA-core decode kernel.
    DecodeArguments d;
    d.cache = a.cache;
    d.table = a.table;
    d.request_status = a.request_status;
    d.q = a.q;
    d.o = a.o;
    d.lse = a.lse;
    d.q_dtype = p.q_dtype;
    d.sm_scale = a.sm_scale.value_or(1.0f / std::sqrt(static_cast<float>(p.head_dim)));
    return run_decode(d, *plan.decode, static_cast<unsigned char*>(workspace) + plan.decode_offset,
                      workspace_bytes - plan.decode_offset, stream);
  }

  const detail::PagedAttentionKernelEntry* entry = nullptr;
  for (const auto& candidate : paged_table(p.kv_dtype)) {
    if (candidate.q_dtype == p.q_dtype && candidate.head_dim == p.head_dim) entry = &candidate;
  }
  if (entry == nullptr) {
    return make_status(StatusCode::unsupported, "no paged attention kernel for a ",
                       to_string(p.kv_dtype), " cache with head_dim ", p.head_dim);
  }

  auto* base = static_cast<unsigned char*>(workspace);
  auto ints = [&](std::size_t offset) { return reinterpret_cast<const std::int32_t*>(base + offset); };
  const std::int64_t packed_head = p.head_dim;
  const std::int64_t packed_token = static_cast<std::int64_t>(p.num_qo_heads) * p.head_dim;
  const float sm_scale = a.sm_scale.value_or(1.0f / std::sqrt(static_cast<float>(p.head_dim)));

  kernels::PagedAttentionParams params{};
  detail::fill_paged_cache_fields(params, a.cache, a.table, a.request_status);
  if (a.table.indptr == nullptr) {  // block-table form (check_page_table: exactly one)
    params.block_table = a.block_table.block_table;
    params.block_table_stride = a.block_table.max_pages_per_request;
    params.seq_lens = a.block_table.seq_lens;
  }
  params.page_stride = page_stride_of(a.cache);
  params.page_size = p.page_size;
  params.page_shift = log2_exact(p.page_size);
  params.num_kv_heads = p.num_kv_heads;
  params.qo_indptr = a.qo_indptr;
  params.q = a.q;
  params.o = a.o;
  params.lse = a.lse;
  params.q_token_stride = a.q_token_stride != 0 ? a.q_token_stride : packed_token;
  params.q_head_stride = a.q_head_stride != 0 ? a.q_head_stride : packed_head;
  params.o_token_stride = a.o_token_stride != 0 ? a.o_token_stride : packed_token;
  params.o_head_stride = a.o_head_stride != 0 ? a.o_head_stride : packed_head;
  params.num_qo_heads = p.num_qo_heads;
  params.group_size = p.num_qo_heads / p.num_kv_heads;
  params.sm_scale = sm_scale;
  params.score_scale = sm_scale * kernels::paged_log2_e;
  params.soft_cap = a.logit_soft_cap;
  params.window_left = a.window_left;
  params.causal = p.causal;
  params.rotation = a.rotation;
  params.sinks = a.sinks;
  params.warps_m = plan.warps_m;
  params.cta_rows = plan.cta_rows;
  params.work_request = ints(plan.layout.work_request);
  params.work_row_tile = ints(plan.layout.work_row_tile);
  params.work_split = ints(plan.layout.work_split);
  params.work_num_splits = ints(plan.layout.work_num_splits);
  params.chunk_tokens = plan.chunk_tokens;
  params.split_kv = plan.split_kv;
  params.partial_o = reinterpret_cast<float*>(base + plan.layout.partial_o);
  params.partial_lse = reinterpret_cast<float*>(base + plan.layout.partial_lse);
  const bool fused = a.chunk_kv.k != nullptr;
  if (fused) {
    params.chunk.k = a.chunk_kv.k;
    params.chunk.v = a.chunk_kv.v;
    params.chunk.token_stride = a.chunk_kv.token_stride != 0
                                    ? a.chunk_kv.token_stride
                                    : static_cast<std::int64_t>(p.num_kv_heads) * p.head_dim;
    params.chunk.head_stride = a.chunk_kv.head_stride != 0 ? a.chunk_kv.head_stride : packed_head;
    params.chunk.k_pages = a.cache.k_pages;
    params.chunk.v_pages = a.cache.v_pages;
    params.chunk.k_token_scales = a.cache.k_token_scales;
    params.chunk.v_token_scales = a.cache.v_token_scales;
  }

  const dim3 grid(static_cast<unsigned>(plan.num_work_items), static_cast<unsigned>(p.num_kv_heads));
  const bool wgmma = runs_warpgroup_mma(a, plan) && entry->launch_wgmma != nullptr;
  const detail::PagedAttentionLauncher wgmma_launch =
      plan.wgmma_kernel == PrefillWgmmaKernel::ping_pong ? entry->launch_wgmma_ping_pong : entry->launch_wgmma;
  const bool rotated = a.rotation != KvRotation::none;
  if (rotated && entry->launch_rotated == nullptr) {  // check_run_arguments refused other head dims
    return make_status(StatusCode::unsupported, "paged attention: no rotated kernel for head_dim ", p.head_dim);
  }
  SLIMSERVE_RETURN_IF_ERROR((fused     ? entry->launch_fused
                             : rotated ? entry->launch_rotated
                             : wgmma   ? wgmma_launch
                                       : entry->launch)(params, grid, stream));
  if (!plan.split_kv) return {};

  kernels::PagedMergeParams merge{};
  merge.partial_o = params.partial_o;
  merge.partial_lse = params.partial_lse;
  merge.unit_request = ints(plan.layout.unit_request);
  merge.unit_row_tile = ints(plan.layout.unit_row_tile);
  merge.unit_indptr = ints(plan.layout.unit_indptr);
  merge.qo_indptr = a.qo_indptr;
  merge.o = a.o;
  merge.lse = a.lse;
  merge.o_token_stride = params.o_token_stride;
  merge.o_head_stride = params.o_head_stride;
  merge.sinks = a.sinks;
  merge.num_kv_heads = p.num_kv_heads;
  merge.num_qo_heads = p.num_qo_heads;
  merge.group_size = params.group_size;
  merge.cta_rows = plan.cta_rows;
  merge.head_dim = p.head_dim;
  const rt::LaunchConfig config{dim3(static_cast<unsigned>(plan.num_units),
                                     static_cast<unsigned>(p.num_kv_heads * plan.cta_rows)),
                                dim3(static_cast<unsigned>(p.head_dim)), 0, stream};
  return p.q_dtype == ActivationDtype::bf16
             ? rt::launch(kernels::paged_merge_kernel<bf16>, config, merge)
             : rt::launch(kernels::paged_merge_kernel<fp16>, config, merge);
}

}  // namespace attention
SLIMSERVE_NAMESPACE_END
