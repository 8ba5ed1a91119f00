#pragma once
/// \file
/// \brief Merge of partial attention states (o_i, lse_i) over KV splits into one output row.
///
/// o = (sum_i e^(lse_i - M) o_i) / (e^(sink - M) + sum_i e^(lse_i - M)),
/// lse = M + log(e^(sink - M) + sum_i e^(lse_i - M)), M = max(sink, max_i lse_i), natural log;
/// sink = -inf when there is none. Partials with lse = -inf (empty ranges) weigh nothing; if all
/// are empty the output is 0 with lse = -inf. A NaN lse marks a partial of an aborted request:
/// the output row becomes NaN with lse = -inf.
///
/// One body, `merge_states<OutT>(params)`, for every split-KV producer; the Params' `locate`
/// says which partials and which output a CTA's row has:
///   - MergeParams (merge_states_kernel): the CUDA-core decode's dense [B, rows_per_request]
///     rows, and the public merge_attention_states;
///   - PagedMergeParams (paged_merge_kernel): tensor-core paged attention's and MLA's packed
///     (token, head) rows of work units, strided output, attention sinks.
/// Grid: (row groups, rows per group); block: head_dim threads, one output element each.

#include <cmath>
#include <cstdint>

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// What a CTA merges: partial rows first_row + i * row_step for i in [first, last), into
/// out_offset (elements, for d = 0) and lse_index.
struct MergeRow {
  bool valid = false;  // false: padding, nothing written
  std::int32_t first = 0, last = 0;
  std::int64_t partial_row0 = 0;  // partial row of split index 0
  std::int64_t partial_row_step = 0;
  std::int64_t out_offset = 0;
  std::int64_t lse_index = 0;
  float sink = -INFINITY;  // natural log
};

struct MergeParams {
  const float* partial_o;            // [P, rows_per_request, D]
  const float* partial_lse;          // [P, rows_per_request]
  const std::int32_t* split_indptr;  // [B + 1]: partials of request b
  void* o;                           // [B, rows_per_request, D]
  float* lse;                        // [B, rows_per_request] or null
  std::int32_t rows_per_request;     // query_tokens * num_qo_heads
  std::int32_t head_dim;

  /// Grid (B, rows_per_request).
  SLIMSERVE_DEVICE MergeRow locate(std::int32_t b, std::int32_t row) const {
    MergeRow m;
    m.valid = true;
    m.first = split_indptr[b];
    m.last = split_indptr[b + 1];
    m.partial_row0 = row;
    m.partial_row_step = rows_per_request;
    const std::int64_t out_row = static_cast<std::int64_t>(b) * rows_per_request + row;
    m.out_offset = out_row * head_dim;
    m.lse_index = out_row;
    return m;
  }
};

struct PagedMergeParams {
  const float* partial_o;            // [W, H_kv, cta_rows, D]
  const float* partial_lse;          // [W, H_kv, cta_rows]
  const std::int32_t* unit_request;  // [U]
  const std::int32_t* unit_row_tile; // [U]
  const std::int32_t* unit_indptr;   // [U + 1]: work items of unit u (its KV splits)
  const std::int32_t* qo_indptr;     // [B + 1]
  void* o;
  float* lse;
  std::int64_t o_token_stride, o_head_stride;
  const float* sinks;  // [H_qo] or null
  std::int32_t num_kv_heads;
  std::int32_t num_qo_heads;
  std::int32_t group_size;
  std::int32_t cta_rows;
  std::int32_t head_dim;

  /// Grid (units, H_kv * cta_rows); packed row = row_tile * cta_rows + r = token * group +
  /// head-in-group; padding rows past the request's are not written.
  SLIMSERVE_DEVICE MergeRow locate(std::int32_t unit, std::int32_t y) const {
    MergeRow m;
    const std::int32_t kv_head = y / cta_rows;
    const std::int32_t r = y % cta_rows;
    const std::int32_t b = unit_request[unit];
    const std::int32_t qo_len = qo_indptr[b + 1] - qo_indptr[b];
    const std::int64_t packed = static_cast<std::int64_t>(unit_row_tile[unit]) * cta_rows + r;
    if (qo_len < 0 || packed >= static_cast<std::int64_t>(qo_len) * group_size) return m;
    const std::int64_t token = qo_indptr[b] + packed / group_size;
    const std::int64_t head = static_cast<std::int64_t>(kv_head) * group_size + packed % group_size;
    m.valid = true;
    m.first = unit_indptr[unit];
    m.last = unit_indptr[unit + 1];
    m.partial_row0 = static_cast<std::int64_t>(kv_head) * cta_rows + r;
    m.partial_row_step = static_cast<std::int64_t>(num_kv_heads) * cta_rows;
    m.out_offset = token * o_token_stride + head * o_head_stride;
    m.lse_index = token * num_qo_heads + head;
    if (sinks != nullptr) m.sink = sinks[head];
    return m;
  }
};

/// The merge body of both kernels below.
template <class OutT, class Rows>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void merge_states(const Rows& p) {
  const MergeRow m = p.locate(static_cast<std::int32_t>(blockIdx.x), static_cast<std::int32_t>(blockIdx.y));
  if (!m.valid) return;
  const std::int32_t d = static_cast<std::int32_t>(threadIdx.x);
  auto partial_row = [&](std::int32_t i) { return m.partial_row0 + static_cast<std::int64_t>(i) * m.partial_row_step; };
  float top = m.sink;
  bool marked = false;
  for (std::int32_t i = m.first; i < m.last; ++i) {
    const float l = p.partial_lse[partial_row(i)];
    marked = marked || std::isnan(l);
    top = fmaxf(top, l);
  }
  float value = 0.0f;
  float out_lse = -INFINITY;
  if (marked) {
    value = NAN;
  } else if (top != -INFINITY) {
    float sum = expf(m.sink - top);  // 0 without a sink
    for (std::int32_t i = m.first; i < m.last; ++i) {
      const float weight = expf(p.partial_lse[partial_row(i)] - top);
      sum += weight;
      value = fmaf(weight, p.partial_o[partial_row(i) * p.head_dim + d], value);
    }
    value /= sum;
    out_lse = top + logf(sum);
  }
  if (d < p.head_dim) static_cast<OutT*>(p.o)[m.out_offset + d] = from_float<OutT>(value);
  if (p.lse != nullptr && d == 0) p.lse[m.lse_index] = out_lse;
}

/// The CUDA-core decode's merge (and merge_attention_states).
template <class OutT>
__global__ void merge_states_kernel(const MergeParams p) {
  merge_states<OutT>(p);
}

/// Tensor-core paged attention's and MLA's merge.
template <class OutT>
__global__ void paged_merge_kernel(const PagedMergeParams p) {
  merge_states<OutT>(p);
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
