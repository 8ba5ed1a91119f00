#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "plan_support.hpp"
#include "slimserve/attention/paged_attention.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {
namespace {

using detail::ceil_div;
constexpr auto align_up = detail::align_workspace;
constexpr std::size_t workspace_alignment = detail::plan_workspace_alignment;

/// Split chunks are whole multiples of this many tokens (the largest stage of any tile).
constexpr std::int32_t chunk_granule = 128;
constexpr std::int32_t cta_warps = 4;

/// Tokens per pipeline stage of the kernel (kernels/paged_attention_kernel.cuh: ~32 KiB of
/// K + V, clamped to 64..128, whole multiples of 64).
std::int32_t stage_tokens_for(KvDtype dtype, std::int32_t head_dim) {
  const auto raw = static_cast<std::int32_t>(32768 / (2 * head_vector_bytes(dtype, head_dim)));
  return std::clamp(raw, 64, 128) / 64 * 64;
}

Status validate_host_arrays(const PagedAttentionPlanArguments& args, std::vector<std::int64_t>& kv_len) {
  const PagedAttentionProblem& p = args.problem;
  const auto batch = static_cast<std::size_t>(p.batch_size);
  const bool csr = !args.kv_indptr_host.empty() || !args.last_page_len_host.empty();
  if (csr == !args.seq_lens_host.empty() && !(batch == 0 && !csr)) {
    return make_status(StatusCode::invalid_argument,
                       "paged attention plan needs exactly one form of host lengths: kv_indptr_host + "
                       "last_page_len_host (CSR) or seq_lens_host (block table)");
  }
  if (args.qo_indptr_host.size() != batch + 1 ||
      (csr ? args.kv_indptr_host.size() != batch + 1 || args.last_page_len_host.size() != batch
           : args.seq_lens_host.size() != batch)) {
    return make_status(StatusCode::invalid_argument, "host arrays have qo_indptr of ",
                       args.qo_indptr_host.size(), ", kv indptr of ", args.kv_indptr_host.size(),
                       ", last_page_len of ", args.last_page_len_host.size(), " and seq_lens of ",
                       args.seq_lens_host.size(), " entries; batch_size ", p.batch_size, " needs ",
                       batch + 1, " and (CSR) ", batch + 1, " and ", batch, " or (block table) ", batch);
  }
  if (args.qo_indptr_host[0] != 0 || (csr && args.kv_indptr_host[0] != 0)) {
    return make_status(StatusCode::invalid_argument, "qo_indptr[0] and indptr[0] must be 0, got ",
                       args.qo_indptr_host[0], " and ", csr ? args.kv_indptr_host[0] : 0);
  }
  kv_len.assign(batch, 0);
  for (std::size_t b = 0; b < batch; ++b) {
    const std::int32_t qo_len = args.qo_indptr_host[b + 1] - args.qo_indptr_host[b];
    if (qo_len < 0) {
      return make_status(StatusCode::invalid_argument, "qo_indptr decreases at request ", b, " (",
                         args.qo_indptr_host[b], " -> ", args.qo_indptr_host[b + 1], ")");
    }
    if (!csr) {
      kv_len[b] = args.seq_lens_host[b];
      if (kv_len[b] < 0) {
        return make_status(StatusCode::invalid_argument, "seq_lens[", b, "] = ", kv_len[b], " < 0");
      }
      if (qo_len > kv_len[b]) {
        return make_status(StatusCode::invalid_argument, "request ", b, " has ", qo_len,
                           " query tokens but only ", kv_len[b],
                           " tokens in its pages (append the chunk's K/V first)");
      }
      continue;
    }
    const std::int32_t pages = args.kv_indptr_host[b + 1] - args.kv_indptr_host[b];
    if (pages < 0) {
      return make_status(StatusCode::invalid_argument, "indptr decreases at request ", b, " (",
                         args.kv_indptr_host[b], " -> ", args.kv_indptr_host[b + 1], ")");
    }
    const std::int32_t last = args.last_page_len_host[b];
    if (pages > 0 && (last < 1 || last > p.page_size)) {
      return make_status(StatusCode::invalid_argument, "last_page_len[", b, "] = ", last,
                         " is outside [1, page_size = ", p.page_size, "]");
    }
    if (pages == 0 && last != 0) {
      return make_status(StatusCode::invalid_argument, "last_page_len[", b, "] = ", last,
                         " for a request with no pages (must be 0)");
    }
    kv_len[b] = pages == 0 ? 0 : static_cast<std::int64_t>(pages - 1) * p.page_size + last;
    if (qo_len > kv_len[b]) {
      return make_status(StatusCode::invalid_argument, "request ", b, " has ", qo_len,
                         " query tokens but only ", kv_len[b],
                         " tokens in its pages (append the chunk's K/V first)");
    }
  }
  return {};
}

struct Schedule {
  std::int32_t warps_m = 1;
  std::int32_t cta_rows = 16;
  std::int64_t chunk_tokens = 0;
  std::vector<std::int32_t> unit_request, unit_row_tile, unit_splits;
};

std::int64_t splits_of(std::int64_t kv_len, std::int64_t chunk) {
  return kv_len <= chunk ? 1 : ceil_div(kv_len, chunk);
}

Schedule make_schedule(const PagedAttentionPlanArguments& args, const std::vector<std::int64_t>& kv_len) {
  const PagedAttentionProblem& p = args.problem;
  const std::int32_t group = p.num_qo_heads / p.num_kv_heads;
  Schedule s;
  std::int64_t max_rows = 0, max_kv = 0;
  for (std::size_t b = 0; b < kv_len.size(); ++b) {
    const std::int64_t rows = static_cast<std::int64_t>(args.qo_indptr_host[b + 1] - args.qo_indptr_host[b]) * group;
    max_rows = std::max(max_rows, rows);
    max_kv = std::max(max_kv, kv_len[b]);
  }
  // Fewest rows per CTA that still hold a request's rows (decode: 1 x 4 warps, so the 4 warps
  // split the KV tile instead of padding rows); long prefill chunks use 4 x 1.
  s.warps_m = max_rows <= 16 ? 1 : (max_rows <= 32 ? 2 : 4);
  s.cta_rows = 16 * s.warps_m;
  // Units longest first (LPT): a causal row tile reads K/V up to its last query token, so the
  // last tiles of a long request cost the most. The GPU hands CTAs to free slots roughly in
  // launch order, and the kernels launch the work items in this order (each item's KV heads
  // next to each other), so the long tiles start first and the short ones fill the tail.
  struct Unit {
    std::int64_t visible_tokens;
    std::int32_t request, row_tile;
  };
  std::vector<Unit> units_by_cost;
  for (std::size_t b = 0; b < kv_len.size(); ++b) {
    const std::int64_t qo_len = args.qo_indptr_host[b + 1] - args.qo_indptr_host[b];
    const std::int64_t rows = qo_len * group;
    for (std::int64_t tile = 0; tile < ceil_div(rows, s.cta_rows); ++tile) {
      const std::int64_t last_token = (std::min(rows, (tile + 1) * s.cta_rows) - 1) / group;
      const std::int64_t visible = p.causal ? kv_len[b] - qo_len + last_token + 1 : kv_len[b];
      units_by_cost.push_back({visible, static_cast<std::int32_t>(b), static_cast<std::int32_t>(tile)});
    }
  }
  std::stable_sort(units_by_cost.begin(), units_by_cost.end(),
                   [](const Unit& a, const Unit& b) { return a.visible_tokens > b.visible_tokens; });
  for (const Unit& unit : units_by_cost) {
    s.unit_request.push_back(unit.request);
    s.unit_row_tile.push_back(unit.row_tile);
  }
  const auto items_for = [&](std::int64_t chunk) {
    std::int64_t items = 0;
    for (std::int32_t b : s.unit_request) items += splits_of(kv_len[static_cast<std::size_t>(b)], chunk);
    return items;
  };
  const std::int64_t max_ctas = static_cast<std::int64_t>(args.num_sms) * args.ctas_per_sm;
  const std::int64_t units = static_cast<std::int64_t>(s.unit_request.size());
  std::int64_t chunk_granules = std::max<std::int64_t>(1, ceil_div(max_kv, chunk_granule));
  if (args.allow_split && units * p.num_kv_heads < max_ctas && max_kv > 0) {
    // Smallest chunk (most parallelism) whose CTAs fit in one wave.
    chunk_granules = detail::smallest_fitting_chunk(
        ceil_div(args.min_chunk_tokens, chunk_granule), chunk_granules,
        [&](std::int64_t granules) { return items_for(granules * chunk_granule) * p.num_kv_heads <= max_ctas; });
  }
  s.chunk_tokens = chunk_granules * chunk_granule;
  for (std::int32_t b : s.unit_request) {
    s.unit_splits.push_back(static_cast<std::int32_t>(splits_of(kv_len[static_cast<std::size_t>(b)], s.chunk_tokens)));
  }
  return s;
}

PagedAttentionWorkspaceLayout layout_for(std::size_t items, std::size_t units, bool split,
                                         const PagedAttentionProblem& p, std::int32_t cta_rows) {
  PagedAttentionWorkspaceLayout layout;
  constexpr std::size_t i32 = sizeof(std::int32_t);
  layout.work_request = 0;
  layout.work_row_tile = items * i32;
  layout.work_split = 2 * items * i32;
  layout.work_num_splits = 3 * items * i32;
  layout.unit_request = 4 * items * i32;
  layout.unit_row_tile = layout.unit_request + units * i32;
  layout.unit_indptr = layout.unit_row_tile + units * i32;
  layout.int_bytes = layout.unit_indptr + (units + 1) * i32;
  std::size_t offset = align_up(layout.int_bytes);
  layout.partial_o = offset;
  layout.partial_lse = offset;
  if (split) {
    const std::size_t rows = items * static_cast<std::size_t>(p.num_kv_heads) * static_cast<std::size_t>(cta_rows);
    offset = align_up(offset + rows * static_cast<std::size_t>(p.head_dim) * sizeof(float));
    layout.partial_lse = offset;
    offset = align_up(offset + rows * sizeof(float));
  }
  layout.total_bytes = offset;
  return layout;
}

}  // namespace

AttentionKernelChoice choose_attention_kernel(const PagedAttentionProblem& p, std::int32_t max_qo_len) {
  const std::int32_t group = p.num_kv_heads > 0 ? p.num_qo_heads / p.num_kv_heads : 0;
  const std::int32_t rows = group * max_qo_len;
  if (max_qo_len <= 8 && rows <= 2 && !is_fp8(p.kv_dtype) && kv_format_info(p.kv_dtype).computes_in_storage_type &&
      VectorKernelHeadDims::contains(p.head_dim)) {
    return {AttentionKernel::cuda_core,
            "decode with " + std::to_string(rows) + " query row(s) per KV head on a 16-bit cache: "
            "the CUDA-core kernel converts nothing and multiplies each K/V element once per row "
            "(<= 2 FMA per element), under the bandwidth line, while the tensor-core kernel "
            "would pad the 16-row mma to " + std::to_string(rows) + " useful rows"};
  }
  if (max_qo_len > 8) {
    return {AttentionKernel::tensor_core,
            "prefill / append (" + std::to_string(max_qo_len) + " query tokens): only the "
            "tensor-core kernel takes more than 8 query tokens per request"};
  }
  return {AttentionKernel::tensor_core,
          std::to_string(rows) + " query rows per KV head" +
              (is_fp8(p.kv_dtype) ? " over FP8 pages" : "") +
              ": the rows become the mma's M, so each K/V element is loaded and converted once "
              "per warp instead of once per row (CUDA-core decode: ~19 warp-instructions per "
              "16 B at GQA 8 for FP8, ~12 for BF16; issue-bound)"};
}

Status validate_paged_attention_problem(const PagedAttentionProblem& p) {
  if (is_valid(p.kv_dtype)) {
    SLIMSERVE_RETURN_IF_ERROR(require_kernel(p.kv_dtype, KvKernel::paged_attention));
  }
  if (p.batch_size < 0) {
    return make_status(StatusCode::invalid_argument, "batch_size ", p.batch_size, " < 0");
  }
  if (!supported_head_dim(p.head_dim)) {
    return make_status(StatusCode::unsupported, "head_dim ", p.head_dim,
                       " is not supported by paged attention (", PagedHeadDims::describe(), ")");
  }
  if (!supported_page_size(p.page_size)) {
    return unsupported_page_size("", p.page_size);
  }
  if (p.num_kv_heads <= 0 || p.num_qo_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) {
    return make_status(StatusCode::unsupported, "num_qo_heads ", p.num_qo_heads,
                       " must be a positive multiple of num_kv_heads ", p.num_kv_heads);
  }
  if (is_valid(p.kv_dtype) && kv_format_info(p.kv_dtype).computes_in_storage_type &&
      p.q_dtype != kv_format_info(p.kv_dtype).storage_activation) {
    return make_status(StatusCode::unsupported, "a ", to_string(p.kv_dtype),
                       " cache computes in its own type; queries must be ", to_string(p.kv_dtype),
                       " too");
  }
  return {};
}

Result<PagedAttentionPlan> make_paged_attention_plan(const PagedAttentionPlanArguments& args) {
  const PagedAttentionProblem& p = args.problem;
  SLIMSERVE_RETURN_IF_ERROR(validate_paged_attention_problem(p));
  if (args.num_sms == 0) {  // the callers that ask the device resolve 0 before they get here
    return make_status(StatusCode::invalid_argument,
                       "make_paged_attention_plan needs num_sms set (0, the current device, is "
                       "resolved by plan_paged_attention, paged_attention_workspace_size and "
                       "paged_attention_workspace_bound; set it, e.g. from "
                       "rt::current_device_sm_count())");
  }
  if (args.num_sms < 1 || args.ctas_per_sm < 1 || args.min_chunk_tokens < 1) {
    return make_status(StatusCode::invalid_argument, "num_sms (", args.num_sms, "), ctas_per_sm (",
                       args.ctas_per_sm, ") and min_chunk_tokens (", args.min_chunk_tokens,
                       ") must be >= 1");
  }
  std::vector<std::int64_t> kv_len;
  SLIMSERVE_RETURN_IF_ERROR(validate_host_arrays(args, kv_len));
  const Schedule s = make_schedule(args, kv_len);

  std::int64_t items = 0;
  std::int32_t max_qo_len = 0;
  for (std::int32_t splits : s.unit_splits) items += splits;
  for (std::size_t b = 0; b < kv_len.size(); ++b) {
    max_qo_len = std::max(max_qo_len, args.qo_indptr_host[b + 1] - args.qo_indptr_host[b]);
  }
  if (items > std::numeric_limits<std::int32_t>::max() / 8) {
    return make_status(StatusCode::invalid_argument, "paged attention plan needs ", items, " work items");
  }
  PagedAttentionPlan plan;
  plan.problem = p;
  plan.warps_m = s.warps_m;
  plan.cta_rows = s.cta_rows;
  plan.stage_tokens = stage_tokens_for(p.kv_dtype, p.head_dim);
  plan.num_work_items = static_cast<std::int32_t>(items);
  plan.num_units = static_cast<std::int32_t>(s.unit_request.size());
  plan.split_kv = items > plan.num_units;
  plan.chunk_tokens = static_cast<std::int32_t>(std::min<std::int64_t>(s.chunk_tokens, std::numeric_limits<std::int32_t>::max()));
  plan.choice = choose_attention_kernel(p, max_qo_len);
  for (const std::int64_t len : kv_len) plan.max_kv_tokens = std::max(plan.max_kv_tokens, len);
  if (args.warpgroup_mma && plan.choice.kernel == AttentionKernel::tensor_core) {
    // The wgmma kernel's CTA is one warpgroup over one m64 tile: the 4 x 1 schedule's 64 rows.
    if (kv_format_info(p.kv_dtype).scales == KvScaleGeometry::per_block) {
      plan.choice.reason += "; not the wgmma kernel: " + std::string(to_string(p.kv_dtype)) +
                            " pages (block-scaled codes) are read by the mma.sync kernel only";
    } else if (!PagedWgmmaHeadDims::contains(p.head_dim)) {
      plan.choice.reason += "; not the wgmma kernel: head_dim " + std::to_string(p.head_dim) +
                            " is not one of its head dims (" + PagedWgmmaHeadDims::describe() + ")";
    } else if (s.warps_m != 4) {
      plan.choice.reason += "; not the wgmma kernel: " + std::to_string(s.cta_rows) +
                            " rows per CTA would pad its 64-row M";
    } else {
      plan.warpgroup_mma = true;
      plan.wgmma_kernel = args.wgmma_kernel;
      if (plan.wgmma_kernel == PrefillWgmmaKernel::automatic) {  // see PrefillWgmmaKernel
        plan.wgmma_kernel = PrefillWgmmaKernel::ping_pong;
      }
      plan.choice.reason += plan.wgmma_kernel == PrefillWgmmaKernel::ping_pong
                                ? "; on the sm_90a ping-pong wgmma kernel (a producer warpgroup and two consumer "
                                  "warpgroups over the 64 rows, one's softmax under the other's Q.K^T and P.V)"
                                : "; on the sm_90a wgmma kernel (one warpgroup per 64 rows: Q.K^T and P.V "
                                  "at the warpgroup MMA rate, FP8 widened once per tile in shared memory)";
    }
  }

  const auto w = static_cast<std::size_t>(items);
  const auto u = static_cast<std::size_t>(plan.num_units);
  plan.layout = layout_for(w, u, plan.split_kv, p, plan.cta_rows);
  if (plan.choice.kernel == AttentionKernel::cuda_core) {
    bool uniform = true;
    for (std::size_t b = 0; b < kv_len.size(); ++b) {
      uniform = uniform && args.qo_indptr_host[b + 1] - args.qo_indptr_host[b] == max_qo_len;
    }
    const bool fills = static_cast<std::int64_t>(p.batch_size) * p.num_kv_heads >= args.num_sms;
    const bool csr = args.seq_lens_host.empty();
    Result<DecodePlan> decode = make_status(StatusCode::unsupported,
                                            csr ? "a non-causal multi-token step" : "it reads the CSR page table only");
    if (csr && uniform && fills && (p.causal || max_qo_len == 1)) {
      DecodePlanArguments d{DecodeProblem{p.batch_size, p.num_qo_heads, p.num_kv_heads, p.head_dim,
                                          p.page_size, max_qo_len, p.kv_dtype},
                            args.kv_indptr_host, args.last_page_len_host,
                            args.num_sms * args.ctas_per_sm, args.min_chunk_tokens, false};
      decode = make_decode_plan(d);
    }
    if (decode.ok()) {
      plan.decode = std::move(*decode);
      plan.decode_offset = align_up(plan.layout.total_bytes);
      plan.layout.total_bytes = plan.decode_offset + plan.decode->layout.total_bytes;
    } else {
      plan.choice = {AttentionKernel::tensor_core,
                     !uniform ? "decode rows fit the CUDA-core kernel, but its query layout needs the same "
                                "qo_len in every request: the tensor-core kernel takes ragged ones"
                     : !fills ? "decode rows fit the CUDA-core kernel, but batch x KV heads (" +
                                    std::to_string(static_cast<std::int64_t>(p.batch_size) * p.num_kv_heads) +
                                    ") CTAs leave SMs idle without a KV split: the tensor-core kernel splits"
                              : "the CUDA-core decode kernel cannot take this problem (" +
                                    decode.status().to_string() + "): tensor-core kernel"};
    }
  }
  plan.host_ints.assign(plan.layout.int_bytes / sizeof(std::int32_t), 0);
  std::int32_t* work_request = plan.host_ints.data();
  std::int32_t* work_row_tile = work_request + w;
  std::int32_t* work_split = work_row_tile + w;
  std::int32_t* work_num_splits = work_split + w;
  std::int32_t* unit_request = work_num_splits + w;
  std::int32_t* unit_row_tile = unit_request + u;
  std::int32_t* unit_indptr = unit_row_tile + u;
  std::int32_t item = 0;
  for (std::size_t i = 0; i < u; ++i) {
    unit_request[i] = s.unit_request[i];
    unit_row_tile[i] = s.unit_row_tile[i];
    unit_indptr[i] = item;
    for (std::int32_t split = 0; split < s.unit_splits[i]; ++split, ++item) {
      work_request[item] = s.unit_request[i];
      work_row_tile[item] = s.unit_row_tile[i];
      work_split[item] = split;
      work_num_splits[item] = s.unit_splits[i];
    }
  }
  unit_indptr[u] = item;
  return plan;
}

Result<std::size_t> paged_attention_workspace_size(const PagedAttentionPlanArguments& requested) {
  PagedAttentionPlanArguments args = requested;  // num_sms 0: as plan_paged_attention resolves it
  SLIMSERVE_RETURN_IF_ERROR(detail::resolve_num_sms(args.num_sms));
  Result<PagedAttentionPlan> plan = make_paged_attention_plan(args);
  if (!plan.ok()) return plan.status();
  return plan->layout.total_bytes;
}

Result<std::size_t> paged_attention_workspace_bound(const PagedAttentionWorkspaceBound& requested) {
  PagedAttentionWorkspaceBound bound = requested;
  SLIMSERVE_RETURN_IF_ERROR(detail::resolve_num_sms(bound.num_sms));  // 0: the current device
  const PagedAttentionProblem& p = bound.problem;
  SLIMSERVE_RETURN_IF_ERROR(validate_paged_attention_problem(p));
  if (bound.num_sms < 1 || bound.ctas_per_sm < 1 || bound.max_total_qo_tokens < 0 || bound.max_kv_tokens < 0) {
    return make_status(StatusCode::invalid_argument, "workspace bound needs num_sms >= 0 (0: the current device), "
                       "ctas_per_sm >= 1 and non-negative token counts");
  }
  // Units are largest at 16 rows per CTA: one partial tile per request plus full tiles.
  const std::int64_t group = p.num_qo_heads / p.num_kv_heads;
  const std::int64_t units = ceil_div(bound.max_total_qo_tokens * group, 16) + p.batch_size;
  // A split plan has items * H_kv <= SMs x CTAs per SM; an unsplit one has items == units.
  const std::int64_t max_ctas = static_cast<std::int64_t>(bound.num_sms) * bound.ctas_per_sm;
  const std::int64_t split_items = std::max<std::int64_t>(max_ctas / p.num_kv_heads, 1);
  const std::int64_t items = std::max(units, split_items);
  const PagedAttentionWorkspaceLayout ints_only = layout_for(static_cast<std::size_t>(items), static_cast<std::size_t>(units), false, p, 64);
  const PagedAttentionWorkspaceLayout partials = layout_for(static_cast<std::size_t>(split_items), 0, true, p, 64);
  // A plan that picks the CUDA-core decode kernel adds its unsplit schedule: work_request,
  // work_split (one per request) and split_indptr (batch + 1).
  const std::size_t decode = align_up((3 * static_cast<std::size_t>(p.batch_size) + 1) * sizeof(std::int32_t)) +
                             workspace_alignment;
  return ints_only.total_bytes + (partials.total_bytes - align_up(partials.int_bytes)) + workspace_alignment + decode;
}

}  // namespace attention
SLIMSERVE_NAMESPACE_END
