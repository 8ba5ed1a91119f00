// The C ABI's paged-attention entry points added in ABI 2 (include/slimserve/c/slimserve.h):
// block tables and their tag check, tensor-core paged attention (plan / run, CSR or block
// table, combined or separate K/V, strided q/o, fused mixed-dtype prefill, window / soft-cap /
// sinks), the merge of partial states and page dequantization. Each entry point reads its
// versioned struct, converts it to the C++ Arguments and calls the façade, whose preflight
// names what is wrong. Exported under the version node SLIMSERVE_C_2.
#include <cstddef>
#include <cstdint>
#include <utility>

#include "c_support.hpp"
#include "slimserve/attention/decode.hpp"
#include "slimserve/attention/dequantize.hpp"
#include "slimserve/attention/paged_attention.hpp"
#include "slimserve/c/slimserve.h"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/tag_check.hpp"

struct slimserve_paged_attention_plan {
  slimserve::attention::PagedAttentionPlan plan;
  std::int64_t total_qo_tokens = 0;  // rows of o, for the run's overlap check
};

namespace {

using namespace slimserve_capi;

// The block table is converted field by field, but keep the C struct a mirror of the C++ view
// so that an engine may hand either to code that expects the other.
static_assert(sizeof(slimserve_block_table_view) == sizeof(kv::BlockTableView));
static_assert(offsetof(slimserve_block_table_view, seq_lens) == offsetof(kv::BlockTableView, seq_lens));
static_assert(offsetof(slimserve_block_table_view, page_size) == offsetof(kv::BlockTableView, page_size));
static_assert(SLIMSERVE_KERNEL_CUDA_CORE == static_cast<int>(attention::AttentionKernel::cuda_core));

Status to_problem(const slimserve_paged_attention_problem& p, attention::PagedAttentionProblem& out) {
  out.batch_size = p.batch_size;
  out.num_qo_heads = p.num_qo_heads;
  out.num_kv_heads = p.num_kv_heads;
  out.head_dim = p.head_dim;
  out.page_size = p.page_size;
  SLIMSERVE_RETURN_IF_ERROR(to_kv_dtype(p.kv_dtype, out.kv_dtype));
  SLIMSERVE_RETURN_IF_ERROR(to_activation(p.q_dtype, "activation dtype", out.q_dtype));
  if (p.mask != SLIMSERVE_MASK_CAUSAL && p.mask != SLIMSERVE_MASK_NONE) {
    return make_status(StatusCode::invalid_argument, "unknown attention mask ", p.mask);
  }
  out.causal = p.mask == SLIMSERVE_MASK_CAUSAL;
  return attention::validate_paged_attention_problem(out);
}

Status to_plan_arguments(const slimserve_paged_attention_plan_args* in,
                         attention::PagedAttentionPlanArguments& out) {
  slimserve_paged_attention_plan_args a;
  // warpgroup_mma came after the struct's first version: a caller's struct may end before it.
  SLIMSERVE_RETURN_IF_ERROR(
      read_versioned(in, "plan args", a, offsetof(slimserve_paged_attention_plan_args, warpgroup_mma)));
  SLIMSERVE_RETURN_IF_ERROR(to_problem(a.problem, out.problem));
  const auto batch = static_cast<std::size_t>(out.problem.batch_size);
  if (a.qo_indptr_host == nullptr) return null_argument("qo_indptr_host");
  SLIMSERVE_RETURN_IF_ERROR(
      check_length_form(a.kv_indptr_host, a.last_page_len_host, a.seq_lens_host, out.problem.batch_size));
  out.qo_indptr_host = host_span(a.qo_indptr_host, batch + 1);
  out.kv_indptr_host = host_span(a.kv_indptr_host, batch + 1);
  out.last_page_len_host = host_span(a.last_page_len_host, batch);
  out.seq_lens_host = host_span(a.seq_lens_host, batch);
  out.num_sms = a.num_sms;
  if (a.ctas_per_sm != 0) out.ctas_per_sm = a.ctas_per_sm;
  if (a.min_chunk_tokens != 0) out.min_chunk_tokens = a.min_chunk_tokens;
  out.allow_split = a.disable_split == 0;
  out.warpgroup_mma = a.warpgroup_mma != 0;
  return {};
}

Status to_run_arguments(const slimserve_paged_attention_plan& plan, const slimserve_paged_attention_args* in,
                        attention::PagedAttentionArguments& out) {
  slimserve_paged_attention_args a;
  // Callers built before the rotation pass a shorter struct: no rotation.
  SLIMSERVE_RETURN_IF_ERROR(read_versioned(in, "args", a, offsetof(slimserve_paged_attention_args, rotation)));
  SLIMSERVE_RETURN_IF_ERROR(to_cache(&a.cache, out.cache, a.kv_page_stride));
  if (a.reserved != 0) return make_status(StatusCode::invalid_argument, "args->reserved must be 0");
  SLIMSERVE_RETURN_IF_ERROR(to_enum(a.rotation, "rotation", out.rotation));
  if ((a.table == nullptr) == (a.block_table == nullptr)) {
    return make_status(StatusCode::invalid_argument,
                       "give the page table as table (CSR) or block_table, exactly one");
  }
  if (a.table != nullptr) {
    out.table = to_view(*a.table);
    if (out.table.indptr == nullptr) return null_argument("table->indptr");
  } else {
    out.block_table = to_block_view(*a.block_table);
    if (out.block_table.block_table == nullptr) return null_argument("block_table->block_table");
  }
  out.request_status = to_statuses(a.statuses);
  out.qo_indptr = a.qo_indptr;
  out.q = a.q;
  out.o = a.o;
  out.lse = a.lse;
  out.q_token_stride = a.q_token_stride;
  out.q_head_stride = a.q_head_stride;
  out.o_token_stride = a.o_token_stride;
  out.o_head_stride = a.o_head_stride;
  if (a.sm_scale != 0.0f) out.sm_scale = a.sm_scale;  // the façade refuses non-finite or negative
  if (a.sliding_window < 0) {
    return make_status(StatusCode::invalid_argument, "sliding_window must be >= 0 (0: none), got ",
                       a.sliding_window);
  }
  out.window_left = a.sliding_window - 1;  // w positions, the query's own included
  out.logit_soft_cap = a.logit_soft_cap;
  out.sinks = a.sinks;
  out.chunk_kv = attention::PagedAttentionChunkKv{a.chunk_k, a.chunk_v, a.chunk_token_stride, a.chunk_head_stride};

  const attention::PagedAttentionProblem& p = plan.plan.problem;
  if (a.o_token_stride != 0 || a.o_head_stride != 0) {
    const std::int64_t head = a.o_head_stride != 0 ? a.o_head_stride : p.head_dim;
    const std::int64_t token = a.o_token_stride != 0 ? a.o_token_stride
                                                     : static_cast<std::int64_t>(p.num_qo_heads) * p.head_dim;
    SLIMSERVE_RETURN_IF_ERROR(check_disjoint_rows("o", plan.total_qo_tokens, token, p.num_qo_heads, head, p.head_dim));
  }
  return {};
}

}  // namespace

extern "C" {

// ---- Block tables ------------------------------------------------------------------------------

slimserve_status slimserve_validate_block_table(const slimserve_block_table_view* host_table,
                                                int32_t num_pages) {
  return guarded([&]() -> Status {
    if (host_table == nullptr) return null_argument("host_table");
    return kv::validate_block_table(to_block_view(*host_table), num_pages);
  });
}

slimserve_status slimserve_check_block_tags(const slimserve_block_table_view* device_table,
                                            const slimserve_device_tags* tags, const uint32_t* writers,
                                            const int32_t* append_indptr, slimserve_request_status* statuses,
                                            int32_t* aborted_count, slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (device_table == nullptr) return null_argument("device_table");
    if (tags == nullptr) return null_argument("tags");
    kv::BlockTagCheckArguments arguments;
    arguments.table = to_block_view(*device_table);
    arguments.page_tags = &tags->tags;
    arguments.statuses = reinterpret_cast<kv::RequestStatus*>(statuses);
    arguments.aborted_count = aborted_count;
    arguments.writers = writers;
    arguments.append_indptr = append_indptr;
    return kv::check_page_tags(arguments, stream);
  });
}

// ---- Paged attention ---------------------------------------------------------------------------

slimserve_status slimserve_paged_attention_workspace_size(const slimserve_paged_attention_plan_args* args,
                                                          size_t* bytes) {
  return guarded([&]() -> Status {
    if (bytes == nullptr) return null_argument("bytes");
    attention::PagedAttentionPlanArguments plan_args;
    SLIMSERVE_RETURN_IF_ERROR(to_plan_arguments(args, plan_args));
    auto size = attention::paged_attention_workspace_size(plan_args);
    if (!size.ok()) return size.status();
    *bytes = *size;
    return {};
  });
}

slimserve_status slimserve_paged_attention_workspace_bound(const slimserve_paged_attention_bound* bound,
                                                           size_t* bytes) {
  return guarded([&]() -> Status {
    if (bytes == nullptr) return null_argument("bytes");
    slimserve_paged_attention_bound b;
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(bound, "bound", b));
    attention::PagedAttentionWorkspaceBound cpp;
    SLIMSERVE_RETURN_IF_ERROR(to_problem(b.problem, cpp.problem));
    cpp.max_total_qo_tokens = b.max_total_qo_tokens;
    cpp.max_kv_tokens = b.max_kv_tokens;
    cpp.num_sms = b.num_sms;  // 0: the C++ bound asks the current device
    if (b.ctas_per_sm != 0) cpp.ctas_per_sm = b.ctas_per_sm;
    auto size = attention::paged_attention_workspace_bound(cpp);
    if (!size.ok()) return size.status();
    *bytes = *size;
    return {};
  });
}

slimserve_status slimserve_paged_attention_plan_create(const slimserve_paged_attention_plan_args* args,
                                                       void* workspace, size_t workspace_bytes,
                                                       slimserve_stream stream, slimserve_paged_attention_plan** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    attention::PagedAttentionPlanArguments plan_args;
    SLIMSERVE_RETURN_IF_ERROR(to_plan_arguments(args, plan_args));
    if (workspace == nullptr) return null_argument("workspace");
    auto plan = attention::plan_paged_attention(plan_args, workspace, workspace_bytes, stream);
    if (!plan.ok()) return plan.status();
    const std::int64_t tokens = plan_args.qo_indptr_host[plan_args.qo_indptr_host.size() - 1];
    return hand_out<slimserve_paged_attention_plan>(*std::move(plan), tokens, out);
  });
}
void slimserve_paged_attention_plan_destroy(slimserve_paged_attention_plan* plan) { delete plan; }

slimserve_status slimserve_paged_attention_plan_get_info(const slimserve_paged_attention_plan* plan,
                                                         slimserve_paged_attention_plan_info* info) {
  return guarded([&]() -> Status {
    if (plan == nullptr) return null_argument("plan");
    const attention::PagedAttentionPlan& p = plan->plan;
    slimserve_paged_attention_plan_info value{};
    value.kernel = static_cast<slimserve_attention_kernel>(p.choice.kernel);
    value.split_kv = p.split_kv ? 1 : 0;
    value.chunk_tokens = p.chunk_tokens;
    value.num_work_items = p.num_work_items;
    value.workspace_bytes = p.layout.total_bytes;
    value.reason = p.choice.reason.c_str();
    return write_versioned(value, "info", info);
  });
}

slimserve_status slimserve_paged_attention_run(const slimserve_paged_attention_plan* plan,
                                               const slimserve_paged_attention_args* args, void* workspace,
                                               size_t workspace_bytes, slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (plan == nullptr) return null_argument("plan");
    attention::PagedAttentionArguments a;
    SLIMSERVE_RETURN_IF_ERROR(to_run_arguments(*plan, args, a));
    return attention::run_paged_attention(a, plan->plan, workspace, workspace_bytes, stream);
  });
}

slimserve_status slimserve_merge_attention_states(const slimserve_merge_args* args, slimserve_stream stream) {
  return guarded([&]() -> Status {
    slimserve_merge_args a;
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(args, "args", a));
    attention::MergeArguments cpp;
    cpp.partial_o = a.partial_o;
    cpp.partial_lse = a.partial_lse;
    cpp.split_indptr = a.split_indptr;
    cpp.batch_size = a.batch_size;
    cpp.rows_per_request = a.rows_per_request;
    cpp.head_dim = a.head_dim;
    cpp.o = a.o;
    cpp.lse = a.lse;
    SLIMSERVE_RETURN_IF_ERROR(to_activation(a.out_dtype, "activation dtype", cpp.out_dtype));
    return attention::merge_attention_states(cpp, stream);
  });
}

slimserve_status slimserve_dequantize_pages(const slimserve_kv_cache* cache, const int32_t* page_ids,
                                            int32_t num_listed, void* k_out, void* v_out, slimserve_stream stream) {
  return guarded([&]() -> Status {
    attention::PagedKVCacheView view;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(cache, view));
    return attention::dequantize_pages(view, page_ids, num_listed, static_cast<ss::bf16*>(k_out),
                                       static_cast<ss::bf16*>(v_out), stream);
  });
}

}  // extern "C"
