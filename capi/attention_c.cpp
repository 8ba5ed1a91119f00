// The C ABI's attention entry points added in ABI 2 (include/slimserve/c/slimserve.h): block
// tables and their tag check, tensor-core paged attention (plan / run, CSR or block table,
// combined or separate K/V, strided q/o, fused mixed-dtype prefill, window / soft-cap / sinks)
// and MLA (append, absorbed decode plan / run, prefix gather). Each entry point reads its
// versioned struct, converts it to the C++ Arguments, and calls the façade; the façade's
// preflight names what is wrong. Exported under the version node SLIMSERVE_C_2.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>

#include "c_support.hpp"
#include "slimserve/attention/decode.hpp"
#include "slimserve/attention/dequantize.hpp"
#include "slimserve/attention/mla.hpp"
#include "slimserve/attention/mla_cache_view.hpp"
#include "slimserve/attention/paged_attention.hpp"
#include "slimserve/c/slimserve.h"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/tag_check.hpp"

struct slimserve_paged_attention_plan {
  slimserve::attention::PagedAttentionPlan plan;
  std::int64_t total_qo_tokens = 0;  // rows of o, for the run's overlap check
};
struct slimserve_mla_plan {
  slimserve::attention::MlaDecodePlan plan;
  std::int64_t total_rows = 0;  // query rows of o
};

namespace {

using namespace slimserve_capi;

// The block table is converted field by field, but keep the C struct a mirror of the C++ view
// so that an engine may hand either to code that expects the other.
static_assert(sizeof(slimserve_block_table_view) == sizeof(kv::BlockTableView));
static_assert(offsetof(slimserve_block_table_view, seq_lens) == offsetof(kv::BlockTableView, seq_lens));
static_assert(offsetof(slimserve_block_table_view, page_size) == offsetof(kv::BlockTableView, page_size));
static_assert(SLIMSERVE_KERNEL_CUDA_CORE == static_cast<int>(attention::AttentionKernel::cuda_core));
static_assert(SLIMSERVE_MLA_SCALE_PER_TOKEN_GROUP == static_cast<int>(attention::MlaScaleMode::per_token_group));

kv::BlockTableView to_block_view(const slimserve_block_table_view& t) {
  return {t.block_table, t.expected_tags, t.seq_lens, t.batch_size, t.max_pages_per_request, t.page_size};
}

Status to_activation(std::int32_t value, const char* name, ss::ActivationDtype& out) {
  SLIMSERVE_RETURN_IF_ERROR(to_enum(value, name, out));
  if (!attention::is_valid(out)) return make_status(StatusCode::invalid_argument, "unknown ", name, " ", value);
  return {};
}
Status to_kv_dtype(std::int32_t value, attention::KvDtype& out) {
  SLIMSERVE_RETURN_IF_ERROR(to_enum(value, "KV dtype", out));
  if (!attention::is_valid(out)) return make_status(StatusCode::invalid_argument, "unknown KV dtype ", value);
  return {};
}

/// A host array of `count` entries, or none when the pointer is null.
std::span<const std::int32_t> host_span(const std::int32_t* data, std::size_t count) {
  return data == nullptr ? std::span<const std::int32_t>() : std::span<const std::int32_t>(data, count);
}

/// Exactly one form of host lengths: CSR (kv_indptr + last_page_len) or block table (seq_lens).
Status check_length_form(const std::int32_t* kv_indptr, const std::int32_t* last_page_len,
                         const std::int32_t* seq_lens, std::int32_t batch) {
  const bool csr = kv_indptr != nullptr || last_page_len != nullptr;
  if (csr == (seq_lens != nullptr)) {
    return make_status(StatusCode::invalid_argument, "give the host lengths in one form: kv_indptr_host + ",
                       "last_page_len_host (CSR) or seq_lens_host (block table), exactly one");
  }
  if (csr && (kv_indptr == nullptr || (batch > 0 && last_page_len == nullptr))) {
    return make_status(StatusCode::invalid_argument, "the CSR form needs both kv_indptr_host and last_page_len_host");
  }
  return {};
}

/// Rows of `rows` x `heads` vectors of `inner` elements at (row * row_stride + head *
/// head_stride) must not overlap: o is written by many CTAs at once. Sorted by stride, each
/// dimension's stride must clear everything inside it.
Status check_disjoint_rows(const char* name, std::int64_t rows, std::int64_t row_stride, std::int64_t heads,
                           std::int64_t head_stride, std::int64_t inner) {
  std::array<std::pair<std::int64_t, std::int64_t>, 2> dims{{{row_stride, rows}, {head_stride, heads}}};
  std::sort(dims.begin(), dims.end());
  std::int64_t span = inner;
  for (const auto& [stride, extent] : dims) {
    if (extent <= 1) continue;
    if (stride < span) {
      return make_status(StatusCode::invalid_argument, name, " strides (token ", row_stride, ", head ", head_stride,
                         ") make rows of ", inner, " elements overlap for ", rows, " tokens x ", heads,
                         " heads: outputs would be written twice");
    }
    span = stride * (extent - 1) + span;
  }
  return {};
}

// ---- paged attention ------------------------------------------------------------------------

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
  SLIMSERVE_RETURN_IF_ERROR(read_versioned(in, "plan args", a));
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
  return {};
}

Status to_run_arguments(const slimserve_paged_attention_plan& plan, const slimserve_paged_attention_args* in,
                        attention::PagedAttentionArguments& out) {
  slimserve_paged_attention_args a;
  SLIMSERVE_RETURN_IF_ERROR(read_versioned(in, "args", a));
  SLIMSERVE_RETURN_IF_ERROR(to_cache(&a.cache, out.cache, a.kv_page_stride));
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

// ---- MLA ------------------------------------------------------------------------------------

Status to_mla_cache(const slimserve_mla_cache& c, attention::MlaCacheView& out) {
  out.pages = c.pages;
  out.latent_scale = c.latent_scale;
  out.num_pages = c.num_pages;
  out.page_size = c.page_size;
  SLIMSERVE_RETURN_IF_ERROR(to_kv_dtype(c.dtype, out.dtype));
  SLIMSERVE_RETURN_IF_ERROR(to_enum(c.scale_mode, "MLA scale mode", out.scale_mode));
  if (out.scale_mode > attention::MlaScaleMode::per_token_group) {
    return make_status(StatusCode::invalid_argument, "unknown MLA scale mode ", c.scale_mode);
  }
  return attention::validate_mla_cache_view(out);
}

Status to_mla_problem(const slimserve_mla_problem& p, attention::MlaDecodeProblem& out) {
  out.batch_size = p.batch_size;
  out.num_heads = p.num_heads;
  out.query_tokens = p.query_tokens;
  out.page_size = p.page_size;
  SLIMSERVE_RETURN_IF_ERROR(to_kv_dtype(p.kv_dtype, out.kv_dtype));
  SLIMSERVE_RETURN_IF_ERROR(to_enum(p.scale_mode, "MLA scale mode", out.scale_mode));
  if (out.scale_mode > attention::MlaScaleMode::per_token_group) {
    return make_status(StatusCode::invalid_argument, "unknown MLA scale mode ", p.scale_mode);
  }
  SLIMSERVE_RETURN_IF_ERROR(to_activation(p.q_dtype, "activation dtype", out.q_dtype));
  out.ragged_queries = p.ragged_queries != 0;
  return attention::validate_mla_decode_problem(out);
}

Status to_mla_plan_arguments(const slimserve_mla_plan_args* in, attention::MlaDecodePlanArguments& out) {
  slimserve_mla_plan_args a;
  SLIMSERVE_RETURN_IF_ERROR(read_versioned(in, "plan args", a));
  SLIMSERVE_RETURN_IF_ERROR(to_mla_problem(a.problem, out.problem));
  const auto batch = static_cast<std::size_t>(out.problem.batch_size);
  SLIMSERVE_RETURN_IF_ERROR(
      check_length_form(a.kv_indptr_host, a.last_page_len_host, a.seq_lens_host, out.problem.batch_size));
  if (out.problem.ragged_queries && a.qo_indptr_host == nullptr) {
    return make_status(StatusCode::invalid_argument, "ragged_queries needs qo_indptr_host");
  }
  if (!out.problem.ragged_queries && a.qo_indptr_host != nullptr) {
    return make_status(StatusCode::invalid_argument, "qo_indptr_host is given but ragged_queries is 0");
  }
  out.kv_indptr_host = host_span(a.kv_indptr_host, batch + 1);
  out.last_page_len_host = host_span(a.last_page_len_host, batch);
  out.seq_lens_host = host_span(a.seq_lens_host, batch);
  out.qo_indptr_host = host_span(a.qo_indptr_host, batch + 1);
  out.num_sms = a.num_sms;
  if (a.ctas_per_sm != 0) out.ctas_per_sm = a.ctas_per_sm;
  if (a.min_chunk_tokens != 0) out.min_chunk_tokens = a.min_chunk_tokens;
  out.allow_split = a.disable_split == 0;
  return {};
}

template <class Handle, class Made>
Status hand_out(Made made, std::int64_t rows, Handle** out) {
  *out = new Handle{std::move(made), rows};
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
    if (plan_args.num_sms == 0) plan_args.num_sms = current_device_sm_count();
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
    cpp.num_sms = b.num_sms != 0 ? b.num_sms : current_device_sm_count();
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
    if (plan_args.num_sms == 0) plan_args.num_sms = current_device_sm_count();
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

// ---- MLA ---------------------------------------------------------------------------------------

int64_t slimserve_mla_record_bytes(slimserve_kv_dtype dtype, slimserve_mla_scale_mode scale_mode) {
  const bool bf16 = dtype == SLIMSERVE_KV_BF16 && scale_mode == SLIMSERVE_MLA_SCALE_NONE;
  const bool fp8 = dtype == SLIMSERVE_KV_FP8_E4M3 &&
                   (scale_mode == SLIMSERVE_MLA_SCALE_PER_TENSOR || scale_mode == SLIMSERVE_MLA_SCALE_PER_TOKEN_GROUP);
  if (!bf16 && !fp8) return 0;
  return attention::mla_bytes_per_token(static_cast<attention::KvDtype>(dtype),
                                        static_cast<attention::MlaScaleMode>(scale_mode));
}

slimserve_status slimserve_mla_append(const slimserve_mla_append_args* args, slimserve_stream stream) {
  return guarded([&]() -> Status {
    slimserve_mla_append_args a;
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(args, "args", a));
    if (a.table == nullptr) return null_argument("table");
    attention::MlaAppendArguments cpp;
    SLIMSERVE_RETURN_IF_ERROR(to_mla_cache(a.cache, cpp.cache));
    cpp.table = to_view(*a.table);
    cpp.request_status = to_statuses(a.statuses);
    cpp.latent_new = a.latent_new;
    cpp.rope_new = a.rope_new;
    cpp.latent_stride = a.latent_stride;
    cpp.rope_stride = a.rope_stride;
    SLIMSERVE_RETURN_IF_ERROR(to_activation(a.input_dtype, "activation dtype", cpp.input_dtype));
    cpp.num_tokens = a.num_tokens;
    cpp.token_request = a.token_request;
    cpp.token_position = a.token_position;
    cpp.append_indptr = a.append_indptr;
    return attention::append_mla(cpp, stream);
  });
}

slimserve_status slimserve_mla_workspace_size(const slimserve_mla_plan_args* args, size_t* bytes) {
  return guarded([&]() -> Status {
    if (bytes == nullptr) return null_argument("bytes");
    attention::MlaDecodePlanArguments plan_args;
    SLIMSERVE_RETURN_IF_ERROR(to_mla_plan_arguments(args, plan_args));
    if (plan_args.num_sms == 0) plan_args.num_sms = current_device_sm_count();
    auto size = attention::mla_decode_workspace_size(plan_args);
    if (!size.ok()) return size.status();
    *bytes = *size;
    return {};
  });
}

slimserve_status slimserve_mla_workspace_bound(const slimserve_mla_bound* bound, size_t* bytes) {
  return guarded([&]() -> Status {
    if (bytes == nullptr) return null_argument("bytes");
    slimserve_mla_bound b;
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(bound, "bound", b));
    attention::MlaDecodeWorkspaceBound cpp;
    SLIMSERVE_RETURN_IF_ERROR(to_mla_problem(b.problem, cpp.problem));
    cpp.num_sms = b.num_sms != 0 ? b.num_sms : current_device_sm_count();
    if (b.ctas_per_sm != 0) cpp.ctas_per_sm = b.ctas_per_sm;
    auto size = attention::mla_decode_workspace_bound(cpp);
    if (!size.ok()) return size.status();
    *bytes = *size;
    return {};
  });
}

slimserve_status slimserve_mla_plan_create(const slimserve_mla_plan_args* args, void* workspace,
                                           size_t workspace_bytes, slimserve_stream stream, slimserve_mla_plan** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    attention::MlaDecodePlanArguments plan_args;
    SLIMSERVE_RETURN_IF_ERROR(to_mla_plan_arguments(args, plan_args));
    if (plan_args.num_sms == 0) plan_args.num_sms = current_device_sm_count();
    if (workspace == nullptr) return null_argument("workspace");
    auto plan = attention::plan_mla_decode(plan_args, workspace, workspace_bytes, stream);
    if (!plan.ok()) return plan.status();
    const attention::MlaDecodeProblem& p = plan_args.problem;
    const std::int64_t rows = p.ragged_queries
                                  ? plan_args.qo_indptr_host[plan_args.qo_indptr_host.size() - 1]
                                  : static_cast<std::int64_t>(p.batch_size) * p.query_tokens;
    return hand_out<slimserve_mla_plan>(*std::move(plan), rows, out);
  });
}
void slimserve_mla_plan_destroy(slimserve_mla_plan* plan) { delete plan; }

slimserve_status slimserve_mla_decode_run(const slimserve_mla_plan* plan, const slimserve_mla_decode_args* args,
                                          void* workspace, size_t workspace_bytes, slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (plan == nullptr) return null_argument("plan");
    slimserve_mla_decode_args a;
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(args, "args", a));
    attention::MlaDecodeArguments cpp;
    SLIMSERVE_RETURN_IF_ERROR(to_mla_cache(a.cache, cpp.cache));
    if ((a.table == nullptr) == (a.block_table == nullptr)) {
      return make_status(StatusCode::invalid_argument,
                         "give the page table as table (CSR) or block_table, exactly one");
    }
    if (a.table != nullptr) {
      cpp.table = to_view(*a.table);
      if (cpp.table.indptr == nullptr) return null_argument("table->indptr");
    } else {
      cpp.block_table = to_block_view(*a.block_table);
      if (cpp.block_table.block_table == nullptr) return null_argument("block_table->block_table");
    }
    cpp.request_status = to_statuses(a.statuses);
    cpp.q = a.q;
    cpp.o = a.o;
    cpp.lse = a.lse;
    cpp.q_token_stride = a.q_token_stride;
    cpp.q_head_stride = a.q_head_stride;
    cpp.o_token_stride = a.o_token_stride;
    cpp.o_head_stride = a.o_head_stride;
    cpp.sm_scale = a.sm_scale;
    if (a.o_token_stride != 0 || a.o_head_stride != 0) {
      const attention::MlaDecodeProblem& p = plan->plan.problem;
      const std::int64_t head = a.o_head_stride != 0 ? a.o_head_stride : attention::mla_latent_dim;
      const std::int64_t token = a.o_token_stride != 0
                                     ? a.o_token_stride
                                     : static_cast<std::int64_t>(p.num_heads) * attention::mla_latent_dim;
      SLIMSERVE_RETURN_IF_ERROR(
          check_disjoint_rows("o", plan->total_rows, token, p.num_heads, head, attention::mla_latent_dim));
    }
    return attention::run_mla_decode(cpp, plan->plan, workspace, workspace_bytes, stream);
  });
}

slimserve_status slimserve_mla_gather(const slimserve_mla_gather_args* args, slimserve_stream stream) {
  return guarded([&]() -> Status {
    slimserve_mla_gather_args a;
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(args, "args", a));
    if (a.table == nullptr) return null_argument("table");
    attention::MlaGatherArguments cpp;
    SLIMSERVE_RETURN_IF_ERROR(to_mla_cache(a.cache, cpp.cache));
    cpp.table = to_view(*a.table);
    cpp.request_status = to_statuses(a.statuses);
    cpp.token_indptr = a.token_indptr;
    cpp.out = a.out;
    cpp.out_stride = a.out_stride;
    cpp.num_rows = a.num_rows;
    return attention::gather_mla_latent(cpp, stream);
  });
}

}  // extern "C"
