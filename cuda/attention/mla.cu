// Façade of MLA attention: append, decode (plan upload, preflight, dispatch, split merge) and
// the prefix gather.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "mla_tables.cuh"
#include "slimserve/attention/kernels/paged_attention_kernel.cuh"
#include "slimserve/attention/mla.hpp"
#include "slimserve/detail/preflight.hpp"
#include "slimserve/runtime/memory.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {
namespace {

using preflight::aligned16;

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

Status check_stride(std::int64_t stride, const char* what) {
  if (stride < 0 || stride % 8 != 0) {
    return make_status(StatusCode::invalid_argument, what, " must be a non-negative multiple of 8 elements "
                       "(16-byte rows), got ", stride);
  }
  return {};
}

Status check_workspace(const MlaDecodePlan& plan, const void* workspace, std::size_t bytes) {
  if (workspace == nullptr || bytes < plan.layout.total_bytes) {
    return make_status(StatusCode::resource_exhausted, "MLA decode workspace of ", bytes, " bytes (",
                       workspace == nullptr ? "null" : "non-null", "); the plan needs ", plan.layout.total_bytes);
  }
  if (!aligned16(workspace)) {
    return make_status(StatusCode::invalid_argument, "MLA decode workspace must be 16-byte aligned");
  }
  return {};
}

}  // namespace

// ---- append ---------------------------------------------------------------------------------

Status append_mla(const MlaAppendArguments& a, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(validate_mla_cache_view(a.cache));
  if (a.num_tokens < 0) {
    return make_status(StatusCode::invalid_argument, "num_tokens ", a.num_tokens, " < 0");
  }
  if (a.table.page_size != a.cache.page_size || a.table.batch_size < 0) {
    return make_status(StatusCode::invalid_argument, "page table has page_size ", a.table.page_size,
                       " and batch_size ", a.table.batch_size, "; the cache has page_size ", a.cache.page_size);
  }
  const bool explicit_form = a.token_request != nullptr || a.token_position != nullptr;
  if (explicit_form == (a.append_indptr != nullptr) ||
      (explicit_form && (a.token_request == nullptr || a.token_position == nullptr))) {
    return make_status(StatusCode::invalid_argument,
                       "give destinations as token_request + token_position, or as append_indptr (exactly one)");
  }
  if (a.num_tokens == 0) return {};
  if (a.table.indptr == nullptr || a.table.indices == nullptr || a.table.last_page_len == nullptr) {
    return make_status(StatusCode::invalid_argument, "page table arrays must be non-null");
  }
  if (a.latent_new == nullptr || a.rope_new == nullptr || !aligned16(a.latent_new) || !aligned16(a.rope_new)) {
    return make_status(StatusCode::invalid_argument, "latent_new and rope_new must be non-null and 16-byte aligned");
  }
  SLIMSERVE_RETURN_IF_ERROR(check_stride(a.latent_stride, "latent_stride"));
  SLIMSERVE_RETURN_IF_ERROR(check_stride(a.rope_stride, "rope_stride"));
  if ((a.latent_stride != 0 && a.latent_stride < mla_latent_dim) || (a.rope_stride != 0 && a.rope_stride < mla_rope_dim)) {
    return make_status(StatusCode::invalid_argument, "latent_stride (", a.latent_stride, ") and rope_stride (",
                       a.rope_stride, ") must cover a row of 512 and 64 elements");
  }
  const detail::MlaAppendKernelEntry* entry = nullptr;
  for (const auto& candidate : detail::mla_append_kernels()) {
    if (candidate.kv_dtype == a.cache.dtype && candidate.input_dtype == a.input_dtype) entry = &candidate;
  }
  if (entry == nullptr) {
    return make_status(StatusCode::unsupported, "no MLA append kernel for a ", to_string(a.cache.dtype), " cache");
  }
  const MlaTokenLayout layout = a.cache.token_layout();
  kernels::MlaAppendParams params{};
  kernels::AppendParams& d = params.destination;
  d.num_pages = a.cache.num_pages;
  d.page_size = a.cache.page_size;
  d.indptr = a.table.indptr;
  d.indices = a.table.indices;
  d.last_page_len = a.table.last_page_len;
  d.status = a.request_status;
  d.batch_size = a.table.batch_size;
  d.token_request = a.token_request;
  d.token_position = a.token_position;
  d.append_indptr = a.append_indptr;
  d.num_tokens = a.num_tokens;
  params.pages = static_cast<unsigned char*>(a.cache.pages);
  params.latent_scale = a.cache.latent_scale;
  params.token_bytes = layout.token_bytes;
  params.scales_offset = layout.scales_offset;
  params.rope_offset = layout.rope_offset;
  params.scale_mode = a.cache.scale_mode;
  params.latent_new = a.latent_new;
  params.rope_new = a.rope_new;
  params.latent_stride = a.latent_stride != 0 ? a.latent_stride : mla_latent_dim;
  params.rope_stride = a.rope_stride != 0 ? a.rope_stride : mla_rope_dim;
  return entry->launch(params, dim3(static_cast<unsigned>(a.num_tokens)), stream);
}

// ---- decode ---------------------------------------------------------------------------------

Result<MlaDecodePlan> plan_mla_decode(MlaDecodePlanArguments args, void* workspace, std::size_t workspace_bytes,
                                      cudaStream_t stream) {
  if (args.num_sms == 0) args.num_sms = device_sm_count();
  Result<MlaDecodePlan> plan = make_mla_decode_plan(args);
  if (!plan.ok()) return plan;
  SLIMSERVE_RETURN_IF_ERROR(check_workspace(*plan, workspace, workspace_bytes));
  // From pageable memory: the copy has consumed the host buffer when this returns.
  SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(workspace, plan->host_ints.data(), plan->layout.int_bytes,
                                           rt::CopyDirection::host_to_device, stream));
  return plan;
}

Status run_mla_decode(const MlaDecodeArguments& a, const MlaDecodePlan& plan, void* workspace,
                      std::size_t workspace_bytes, cudaStream_t stream) {
  const MlaDecodeProblem& p = plan.problem;
  SLIMSERVE_RETURN_IF_ERROR(validate_mla_decode_problem(p));
  SLIMSERVE_RETURN_IF_ERROR(validate_mla_cache_view(a.cache));
  if (a.cache.dtype != p.kv_dtype || a.cache.scale_mode != p.scale_mode || a.cache.page_size != p.page_size) {
    return make_status(StatusCode::invalid_argument, "the plan was made for a ", to_string(p.kv_dtype), " (",
                       to_string(p.scale_mode), ") cache with page_size ", p.page_size, "; the cache is ",
                       to_string(a.cache.dtype), " (", to_string(a.cache.scale_mode), ") with ", a.cache.page_size);
  }
  SLIMSERVE_RETURN_IF_ERROR(check_workspace(plan, workspace, workspace_bytes));
  const bool csr = a.table.indptr != nullptr;
  if (csr == (a.block_table.block_table != nullptr)) {
    return make_status(StatusCode::invalid_argument,
                       "give the page table as CSR (table) or as a block table (block_table), exactly one");
  }
  if (csr) {
    if (a.table.batch_size != p.batch_size || a.table.page_size != p.page_size || a.table.indices == nullptr ||
        a.table.last_page_len == nullptr) {
      return make_status(StatusCode::invalid_argument, "CSR page table has batch_size ", a.table.batch_size,
                         " and page_size ", a.table.page_size, " (and needs indices, last_page_len); the plan has ",
                         p.batch_size, " and ", p.page_size);
    }
  } else if (a.block_table.batch_size != p.batch_size || a.block_table.page_size != p.page_size ||
             a.block_table.seq_lens == nullptr || a.block_table.max_pages_per_request < 1) {
    return make_status(StatusCode::invalid_argument, "block table has batch_size ", a.block_table.batch_size,
                       ", page_size ", a.block_table.page_size, " and ", a.block_table.max_pages_per_request,
                       " pages per request (and needs seq_lens); the plan has ", p.batch_size, " and ", p.page_size);
  }
  if (a.q == nullptr || a.o == nullptr || !aligned16(a.q) || !aligned16(a.o)) {
    return make_status(StatusCode::invalid_argument, "q and o must be non-null and 16-byte aligned");
  }
  for (const std::int64_t stride : {a.q_token_stride, a.q_head_stride, a.o_token_stride, a.o_head_stride}) {
    SLIMSERVE_RETURN_IF_ERROR(check_stride(stride, "q/o strides"));
  }
  if (!std::isfinite(a.sm_scale) || !(a.sm_scale > 0.0f)) {
    return make_status(StatusCode::invalid_argument, "sm_scale must be finite and > 0 (DeepSeek-V3: 1/sqrt(192)), got ",
                       a.sm_scale);
  }
  if (p.batch_size == 0 || plan.num_work_items == 0) return {};

  const detail::MlaDecodeKernelEntry* entry = nullptr;
  for (const auto& candidate : detail::mla_decode_kernels()) {
    if (candidate.kv_dtype == p.kv_dtype && candidate.warps_m == plan.warps_m) entry = &candidate;
  }
  if (entry == nullptr) {
    return make_status(StatusCode::unsupported, "no MLA decode kernel for a ", to_string(p.kv_dtype),
                       " cache with ", plan.cta_rows, " rows per CTA");
  }

  auto* base = static_cast<unsigned char*>(workspace);
  auto ints = [&](std::size_t offset) { return reinterpret_cast<const std::int32_t*>(base + offset); };
  const MlaTokenLayout layout = a.cache.token_layout();
  kernels::MlaDecodeParams params{};
  params.pages = static_cast<const unsigned char*>(a.cache.pages);
  params.latent_scale = a.cache.latent_scale;
  params.num_pages = a.cache.num_pages;
  params.page_size = p.page_size;
  params.page_shift = log2_exact(p.page_size);
  params.token_bytes = layout.token_bytes;
  params.scales_offset = layout.scales_offset;
  params.rope_offset = layout.rope_offset;
  params.scale_mode = p.scale_mode;
  if (csr) {
    params.indptr = a.table.indptr;
    params.indices = a.table.indices;
    params.last_page_len = a.table.last_page_len;
  } else {
    params.block_table = a.block_table.block_table;
    params.block_table_stride = a.block_table.max_pages_per_request;
    params.seq_lens = a.block_table.seq_lens;
  }
  params.status = a.request_status;
  params.q = a.q;
  params.o = a.o;
  params.lse = a.lse;
  params.q_token_stride = a.q_token_stride != 0 ? a.q_token_stride : static_cast<std::int64_t>(p.num_heads) * mla_qk_dim;
  params.q_head_stride = a.q_head_stride != 0 ? a.q_head_stride : mla_qk_dim;
  params.o_token_stride = a.o_token_stride != 0 ? a.o_token_stride : static_cast<std::int64_t>(p.num_heads) * mla_latent_dim;
  params.o_head_stride = a.o_head_stride != 0 ? a.o_head_stride : mla_latent_dim;
  params.num_heads = p.num_heads;
  params.qo_indptr = ints(plan.layout.qo_indptr);
  params.score_scale = a.sm_scale * kernels::paged_log2_e;
  params.work_request = ints(plan.layout.work_request);
  params.work_row_tile = ints(plan.layout.work_row_tile);
  params.work_split = ints(plan.layout.work_split);
  params.work_num_splits = ints(plan.layout.work_num_splits);
  params.chunk_tokens = plan.chunk_tokens;
  params.split_kv = plan.split_kv;
  params.partial_o = reinterpret_cast<float*>(base + plan.layout.partial_o);
  params.partial_lse = reinterpret_cast<float*>(base + plan.layout.partial_lse);
  SLIMSERVE_RETURN_IF_ERROR(entry->launch(params, dim3(static_cast<unsigned>(plan.num_work_items)), stream));
  if (!plan.split_kv) return {};

  // The paged attention merge, with one "KV head" whose group is every query head.
  kernels::PagedMergeParams merge{};
  merge.partial_o = params.partial_o;
  merge.partial_lse = params.partial_lse;
  merge.unit_request = ints(plan.layout.unit_request);
  merge.unit_row_tile = ints(plan.layout.unit_row_tile);
  merge.unit_indptr = ints(plan.layout.unit_indptr);
  merge.qo_indptr = ints(plan.layout.qo_indptr);
  merge.o = a.o;
  merge.lse = a.lse;
  merge.o_token_stride = params.o_token_stride;
  merge.o_head_stride = params.o_head_stride;
  merge.sinks = nullptr;
  merge.num_kv_heads = 1;
  merge.num_qo_heads = p.num_heads;
  merge.group_size = p.num_heads;
  merge.cta_rows = plan.cta_rows;
  merge.head_dim = mla_latent_dim;
  const rt::LaunchConfig config{dim3(static_cast<unsigned>(plan.num_units), static_cast<unsigned>(plan.cta_rows)),
                                dim3(static_cast<unsigned>(mla_latent_dim)), 0, stream};
  return rt::launch(kernels::paged_merge_kernel<bf16>, config, merge);
}

// ---- gather ---------------------------------------------------------------------------------

Status gather_mla_latent(const MlaGatherArguments& a, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(validate_mla_cache_view(a.cache));
  if (a.num_rows < 0 || a.table.batch_size < 0 || a.table.page_size != a.cache.page_size) {
    return make_status(StatusCode::invalid_argument, "gather needs num_rows >= 0 (", a.num_rows,
                       ") and a page table of the cache's page_size (", a.table.page_size, " vs ", a.cache.page_size, ")");
  }
  if (a.num_rows == 0) return {};
  if (a.table.indptr == nullptr || a.table.indices == nullptr || a.table.last_page_len == nullptr ||
      a.token_indptr == nullptr) {
    return make_status(StatusCode::invalid_argument, "page table arrays and token_indptr must be non-null");
  }
  if (a.out == nullptr || !aligned16(a.out)) {
    return make_status(StatusCode::invalid_argument, "out must be non-null and 16-byte aligned");
  }
  SLIMSERVE_RETURN_IF_ERROR(check_stride(a.out_stride, "out_stride"));
  if (a.out_stride != 0 && a.out_stride < mla_qk_dim) {
    return make_status(StatusCode::invalid_argument, "out_stride ", a.out_stride, " < 576");
  }
  const detail::MlaGatherKernelEntry* entry = nullptr;
  for (const auto& candidate : detail::mla_gather_kernels()) {
    if (candidate.kv_dtype == a.cache.dtype) entry = &candidate;
  }
  if (entry == nullptr) {
    return make_status(StatusCode::unsupported, "no MLA gather kernel for a ", to_string(a.cache.dtype), " cache");
  }
  const MlaTokenLayout layout = a.cache.token_layout();
  kernels::MlaGatherParams params{};
  params.pages = static_cast<const unsigned char*>(a.cache.pages);
  params.latent_scale = a.cache.latent_scale;
  params.num_pages = a.cache.num_pages;
  params.page_size = a.cache.page_size;
  params.token_bytes = layout.token_bytes;
  params.scales_offset = layout.scales_offset;
  params.rope_offset = layout.rope_offset;
  params.scale_mode = a.cache.scale_mode;
  params.indptr = a.table.indptr;
  params.indices = a.table.indices;
  params.last_page_len = a.table.last_page_len;
  params.status = a.request_status;
  params.batch_size = a.table.batch_size;
  params.token_indptr = a.token_indptr;
  params.out = static_cast<bf16*>(a.out);
  params.out_stride = a.out_stride != 0 ? a.out_stride : mla_qk_dim;
  return entry->launch(params, dim3(static_cast<unsigned>(a.num_rows)), stream);
}

}  // namespace attention
SLIMSERVE_NAMESPACE_END
