#pragma once
/// \file
/// \brief Merge of partial attention states (o_i, lse_i) over KV splits into one output.
///
/// o = sum_i exp(lse_i - M) o_i / sum_i exp(lse_i - M), lse = M + log(sum_i exp(lse_i - M)),
/// M = max_i lse_i. Partials with lse = -inf (empty ranges) weigh nothing; if all are empty the
/// output is 0 with lse = -inf. A NaN lse marks a partial of an aborted request: the output
/// row becomes NaN with lse = -inf.
/// Grid: (batch_size, rows_per_request); block: head_dim threads, one output element each.

#include <cmath>
#include <cstdint>

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

struct MergeParams {
  const float* partial_o;            // [P, rows_per_request, D]
  const float* partial_lse;          // [P, rows_per_request]
  const std::int32_t* split_indptr;  // [B + 1]: partials of request b
  void* o;                           // [B, rows_per_request, D]
  float* lse;                        // [B, rows_per_request] or null
  std::int32_t rows_per_request;     // query_tokens * num_qo_heads
  std::int32_t head_dim;
};

template <class OutT>
__global__ void merge_states_kernel(const MergeParams p) {
  const std::int32_t b = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t row = static_cast<std::int32_t>(blockIdx.y);
  const std::int32_t d = static_cast<std::int32_t>(threadIdx.x);
  const std::int32_t first = p.split_indptr[b];
  const std::int32_t last = p.split_indptr[b + 1];

  float max_lse = -INFINITY;
  bool marked = false;
  for (std::int32_t i = first; i < last; ++i) {
    const float l = p.partial_lse[static_cast<std::int64_t>(i) * p.rows_per_request + row];
    marked = marked || std::isnan(l);
    max_lse = fmaxf(max_lse, l);
  }
  const std::int64_t out_row = static_cast<std::int64_t>(b) * p.rows_per_request + row;
  float value = 0.0f;
  float out_lse = -INFINITY;
  if (marked) {
    value = NAN;
  } else if (max_lse != -INFINITY) {
    float sum = 0.0f;
    for (std::int32_t i = first; i < last; ++i) {
      const std::int64_t partial_row = static_cast<std::int64_t>(i) * p.rows_per_request + row;
      const float w = expf(p.partial_lse[partial_row] - max_lse);
      sum += w;
      value = fmaf(w, p.partial_o[partial_row * p.head_dim + d], value);
    }
    value /= sum;
    out_lse = max_lse + logf(sum);
  }
  if (d < p.head_dim) static_cast<OutT*>(p.o)[out_row * p.head_dim + d] = from_float<OutT>(value);
  if (p.lse != nullptr && d == 0) p.lse[out_row] = out_lse;
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
