#pragma once
/// \file
/// \brief Epilogue of the ping-pong wgmma prefill kernel: the two consumer warpgroups, which
/// ran the same 64 rows over alternate KV tiles, merge their running states through shared
/// memory (thread i of one warpgroup holds the same rows and columns as thread i of the other:
/// the wgmma accumulator layout), and the first writes the rows straight from the
/// accumulators, as the one-warpgroup kernel's epilogue does (sinks, lse, split partials).

#include <cmath>
#include <cstdint>

#include "slimserve/arch/named_barrier.cuh"
#include "slimserve/attention/kernels/prefill_tile_softmax.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// One consumer warpgroup's state, [value][thread] so that the 128 threads' stores and loads
/// of one value are consecutive words.
template <int OutputValues>
struct PrefillMergeExchange {
  float o[OutputValues][128];
  float row_max[2][128];
  float row_sum[2][128];
};

/// Consumer 1 publishes its state and leaves; consumer 0 folds it into its own. `barrier`: a
/// named barrier id of the two consumer warpgroups (256 threads); `i`: the thread's index in
/// its warpgroup.
template <int OutputValues>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE bool prefill_merge_consumers(PrefillRowState<OutputValues>& state,
                                                                    PrefillMergeExchange<OutputValues>& x,
                                                                    int consumer, int i, std::uint32_t barrier) {
  if (consumer == 1) {
SLIMSERVE_ATTENTION_UNROLL
    for (int e = 0; e < OutputValues; ++e) x.o[e][i] = state.o[e];
SLIMSERVE_ATTENTION_UNROLL
    for (int half = 0; half < 2; ++half) {
      x.row_max[half][i] = state.row_max[half];
      x.row_sum[half][i] = state.row_sum[half];
    }
    arch::named_barrier_arrive(barrier, 256);
    return false;
  }
  arch::named_barrier_sync(barrier, 256);
  float weight[2][2];  // [row half][own, other]
SLIMSERVE_ATTENTION_UNROLL
  for (int half = 0; half < 2; ++half) {
    const float other_max = x.row_max[half][i];
    const float m = fmaxf(state.row_max[half], other_max);
    const float base = m == -INFINITY ? 0.0f : m;  // neither saw a token: both weights 0
    weight[half][0] = fast_exp2(state.row_max[half] - base);
    weight[half][1] = fast_exp2(other_max - base);
    state.row_sum[half] = state.row_sum[half] * weight[half][0] + x.row_sum[half][i] * weight[half][1];
    state.row_max[half] = m;
  }
SLIMSERVE_ATTENTION_UNROLL
  for (int e = 0; e < OutputValues; ++e) {
    const int half = (e / 2) % 2;
    state.o[e] = state.o[e] * weight[half][0] + x.o[e][i] * weight[half][1];
  }
  return true;
}

/// Rows 16 w + g + 8 half of the CTA's row tile, columns 8 (i / 4) + 2 t + i % 2 of o[i]
/// with (i / 2) % 2 == half: normalized output and lse (unsplit) or partial output and lse
/// (split), sinks counted once (here when unsplit, in the merge when split).
template <class QT, int HeadDim, int OutputValues>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void prefill_store_rows(const PagedAttentionParams& p,
                                                               const PrefillRowState<OutputValues>& state,
                                                               std::int32_t work, std::int32_t kv_head,
                                                               std::int32_t qo_begin, std::int64_t tile_row0,
                                                               std::int64_t valid_rows, float out_scale, int w,
                                                               int g, int t) {
  constexpr int rows = 64;
SLIMSERVE_ATTENTION_UNROLL
  for (int half = 0; half < 2; ++half) {
    float sum = state.row_sum[half];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = 16 * w + g + 8 * half;
    const std::int64_t packed = tile_row0 + r;
    if (packed >= valid_rows && !p.split_kv) continue;
    const std::int64_t head = static_cast<std::int64_t>(kv_head) * p.group_size + packed % p.group_size;
    const float sink = (!p.split_kv && p.sinks != nullptr && packed < valid_rows) ? p.sinks[head] * paged_log2_e : -INFINITY;
    const float m = state.row_max[half];
    const float top = fmaxf(m, sink);
    // top is -inf for a row that saw nothing, and for one whose every score was NaN (the
    // running max drops them): base 0 then gives weight 0, and sum x 0 keeps a NaN sum NaN.
    const float base = top == -INFINITY ? 0.0f : top;
    const float weight = exp2f(m - base);
    sum = sum * weight + exp2f(sink - base);
    const bool empty = sum == 0.0f;  // a NaN sum (a NaN key read) is not empty: NaN row and lse
    const float norm = empty ? 0.0f : weight * out_scale / sum;
    const float lse = empty ? -INFINITY : (top + log2f(sum)) * paged_ln_2;
    if (p.split_kv) {
      const std::int64_t partial_row = (static_cast<std::int64_t>(work) * p.num_kv_heads + kv_head) * rows + r;
      float* po = p.partial_o + partial_row * HeadDim;
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < OutputValues; i += 4) {
        const int column = 8 * (i / 4) + 2 * t;
        po[column] = state.o[i + 2 * half] * norm;
        po[column + 1] = state.o[i + 2 * half + 1] * norm;
      }
      if (t == 0) p.partial_lse[partial_row] = packed < valid_rows ? lse : -INFINITY;
    } else {
      const std::int64_t token = qo_begin + packed / p.group_size;
      QT* o = static_cast<QT*>(p.o) + token * p.o_token_stride + head * p.o_head_stride;
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < OutputValues; i += 4) {
        const int column = 8 * (i / 4) + 2 * t;
        store4(o + column, pack_pair<QT>(state.o[i + 2 * half] * norm, state.o[i + 2 * half + 1] * norm));
      }
      if (p.lse != nullptr && t == 0) p.lse[token * p.num_qo_heads + head] = lse;
    }
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
