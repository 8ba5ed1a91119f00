// The C ABI's MLA entry points added in ABI 2 (include/slimserve/c/slimserve.h): append,
// absorbed decode plan / run (CSR or block table, ragged absorbed prefill, strided q/o) and the
// prefix gather, over attention/mla.hpp. Exported under the version node SLIMSERVE_C_2.
#include <cstddef>
#include <cstdint>
#include <utility>

#include "c_support.hpp"
#include "slimserve/attention/mla.hpp"
#include "slimserve/attention/mla_cache_view.hpp"
#include "slimserve/c/slimserve.h"

struct slimserve_mla_plan {
  slimserve::attention::MlaDecodePlan plan;
  std::int64_t total_rows = 0;  // query rows of o, for the run's overlap check
};

namespace {

using namespace slimserve_capi;

static_assert(SLIMSERVE_MLA_SCALE_PER_TOKEN_GROUP == static_cast<int>(attention::MlaScaleMode::per_token_group));

Status to_mla_problem(const slimserve_mla_problem& p, attention::MlaDecodeProblem& out) {
  out.batch_size = p.batch_size;
  out.num_heads = p.num_heads;
  out.query_tokens = p.query_tokens;
  out.page_size = p.page_size;
  SLIMSERVE_RETURN_IF_ERROR(to_kv_dtype(p.kv_dtype, out.kv_dtype));
  SLIMSERVE_RETURN_IF_ERROR(to_mla_scale_mode(p.scale_mode, out.scale_mode));
  SLIMSERVE_RETURN_IF_ERROR(to_activation(p.q_dtype, "activation dtype", out.q_dtype));
  out.ragged_queries = p.ragged_queries != 0;
  return attention::validate_mla_decode_problem(out);
}

Status to_mla_plan_arguments(const slimserve_mla_plan_args* in, attention::MlaDecodePlanArguments& out) {
  slimserve_mla_plan_args a;
  // warpgroup_mma came after the struct's first version: a caller's struct may end before it.
  SLIMSERVE_RETURN_IF_ERROR(read_versioned(in, "plan args", a, offsetof(slimserve_mla_plan_args, warpgroup_mma)));
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
  out.problem.warpgroup_mma = a.warpgroup_mma != 0;
  return {};
}

}  // namespace

extern "C" {

int64_t slimserve_mla_record_bytes(slimserve_kv_dtype dtype, slimserve_mla_scale_mode scale_mode) {
  const auto kv_dtype = static_cast<attention::KvDtype>(dtype);
  const auto mode = static_cast<attention::MlaScaleMode>(scale_mode);
  if (!attention::mla_format_supported(kv_dtype, mode)) return 0;
  return attention::mla_bytes_per_token(kv_dtype, mode);
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
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(bound, "bound", b, offsetof(slimserve_mla_bound, warpgroup_mma)));
    attention::MlaDecodeWorkspaceBound cpp;
    SLIMSERVE_RETURN_IF_ERROR(to_mla_problem(b.problem, cpp.problem));
    cpp.problem.warpgroup_mma = b.warpgroup_mma != 0;
    cpp.num_sms = b.num_sms;  // 0: the C++ bound asks the current device
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
