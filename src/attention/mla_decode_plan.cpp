// PLAN of absorbed MLA decode: validation of the problem and the host lengths, the CTA shape,
// the KV split, and the workspace layout (one function carves it for the size query, the
// bound and the plan).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "plan_support.hpp"
#include "slimserve/attention/mla.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {
namespace {

using detail::ceil_div;
/// Split chunks are whole multiples of this many tokens (two of the kernel's 32-token tiles).
constexpr std::int64_t chunk_granule = 64;

/// Rows per CTA: 16 when a request has at most 16 rows (8 or 16 heads, one token), else 32;
/// 64 (warps_m 4: the wgmma kernel) when asked for and a request fills them.
std::int32_t warps_m_for(const MlaDecodeProblem& p) {
  const std::int64_t rows = static_cast<std::int64_t>(p.num_heads) * p.query_tokens;
  if (p.warpgroup_mma && rows >= 64) return 4;
  return rows <= 16 ? 1 : 2;
}

/// CTA slots per SM the split fills: the caller's, or (0) the chosen kernel's residency.
std::int32_t ctas_per_sm_for(const MlaDecodeProblem& p, std::int32_t requested) {
  return requested != 0 ? requested : mla_decode_resident_ctas(p.kv_dtype, warps_m_for(p));
}

MlaDecodeWorkspaceLayout layout_for(std::size_t items, std::size_t units, std::size_t batch, bool split,
                                    std::int32_t cta_rows) {
  constexpr std::size_t i32 = sizeof(std::int32_t);
  MlaDecodeWorkspaceLayout l;
  l.work_request = 0;
  l.work_row_tile = items * i32;
  l.work_split = 2 * items * i32;
  l.work_num_splits = 3 * items * i32;
  l.unit_request = 4 * items * i32;
  l.unit_row_tile = l.unit_request + units * i32;
  l.unit_indptr = l.unit_row_tile + units * i32;
  l.qo_indptr = l.unit_indptr + (units + 1) * i32;
  l.int_bytes = l.qo_indptr + (batch + 1) * i32;
  std::size_t offset = detail::align_workspace(l.int_bytes);
  l.partial_o = offset;
  l.partial_lse = offset;
  if (split) {
    const std::size_t rows = items * static_cast<std::size_t>(cta_rows);
    offset = detail::align_workspace(offset + rows * static_cast<std::size_t>(mla_latent_dim) * sizeof(float));
    l.partial_lse = offset;
    offset = detail::align_workspace(offset + rows * sizeof(float));
  }
  l.total_bytes = offset;
  return l;
}

Status host_lengths(const MlaDecodePlanArguments& args, std::vector<std::int64_t>& kv_len) {
  const MlaDecodeProblem& p = args.problem;
  const auto batch = static_cast<std::size_t>(p.batch_size);
  kv_len.assign(batch, 0);
  const bool csr = !args.kv_indptr_host.empty() || !args.last_page_len_host.empty();
  if (csr == !args.seq_lens_host.empty()) {
    return make_status(StatusCode::invalid_argument,
                       "MLA decode plan needs exactly one form of host lengths: kv_indptr_host + "
                       "last_page_len_host (CSR) or seq_lens_host (block table)");
  }
  if (!csr) {
    if (args.seq_lens_host.size() != batch) {
      return make_status(StatusCode::invalid_argument, "seq_lens_host has ", args.seq_lens_host.size(),
                         " entries; batch_size ", p.batch_size, " needs ", batch);
    }
    for (std::size_t b = 0; b < batch; ++b) {
      if (args.seq_lens_host[b] < 0) {
        return make_status(StatusCode::invalid_argument, "seq_lens[", b, "] = ", args.seq_lens_host[b], " < 0");
      }
      kv_len[b] = args.seq_lens_host[b];
    }
    return {};
  }
  if (args.kv_indptr_host.size() != batch + 1 || args.last_page_len_host.size() != batch) {
    return make_status(StatusCode::invalid_argument, "host arrays have indptr of ", args.kv_indptr_host.size(),
                       " and last_page_len of ", args.last_page_len_host.size(), " entries; batch_size ",
                       p.batch_size, " needs ", batch + 1, " and ", batch);
  }
  if (args.kv_indptr_host[0] != 0) {
    return make_status(StatusCode::invalid_argument, "indptr[0] must be 0, got ", args.kv_indptr_host[0]);
  }
  for (std::size_t b = 0; b < batch; ++b) {
    const std::int32_t pages = args.kv_indptr_host[b + 1] - args.kv_indptr_host[b];
    const std::int32_t last = args.last_page_len_host[b];
    if (pages < 0) {
      return make_status(StatusCode::invalid_argument, "indptr decreases at request ", b, " (",
                         args.kv_indptr_host[b], " -> ", args.kv_indptr_host[b + 1], ")");
    }
    if (pages > 0 && (last < 1 || last > p.page_size)) {
      return make_status(StatusCode::invalid_argument, "last_page_len[", b, "] = ", last,
                         " is outside [1, page_size = ", p.page_size, "]");
    }
    if (pages == 0 && last != 0) {
      return make_status(StatusCode::invalid_argument, "last_page_len[", b, "] = ", last,
                         " for a request with no pages (must be 0)");
    }
    kv_len[b] = pages == 0 ? 0 : static_cast<std::int64_t>(pages - 1) * p.page_size + last;
  }
  return {};
}

/// Query tokens of each request: query_tokens each, or the ragged qo_indptr_host's counts.
Status host_query_counts(const MlaDecodePlanArguments& args, std::vector<std::int32_t>& counts) {
  const MlaDecodeProblem& p = args.problem;
  const auto batch = static_cast<std::size_t>(p.batch_size);
  if (!p.ragged_queries) {
    if (!args.qo_indptr_host.empty()) {
      return make_status(StatusCode::invalid_argument, "qo_indptr_host is for the ragged form (problem.ragged_queries)");
    }
    counts.assign(batch, p.query_tokens);
    return {};
  }
  if (args.qo_indptr_host.size() != batch + 1 || args.qo_indptr_host[0] != 0) {
    return make_status(StatusCode::invalid_argument, "ragged MLA queries need qo_indptr_host of batch_size + 1 = ",
                       batch + 1, " entries starting at 0; got ", args.qo_indptr_host.size(), " entries");
  }
  counts.assign(batch, 0);
  for (std::size_t b = 0; b < batch; ++b) {
    const std::int64_t count = static_cast<std::int64_t>(args.qo_indptr_host[b + 1]) - args.qo_indptr_host[b];
    if (count < 0 || count > p.query_tokens) {
      return make_status(StatusCode::invalid_argument, "request ", b, " has ", count,
                         " query tokens; the ragged form takes 0 .. query_tokens = ", p.query_tokens);
    }
    counts[b] = static_cast<std::int32_t>(count);
  }
  return {};
}

}  // namespace

Status validate_mla_decode_problem(const MlaDecodeProblem& p) {
  if (p.latent_dim != mla_latent_dim || p.rope_dim != mla_rope_dim) {
    return make_status(StatusCode::unsupported, "MLA decode supports latent_dim 512 and rope_dim 64, got ",
                       p.latent_dim, " and ", p.rope_dim);
  }
  if (!supported_mla_heads(p.num_heads)) {
    return make_status(StatusCode::unsupported, "MLA decode with ", p.num_heads,
                       " heads is not supported (8, 16, 32, 64 or 128)");
  }
  const std::int32_t max_query_tokens = p.ragged_queries ? mla_max_chunk_query_tokens : mla_max_query_tokens;
  if (p.query_tokens < 1 || p.query_tokens > max_query_tokens) {
    return make_status(StatusCode::unsupported, "MLA decode takes 1..", max_query_tokens, " query tokens per request",
                       p.ragged_queries ? " (ragged chunks)" : "", ", got ", p.query_tokens);
  }
  if (p.batch_size < 0) {
    return make_status(StatusCode::invalid_argument, "batch_size ", p.batch_size, " < 0");
  }
  if (!supported_page_size(p.page_size)) {
    return unsupported_page_size("MLA ", p.page_size);
  }
  if (p.q_dtype != ActivationDtype::bf16) {
    return make_status(StatusCode::unsupported, "MLA decode takes bf16 queries and outputs");
  }
  return check_mla_format(p.kv_dtype, p.scale_mode);
}

Result<MlaDecodePlan> make_mla_decode_plan(const MlaDecodePlanArguments& args) {
  const MlaDecodeProblem& p = args.problem;
  SLIMSERVE_RETURN_IF_ERROR(validate_mla_decode_problem(p));
  if (args.num_sms < 1 || args.ctas_per_sm < 0 || args.min_chunk_tokens < 1) {
    return make_status(StatusCode::invalid_argument, "num_sms (", args.num_sms, ") and min_chunk_tokens (",
                       args.min_chunk_tokens, ") must be >= 1, ctas_per_sm (", args.ctas_per_sm,
                       ") >= 0 (0: the kernel's)");
  }
  std::vector<std::int64_t> kv_len;
  SLIMSERVE_RETURN_IF_ERROR(host_lengths(args, kv_len));
  std::vector<std::int32_t> query_count;
  SLIMSERVE_RETURN_IF_ERROR(host_query_counts(args, query_count));

  MlaDecodePlan plan;
  plan.problem = p;
  plan.warps_m = warps_m_for(p);
  plan.cta_rows = 16 * plan.warps_m;
  const auto batch = static_cast<std::size_t>(p.batch_size);
  std::vector<std::int32_t> row_tiles(batch);
  std::int64_t units = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    row_tiles[b] = static_cast<std::int32_t>(ceil_div(static_cast<std::int64_t>(p.num_heads) * query_count[b], plan.cta_rows));
    units += row_tiles[b];
  }
  const std::int64_t max_kv = kv_len.empty() ? 0 : *std::max_element(kv_len.begin(), kv_len.end());
  const auto splits_of = [](std::int64_t len, std::int64_t chunk) { return len <= chunk ? 1 : ceil_div(len, chunk); };
  const auto items_for = [&](std::int64_t chunk) {
    std::int64_t items = 0;
    for (std::size_t b = 0; b < batch; ++b) items += splits_of(kv_len[b], chunk) * row_tiles[b];
    return items;
  };
  // Unsplit when the batch fills the device; else the smallest chunk whose CTAs fit one wave.
  std::int64_t granules = std::max<std::int64_t>(1, ceil_div(max_kv, chunk_granule));
  // The split fills the CTA slots the chosen kernel has (two per SM for the 16-row FP8
  // kernel: a one-per-SM split would leave it with half the bytes in flight).
  const std::int64_t max_ctas = static_cast<std::int64_t>(args.num_sms) * ctas_per_sm_for(p, args.ctas_per_sm);
  if (args.allow_split && units < max_ctas && max_kv > 0) {
    granules = detail::smallest_fitting_chunk(ceil_div(args.min_chunk_tokens, chunk_granule), granules,
                                              [&](std::int64_t g) { return items_for(g * chunk_granule) <= max_ctas; });
  }
  const std::int64_t chunk = granules * chunk_granule;
  const std::int64_t items = items_for(chunk);
  if (items > std::numeric_limits<std::int32_t>::max() / 8 || chunk > std::numeric_limits<std::int32_t>::max()) {
    return make_status(StatusCode::invalid_argument, "MLA decode plan needs ", items, " work items");
  }
  plan.chunk_tokens = static_cast<std::int32_t>(chunk);
  plan.num_work_items = static_cast<std::int32_t>(items);
  plan.num_units = static_cast<std::int32_t>(units);
  plan.split_kv = items > units;
  const auto w = static_cast<std::size_t>(items);
  const auto u = static_cast<std::size_t>(units);
  plan.layout = layout_for(w, u, batch, plan.split_kv, plan.cta_rows);
  plan.host_ints.assign(plan.layout.int_bytes / sizeof(std::int32_t), 0);
  std::int32_t* work_request = plan.host_ints.data();
  std::int32_t* work_row_tile = work_request + w;
  std::int32_t* work_split = work_row_tile + w;
  std::int32_t* work_num_splits = work_split + w;
  std::int32_t* unit_request = work_num_splits + w;
  std::int32_t* unit_row_tile = unit_request + u;
  std::int32_t* unit_indptr = unit_row_tile + u;
  std::int32_t* qo_indptr = unit_indptr + u + 1;
  std::int32_t item = 0;
  std::size_t unit = 0;
  // Row tiles of one request are neighbours in the grid, so they share the latent in L2.
  for (std::size_t b = 0; b < batch; ++b) {
    const auto splits = static_cast<std::int32_t>(splits_of(kv_len[b], chunk));
    for (std::int32_t tile = 0; tile < row_tiles[b]; ++tile, ++unit) {
      unit_request[unit] = static_cast<std::int32_t>(b);
      unit_row_tile[unit] = tile;
      unit_indptr[unit] = item;
      for (std::int32_t split = 0; split < splits; ++split, ++item) {
        work_request[item] = static_cast<std::int32_t>(b);
        work_row_tile[item] = tile;
        work_split[item] = split;
        work_num_splits[item] = splits;
      }
    }
  }
  unit_indptr[u] = item;
  qo_indptr[0] = 0;
  for (std::size_t b = 0; b < batch; ++b) qo_indptr[b + 1] = qo_indptr[b] + query_count[b];
  return plan;
}

Result<std::size_t> mla_decode_workspace_size(const MlaDecodePlanArguments& requested) {
  MlaDecodePlanArguments args = requested;  // num_sms 0: as plan_mla_decode resolves it
  SLIMSERVE_RETURN_IF_ERROR(detail::resolve_num_sms(args.num_sms));
  Result<MlaDecodePlan> plan = make_mla_decode_plan(args);
  if (!plan.ok()) return plan.status();
  return plan->layout.total_bytes;
}

Result<std::size_t> mla_decode_workspace_bound(const MlaDecodeWorkspaceBound& requested) {
  MlaDecodeWorkspaceBound bound = requested;
  SLIMSERVE_RETURN_IF_ERROR(detail::resolve_num_sms(bound.num_sms));  // 0: the current device
  const MlaDecodeProblem& p = bound.problem;
  SLIMSERVE_RETURN_IF_ERROR(validate_mla_decode_problem(p));
  if (bound.num_sms < 1 || bound.ctas_per_sm < 0) {
    return make_status(StatusCode::invalid_argument,
                       "workspace bound needs num_sms >= 0 (0: the current device) and ctas_per_sm >= 0 (0: the "
                       "kernel's)");
  }
  const std::int32_t cta_rows = 16 * warps_m_for(p);
  const std::int64_t row_tiles = ceil_div(static_cast<std::int64_t>(p.num_heads) * p.query_tokens, cta_rows);
  const std::int64_t units = static_cast<std::int64_t>(p.batch_size) * row_tiles;
  // Every unit has at least one item, and a split plan (units < max_ctas) has items <=
  // max_ctas: items <= max(units, max_ctas). A smaller batch may split even when the largest
  // does not, so the partials are sized for max_ctas items whenever one request's row tiles
  // leave room to split.
  const std::int64_t max_ctas = static_cast<std::int64_t>(bound.num_sms) * ctas_per_sm_for(p, bound.ctas_per_sm);
  const std::int64_t items = std::max(units, max_ctas);
  const bool may_split = row_tiles < max_ctas;
  return layout_for(static_cast<std::size_t>(items), static_cast<std::size_t>(units),
                    static_cast<std::size_t>(p.batch_size), may_split, cta_rows)
      .total_bytes;
}

}  // namespace attention
SLIMSERVE_NAMESPACE_END
