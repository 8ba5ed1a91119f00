#pragma once
/// \file
/// \brief The online softmax of one 64-token tile of a wgmma prefill warpgroup, on the
/// accumulator registers of S[64 rows][64 tokens] (m64n64, FP32): mask, running row maximum,
/// rescale of the output accumulator, P = exp2(S - max) rounded straight into the A fragments
/// of the next product (the accumulator of m64nN holds exactly the A fragment of the P.V
/// product: p[k][r] = s[8k + 2r .. +1]). The same numbers as the one-warpgroup wgmma kernel
/// (paged_prefill_wgmma_kernel), so both share the tests' tolerances.
///
/// Thread layout (wgmma accumulator): warp w of the warpgroup, lane = 4 g + t; s[e] is row
/// 16 w + g + 8 ((e / 2) % 2), token 8 (e / 4) + 2 t + e % 2 of the tile; o[e] likewise with
/// head_dim columns.

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "slimserve/attention/kernels/paged_attention_kernel.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// Which scores of a tile a thread's two rows may see (the masked variant only): per row
/// half the tile's visible columns [column_begin, column_end) and, per token, a valid page id.
/// The bounds are the row's causal end, window start and the range's end, computed once per
/// tile (PrefillRowRange::tile_mask) so that the per-score test is two 32-bit compares.
struct PrefillTileMask {
  std::uint64_t token_ok;          // bit c: token c of the tile has a valid page id
  std::int32_t column_begin[2];    // in [0, 64]
  std::int32_t column_end[2];      // in [0, 64]; 0 for a padding row
};

/// What a thread's two rows may see over the whole KV range, in positions (64-bit: the
/// request may be up to INT32_MAX tokens long, a tile may end past it).
struct PrefillRowRange {
  std::int64_t kv_end;             // first position past the visible range
  std::int64_t query_position[2];  // of the thread's rows (row half 0, 1); -1: padding row
  bool row_valid[2];
  bool causal;
  bool windowed;
  std::int32_t window_left;

  /// The tile starting at `tile_begin` as column bounds, clamped to [0, stage] (the visible
  /// columns of a row: kv_end, its causal end, its window start).
  template <int Stage>
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE PrefillTileMask tile_mask(std::int64_t tile_begin, std::uint64_t token_ok) const {
    PrefillTileMask mask;
    mask.token_ok = token_ok;
SLIMSERVE_ATTENTION_UNROLL
    for (int half = 0; half < 2; ++half) {
      std::int64_t end = kv_end - tile_begin;
      if (causal && query_position[half] + 1 - tile_begin < end) end = query_position[half] + 1 - tile_begin;
      std::int64_t begin = windowed ? query_position[half] - window_left - tile_begin : 0;
      if (!row_valid[half]) end = 0;
      mask.column_end[half] = static_cast<std::int32_t>(end < 0 ? 0 : (end > Stage ? Stage : end));
      mask.column_begin[half] = static_cast<std::int32_t>(begin < 0 ? 0 : (begin > Stage ? Stage : begin));
    }
    return mask;
  }
};

/// Score scaling: plain tiles scale the row maximum once (score_scale > 0); soft-capped ones
/// map every score through cap_out tanh(x cap_in).
struct PrefillScoreScale {
  float score_scale;  // raw q.k -> log2 units
  float cap_in;
  float cap_out;
};

/// Running state of the thread's two rows.
template <int OutputValues>
struct PrefillRowState {
  float row_max[2];
  float row_sum[2];  // this lane's columns only; quad-reduced in the epilogue
  float o[OutputValues];

  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void clear() {
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
SLIMSERVE_ATTENTION_UNROLL
    for (int i = 0; i < OutputValues; ++i) o[i] = 0.0f;
  }
};

/// One tile: s[ScoreValues] in, p_frag[ScoreValues / 8][4] (A fragments of the mma type) out,
/// `state` advanced. Masked / Capped are compiled apart so the steady state has no per-element
/// branch. `t`: the thread's lane % 4.
template <class MmaT, bool Masked, bool Capped, int ScoreValues, int OutputValues>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void prefill_tile_softmax(float (&s)[ScoreValues],
                                                                 PrefillRowState<OutputValues>& state,
                                                                 std::uint32_t (&p_frag)[ScoreValues / 8][4],
                                                                 const PrefillScoreScale& scale,
                                                                 const PrefillTileMask& mask, int t) {
  constexpr bool plain = !Masked && !Capped;
  float block_max[2] = {-INFINITY, -INFINITY};
SLIMSERVE_ATTENTION_UNROLL
  for (int e = 0; e < ScoreValues; ++e) {
    const int half = (e / 2) % 2;
    float x = s[e];
    if constexpr (!plain) {
      x = Capped ? scale.cap_out * tanhf(x * scale.cap_in) : x * scale.score_scale;
    }
    if constexpr (Masked) {
      const int column = 8 * (e / 4) + 2 * t + e % 2;
      const bool visible = column >= mask.column_begin[half] && column < mask.column_end[half] &&
                           ((mask.token_ok >> column) & 1u) != 0;
      if (!visible) x = -INFINITY;
    }
    s[e] = x;
    block_max[half] = fmaxf(block_max[half], x);
  }
  bool rescale = false;
  float alpha[2];
  float base[2];
SLIMSERVE_ATTENTION_UNROLL
  for (int half = 0; half < 2; ++half) {
    float mx = block_max[half];
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    if constexpr (plain) mx *= scale.score_scale;
    const float new_max = fmaxf(state.row_max[half], mx);
    base[half] = new_max == -INFINITY ? 0.0f : new_max;         // all masked so far: p = 0
    alpha[half] = fast_exp2(state.row_max[half] - base[half]);  // 0 before the first token
    rescale = rescale || new_max != state.row_max[half];
    state.row_max[half] = new_max;
    state.row_sum[half] *= alpha[half];
  }
  if (__any_sync(0xffffffffu, rescale)) {
SLIMSERVE_ATTENTION_UNROLL
    for (int e = 0; e < OutputValues; ++e) state.o[e] *= alpha[(e / 2) % 2];
  }
  // P = exp2(s - max), summed in FP32, rounded to the mma type in A-fragment order.
  float pr[ScoreValues];
SLIMSERVE_ATTENTION_UNROLL
  for (int e = 0; e < ScoreValues; ++e) {
    const int half = (e / 2) % 2;
    pr[e] = plain ? fast_exp2(fmaf(s[e], scale.score_scale, -base[half])) : fast_exp2(s[e] - base[half]);
    state.row_sum[half] += pr[e];
  }
SLIMSERVE_ATTENTION_UNROLL
  for (int k = 0; k < ScoreValues / 8; ++k) {
SLIMSERVE_ATTENTION_UNROLL
    for (int r = 0; r < 4; ++r) p_frag[k][r] = pack_pair<MmaT>(pr[8 * k + 2 * r], pr[8 * k + 2 * r + 1]);
  }
}

/// The four compiled variants, picked once per tile; the masked ones build the tile's column
/// bounds from `rows` (the steady state, unmasked, never does). `token_ok`: bit c, token c of
/// the tile has a valid page id.
template <class MmaT, int ScoreValues, int OutputValues>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void prefill_tile_softmax(bool needs_mask, bool soft_capped,
                                                                 float (&s)[ScoreValues],
                                                                 PrefillRowState<OutputValues>& state,
                                                                 std::uint32_t (&p_frag)[ScoreValues / 8][4],
                                                                 const PrefillScoreScale& scale,
                                                                 const PrefillRowRange& rows, std::int64_t tile_begin,
                                                                 std::uint64_t token_ok, int t) {
  constexpr int stage_tokens = 2 * ScoreValues;  // m64nN: N / 2 accumulators per thread
  if (needs_mask) {
    const PrefillTileMask mask = rows.tile_mask<stage_tokens>(tile_begin, token_ok);
    if (soft_capped) {
      prefill_tile_softmax<MmaT, true, true>(s, state, p_frag, scale, mask, t);
    } else {
      prefill_tile_softmax<MmaT, true, false>(s, state, p_frag, scale, mask, t);
    }
  } else {
    const PrefillTileMask none{};
    if (soft_capped) {
      prefill_tile_softmax<MmaT, false, true>(s, state, p_frag, scale, none, t);
    } else {
      prefill_tile_softmax<MmaT, false, false>(s, state, p_frag, scale, none, t);  // the steady state
    }
  }
}

/// The first and one-past-last tile of a KV range [kv_begin, kv_end) (tiles of `Stage`
/// tokens from kv_begin) that every row of a row tile sees whole: before the range's end,
/// at or before the first row's causal end (`min_query`), at or after the last row's window
/// start (`max_query` - window_left); all pages valid. Outside it a tile takes the masked
/// softmax; the per-tile test is then two 32-bit compares.
template <int Stage>
struct PrefillPlainTiles {
  std::int32_t begin = 0;
  std::int32_t end = 0;

  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE PrefillPlainTiles(std::int64_t kv_begin, std::int64_t kv_end,
                                                          std::int64_t min_query, std::int64_t max_query,
                                                          bool causal, bool windowed, std::int32_t window_left,
                                                          bool all_pages_ok) {
    if (!all_pages_ok || kv_end <= kv_begin) return;
    std::int64_t last = (kv_end - kv_begin) / Stage;  // whole tiles before kv_end
    if (causal) {
      const std::int64_t seen = min_query + 1 - kv_begin;  // positions up to the first row's end
      const std::int64_t whole = seen > 0 ? seen / Stage : 0;
      if (whole < last) last = whole;
    }
    std::int64_t first = 0;
    if (windowed) {
      const std::int64_t before = max_query - window_left - kv_begin;  // positions before the last row's start
      first = before > 0 ? (before + Stage - 1) / Stage : 0;
    }
    if (first < last) {  // both in [0, tiles of the range] <= INT32_MAX / Stage + 1
      begin = static_cast<std::int32_t>(first);
      end = static_cast<std::int32_t>(last);
    }
  }

  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE bool masked(std::int32_t tile) const { return tile < begin || tile >= end; }
};

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
