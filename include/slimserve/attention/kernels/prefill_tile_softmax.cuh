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

/// What decides which scores of a tile a thread's two rows may see (the masked variant only).
struct PrefillTileMask {
  std::int64_t tile_begin;         // position of the tile's first token
  std::int64_t kv_end;             // first position past the visible range
  std::uint64_t token_ok;          // bit c: token c of the tile has a valid page id
  std::int64_t query_position[2];  // of the thread's rows (row half 0, 1); -1: padding row
  bool row_valid[2];
  bool causal;
  bool windowed;
  std::int32_t window_left;
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
      const std::int64_t position = mask.tile_begin + column;
      bool visible = mask.row_valid[half] && position < mask.kv_end && ((mask.token_ok >> column) & 1u) != 0;
      if (mask.causal) visible = visible && position <= mask.query_position[half];
      if (mask.windowed) visible = visible && position >= mask.query_position[half] - mask.window_left;
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

/// The four compiled variants, picked once per tile.
template <class MmaT, int ScoreValues, int OutputValues>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void prefill_tile_softmax(bool needs_mask, bool soft_capped,
                                                                 float (&s)[ScoreValues],
                                                                 PrefillRowState<OutputValues>& state,
                                                                 std::uint32_t (&p_frag)[ScoreValues / 8][4],
                                                                 const PrefillScoreScale& scale,
                                                                 const PrefillTileMask& mask, int t) {
  if (needs_mask) {
    if (soft_capped) {
      prefill_tile_softmax<MmaT, true, true>(s, state, p_frag, scale, mask, t);
    } else {
      prefill_tile_softmax<MmaT, true, false>(s, state, p_frag, scale, mask, t);
    }
  } else {
    if (soft_capped) {
      prefill_tile_softmax<MmaT, false, true>(s, state, p_frag, scale, mask, t);
    } else {
      prefill_tile_softmax<MmaT, false, false>(s, state, p_frag, scale, mask, t);  // the steady state
    }
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
