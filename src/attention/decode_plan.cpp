#include "slimserve/attention/decode_plan.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {
namespace {

constexpr std::size_t workspace_alignment = 256;

constexpr std::size_t align_up(std::size_t bytes) {
  return (bytes + workspace_alignment - 1) / workspace_alignment * workspace_alignment;
}

constexpr std::int32_t next_power_of_two(std::int32_t x) {
  std::int32_t p = 1;
  while (p < x) p *= 2;
  return p;
}

/// Splits of a request with `pages` pages for chunks of `chunk_pages` (an empty request still
/// owns one work item, which writes its empty state).
constexpr std::int64_t splits_for(std::int32_t pages, std::int32_t chunk_pages) {
  return pages <= chunk_pages ? 1 : (pages + chunk_pages - 1) / chunk_pages;
}

Status validate_host_page_table(const DecodePlanArguments& args) {
  const DecodeProblem& p = args.problem;
  if (args.indptr_host.size() != static_cast<std::size_t>(p.batch_size) + 1 ||
      args.last_page_len_host.size() != static_cast<std::size_t>(p.batch_size)) {
    return make_status(StatusCode::invalid_argument, "host page table has indptr of ",
                       args.indptr_host.size(), " and last_page_len of ",
                       args.last_page_len_host.size(), " entries; batch_size ", p.batch_size,
                       " needs ", p.batch_size + 1, " and ", p.batch_size);
  }
  if (args.indptr_host[0] != 0) {
    return make_status(StatusCode::invalid_argument, "indptr[0] must be 0, got ",
                       args.indptr_host[0]);
  }
  for (std::int32_t b = 0; b < p.batch_size; ++b) {
    const std::int32_t pages = args.indptr_host[static_cast<std::size_t>(b) + 1] -
                               args.indptr_host[static_cast<std::size_t>(b)];
    if (pages < 0) {
      return make_status(StatusCode::invalid_argument, "indptr decreases at request ", b, " (",
                         args.indptr_host[static_cast<std::size_t>(b)], " -> ",
                         args.indptr_host[static_cast<std::size_t>(b) + 1], ")");
    }
    const std::int32_t last = args.last_page_len_host[static_cast<std::size_t>(b)];
    if (pages > 0 && (last < 1 || last > p.page_size)) {
      return make_status(StatusCode::invalid_argument, "last_page_len[", b, "] = ", last,
                         " is outside [1, page_size = ", p.page_size, "]");
    }
    // The same rule as the page-table validator and the GPU tag check, so a table they abort
    // is never planned as valid: a request with no pages has last_page_len 0.
    if (pages == 0 && last != 0) {
      return make_status(StatusCode::invalid_argument, "last_page_len[", b, "] = ", last,
                         " for a request with no pages (must be 0)");
    }
  }
  return {};
}

}  // namespace

DecodeBlockShape decode_block_shape(const DecodeProblem& problem) {
  DecodeBlockShape shape;
  // 16 bytes of the stored type per lane; a block-scaled format (NVFP4): one scale block,
  // its 8 bytes of codes and its scale (decode_kernel.cuh, load_nvfp4_block).
  const KvFormatInfo& format = kv_format_info(problem.kv_dtype);
  const std::int32_t vector_elements = format.scale_block > 0 ? format.scale_block : 128 / format.bits;
  shape.lanes = problem.head_dim / vector_elements;
  shape.rows = problem.num_kv_heads > 0
                   ? problem.query_tokens * (problem.num_qo_heads / problem.num_kv_heads)
                   : 0;
  shape.padded_rows = next_power_of_two(std::max(shape.rows, 1));
  // At least 128 threads per block: small groups work on several tokens at once.
  const std::int32_t base = shape.lanes * shape.padded_rows;
  shape.token_groups = base >= 128 ? 1 : 128 / std::max(base, 1);
  return shape;
}

Status validate_decode_problem(const DecodeProblem& p) {
  if (!is_valid(p.kv_dtype)) {
    return make_status(StatusCode::invalid_argument, "unknown KV dtype ",
                       static_cast<int>(p.kv_dtype), " (one of ", kv_format_names(), ")");
  }
  SLIMSERVE_RETURN_IF_ERROR(require_kernel(p.kv_dtype, KvKernel::decode));
  if (p.batch_size < 0) {
    return make_status(StatusCode::invalid_argument, "batch_size ", p.batch_size, " < 0");
  }
  if (!VectorKernelHeadDims::contains(p.head_dim)) {
    return make_status(StatusCode::unsupported, "head_dim ", p.head_dim,
                       " is not supported by the CUDA-core decode (", VectorKernelHeadDims::describe(),
                       "; paged attention takes ", PagedHeadDims::describe(), ")");
  }
  if (!supported_page_size(p.page_size)) {
    return unsupported_page_size("", p.page_size);
  }
  if (p.num_kv_heads <= 0 || p.num_qo_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) {
    return make_status(StatusCode::unsupported, "num_qo_heads ", p.num_qo_heads,
                       " must be a positive multiple of num_kv_heads ", p.num_kv_heads);
  }
  if (p.query_tokens < 1 || p.query_tokens > max_query_tokens) {
    return make_status(StatusCode::unsupported, "query_tokens ", p.query_tokens,
                       " is outside [1, ", max_query_tokens, "]");
  }
  const DecodeBlockShape shape = decode_block_shape(p);
  if (shape.threads() > max_decode_block_threads) {
    return make_status(StatusCode::unsupported, "GQA group ", p.num_qo_heads / p.num_kv_heads,
                       " x query_tokens ", p.query_tokens, " = ", shape.rows,
                       " query rows per KV head need ", shape.threads(),
                       " threads for head_dim ", p.head_dim, " ", to_string(p.kv_dtype),
                       "; at most ", max_decode_block_threads);
  }
  return {};
}

Result<DecodePlan> make_decode_plan(const DecodePlanArguments& args) {
  const DecodeProblem& p = args.problem;
  SLIMSERVE_RETURN_IF_ERROR(validate_decode_problem(p));
  SLIMSERVE_RETURN_IF_ERROR(validate_host_page_table(args));
  if (args.max_ctas < 1 || args.min_chunk_tokens < 1) {
    return make_status(StatusCode::invalid_argument, "max_ctas (", args.max_ctas,
                       ") and min_chunk_tokens (", args.min_chunk_tokens, ") must be >= 1");
  }

  std::int32_t max_pages = 1;
  for (std::int32_t b = 0; b < p.batch_size; ++b) {
    max_pages = std::max(max_pages, args.indptr_host[static_cast<std::size_t>(b) + 1] -
                                        args.indptr_host[static_cast<std::size_t>(b)]);
  }
  auto total_items = [&](std::int32_t chunk_pages) {
    std::int64_t items = 0;
    for (std::int32_t b = 0; b < p.batch_size; ++b) {
      items += splits_for(args.indptr_host[static_cast<std::size_t>(b) + 1] -
                              args.indptr_host[static_cast<std::size_t>(b)],
                          chunk_pages);
    }
    return items;
  };

  // Smallest chunk (most parallelism) whose CTAs still fit in one wave; a batch that already
  // fills the device is not split (splitting would only add merge traffic).
  std::int32_t chunk_pages = max_pages;
  const std::int64_t unsplit_ctas = static_cast<std::int64_t>(p.batch_size) * p.num_kv_heads;
  if (args.allow_split && unsplit_ctas < args.max_ctas) {
    std::int32_t lo = std::min(max_pages, (args.min_chunk_tokens + p.page_size - 1) / p.page_size);
    std::int32_t hi = max_pages;
    while (lo < hi) {
      const std::int32_t mid = lo + (hi - lo) / 2;
      if (total_items(mid) * p.num_kv_heads <= args.max_ctas) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    chunk_pages = lo;
  }
  const std::int64_t items = total_items(chunk_pages);
  if (items > std::numeric_limits<std::int32_t>::max() / 4) {
    return make_status(StatusCode::invalid_argument, "decode plan needs ", items, " work items");
  }

  DecodePlan plan;
  plan.problem = p;
  plan.num_work_items = static_cast<std::int32_t>(items);
  plan.num_partials = plan.num_work_items;
  plan.split_kv = items > p.batch_size;
  plan.chunk_tokens = chunk_pages * p.page_size;

  const std::size_t w = static_cast<std::size_t>(items);
  const std::size_t batch = static_cast<std::size_t>(p.batch_size);
  plan.host_ints.assign(2 * w + batch + 1, 0);
  std::int32_t* work_request = plan.host_ints.data();
  std::int32_t* work_split = work_request + w;
  std::int32_t* split_indptr = work_split + w;
  std::int32_t item = 0;
  for (std::int32_t b = 0; b < p.batch_size; ++b) {
    split_indptr[b] = item;
    const auto splits = static_cast<std::int32_t>(splits_for(
        args.indptr_host[static_cast<std::size_t>(b) + 1] - args.indptr_host[static_cast<std::size_t>(b)],
        chunk_pages));
    for (std::int32_t s = 0; s < splits; ++s, ++item) {
      work_request[item] = b;
      work_split[item] = s;
    }
  }
  split_indptr[p.batch_size] = item;

  DecodeWorkspaceLayout& layout = plan.layout;
  layout.work_request = 0;
  layout.work_split = w * sizeof(std::int32_t);
  layout.split_indptr = 2 * w * sizeof(std::int32_t);
  layout.int_bytes = plan.host_ints.size() * sizeof(std::int32_t);
  std::size_t offset = align_up(layout.int_bytes);
  if (plan.split_kv) {
    const std::size_t rows = w * static_cast<std::size_t>(p.query_tokens) *
                             static_cast<std::size_t>(p.num_qo_heads);
    layout.partial_o = offset;
    offset = align_up(offset + rows * static_cast<std::size_t>(p.head_dim) * sizeof(float));
    layout.partial_lse = offset;
    offset = align_up(offset + rows * sizeof(float));
  } else {
    layout.partial_o = offset;
    layout.partial_lse = offset;
  }
  layout.total_bytes = offset;
  return plan;
}

Result<std::size_t> decode_workspace_size(const DecodePlanArguments& args) {
  Result<DecodePlan> plan = make_decode_plan(args);
  if (!plan.ok()) return plan.status();
  return plan->layout.total_bytes;
}

}  // namespace attention
SLIMSERVE_NAMESPACE_END
