#pragma once
/// \file
/// \brief The chunk's own K/V in fused (mixed-dtype) prefill: staged for attention straight
/// from the BF16/FP16 inputs, and quantized into the chunk's page slots in the same launch.
///
/// Attention. A prefill chunk's tokens attend to the chunk's K/V as given (q's dtype), never to
/// the codes just written for them. Their shared-memory tiles use the 16-bit row geometry of
/// the mma input type. On FP8 caches the accumulators follow the FP8 fragment order
/// (mma_fragments.cuh: a k step holds d in a permuted order, an output tile holds the even or
/// odd d of a 16-wide group), so the producer stores each 16-wide group of d permuted to match
/// and the 16-bit fragment code then lands every product where the FP8 code would:
///   K: staged position kappa holds d = 4 (kappa % 8 / 2) + 2 (kappa / 8) + kappa % 2;
///   V: staged position j holds d = 2 (j % 8) + j / 8.
/// NVFP4 caches do the same over 32-wide groups of d (nvfp4_fragments.cuh: a pair of k steps
/// holds a 32-wide group in `nvfp4_q_column` order, an output tile every fourth d of one):
///   K: staged position kappa holds d = 8 (kappa % 8 / 2) + 4 (kappa / 8 % 2) + 2 (kappa % 2) + kappa / 16;
///   V: staged position j holds d = 4 (j % 8) + j / 8.
/// The accumulator counts V in units of v_scale * 2^14 (nvfp4_fragment_unit), so a chunk V
/// enters as v * 2^-k (exact; 2^k <= v_scale * 2^14 < 2^(k+1)) and its P times the rest,
/// 2^k / (v_scale * 2^14) in (0.5, 1]: P keeps the precision of the page tiles' P, and only
/// |v| below ~v_scale (1/2688 of a calibrated amax) reaches fp16 subnormals (absolute error
/// <= v_scale * 2^-11); overflow needs |v| > 2^29 v_scale, far past what the pages can hold.
/// Their chunk tiles are the stage's code bytes read as 16-bit rows: a quarter of its tokens.
/// 16-bit caches compute in their own type; their tiles are the input bytes (cp.async).
///
/// Append. The writer produces exactly the bytes of `append_kv` in chunk form (append_indptr =
/// qo_indptr): the same division by the scale, the same rounding and saturation, the same
/// per-token scales (NVFP4: the same block amax, E4M3 block scales and codes, kv_store_nvfp4.cuh);
/// a token whose page id is outside the cache is skipped, as there.

#include <cstdint>
#include <type_traits>

#include "slimserve/arch/satfinite_pack.cuh"
#include "slimserve/attention/kernels/kv_store.cuh"
#include "slimserve/attention/kernels/mma_fragments.cuh"
#include "slimserve/attention/kernels/nvfp4_fragments.cuh"
#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// The chunk's K/V inputs and the writable cache (fused mode only; null pointers otherwise).
struct ChunkKvParams {
  const void* k;  // k[token * token_stride + kv_head * head_stride + d], q's dtype; token = q's
  const void* v;
  std::int64_t token_stride, head_stride;
  void* k_pages;  // the cache's pages and per-token scales, written for the chunk's slots
  void* v_pages;
  float* k_token_scales;
  float* v_token_scales;
};

/// Input d held by staged position `j` (0..15) of a 16-wide group for FP8 accumulator order.
template <bool IsV>
SLIMSERVE_HOST_DEVICE constexpr int fp8_order_source(int j) {
  return IsV ? 2 * (j & 7) + (j >> 3) : 4 * ((j & 7) >> 1) + 2 * (j >> 3) + (j & 1);
}

/// Input d held by staged position `j` (0..31) of a 32-wide group for NVFP4 accumulator order:
/// K position 16 (s % 2) + q_fragment_column<false>(t, e) of k step s meets the query element
/// nvfp4_q_column(s, t, e); V position 8 (n % 4) + 2 t + i % 2 of output tile n lands where the
/// epilogue reads nvfp4_output_column(n, t, i).
template <bool IsV>
SLIMSERVE_HOST_DEVICE constexpr int nvfp4_order_source(int j) {
  return IsV ? 4 * (j & 7) + (j >> 3) : 8 * ((j & 7) >> 1) + 4 * ((j >> 3) & 1) + 2 * (j & 1) + (j >> 4);
}

/// Stages one 16-wide group of d of an input row (16 elements from `group`) as the two 16-bit
/// chunks of the mma type that hold it, permuted to FP8 accumulator order, into `dst_lo`
/// (positions 0..7) and `dst_hi` (8..15); `valid` false: zeros. A whole group per call keeps
/// every permutation index a compile-time constant (a chunk alone would pick its half at run
/// time and index the group through local memory) and converts each input element once.
template <class InT, bool IsV>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void stage_fp8_order_group(unsigned char* dst_lo, unsigned char* dst_hi,
                                                                   const InT* group, bool valid) {
  Vec16 out[2] = {};
  if (valid) {
    float x[16];
    float lo[8], hi[8];
    unpack<InT>(load16(group), lo);
    unpack<InT>(load16(group + 8), hi);
SLIMSERVE_ATTENTION_UNROLL
    for (int e = 0; e < 8; ++e) {
      x[e] = lo[e];
      x[8 + e] = hi[e];
    }
    // as the queries: saturated to the fp16 range, NaN kept (one cvt.rn.satfinite per pair)
SLIMSERVE_ATTENTION_UNROLL
    for (int half = 0; half < 2; ++half) {
SLIMSERVE_ATTENTION_UNROLL
      for (int w = 0; w < 4; ++w) {
        const int j0 = 8 * half + 2 * w;
        out[half].word[w] = arch::pack_satfinite<fp16>(x[fp8_order_source<IsV>(j0)], x[fp8_order_source<IsV>(j0 + 1)]);
      }
    }
  }
  store16(dst_lo, out[0]);
  store16(dst_hi, out[1]);
}

/// nvfp4_order_source against the fragment maps it must match (a k step pair; four output tiles).
constexpr bool nvfp4_order_matches_fragments() {
  for (int t = 0; t < 4; ++t) {
    for (int e = 0; e < 4; ++e) {
      for (int s = 0; s < 2; ++s) {
        if (nvfp4_order_source<false>(16 * s + q_fragment_column<false>(t, e)) != nvfp4_q_column(s, t, e)) return false;
      }
      for (int n = 0; n < 4; ++n) {
        if (nvfp4_order_source<true>(output_column<false>(n, t, e)) != nvfp4_output_column(n, t, e)) return false;
      }
    }
  }
  return true;
}
static_assert(nvfp4_order_matches_fragments(), "NVFP4 chunk staging order");

/// Stages one 32-wide group of d of an input row (32 elements from `group`) as the four fp16
/// chunks that hold it, permuted to NVFP4 accumulator order, into dst[0..3] (positions 8c..8c+7
/// in dst[c]), each times `scale` (a power of two: exact unless it leaves the fp16 normal
/// range); `valid` false: zeros. Saturated to the fp16 range, as the queries.
template <class InT, bool IsV>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void stage_nvfp4_order_group(unsigned char* const (&dst)[4], const InT* group,
                                                                     bool valid, float scale) {
  Vec16 out[4] = {};
  if (valid) {
    float x[32];
SLIMSERVE_ATTENTION_UNROLL
    for (int c = 0; c < 4; ++c) {
      float part[8];
      unpack<InT>(load16(group + 8 * c), part);
SLIMSERVE_ATTENTION_UNROLL
      for (int e = 0; e < 8; ++e) x[8 * c + e] = part[e] * scale;
    }
SLIMSERVE_ATTENTION_UNROLL
    for (int c = 0; c < 4; ++c) {
SLIMSERVE_ATTENTION_UNROLL
      for (int w = 0; w < 4; ++w) {
        const int j0 = 8 * c + 2 * w;
        out[c].word[w] = arch::pack_satfinite<fp16>(x[nvfp4_order_source<IsV>(j0)], x[nvfp4_order_source<IsV>(j0 + 1)]);
      }
    }
  }
SLIMSERVE_ATTENTION_UNROLL
  for (int c = 0; c < 4; ++c) store16(dst[c], out[c]);
}

/// Quantizes chunk tokens [token_begin, token_end) of one KV head into their slots with
/// append_kv's page store (kv_store.cuh). All `threads` threads call it (warp shuffles);
/// head_vector_lanes(head_dim) threads per token.
template <class KvT, class InT, int HeadDim>
SLIMSERVE_DEVICE void append_chunk_tokens(const ChunkKvParams& c, const PageStoreTarget& target,
                                          const std::int32_t* request_pages, std::int32_t num_pages,
                                          std::int32_t page_shift, std::int32_t kv_head, std::int64_t qo_begin,
                                          std::int64_t chunk_start, std::int64_t token_begin,
                                          std::int64_t token_end, int tid, int threads) {
  constexpr int lanes = HeadVectorLanes<HeadDim>::lanes;
  const int per_pass = threads / lanes;
  const int lane = tid % lanes;
  const std::int32_t slot_mask = (1 << page_shift) - 1;
  for (std::int64_t base = token_begin; base < token_end; base += per_pass) {
    const std::int64_t i = base + tid / lanes;  // chunk token
    const std::int64_t position = chunk_start + i;
    std::int32_t page = -1;
    if (i < token_end) page = request_pages[position >> page_shift];
    const bool ok = page >= 0 && page < num_pages;
    const std::int64_t row = ok ? (qo_begin + i) * c.token_stride + kv_head * c.head_stride : 0;
    store_head_vectors<KvT, InT, HeadDim>(target, static_cast<const InT*>(c.k) + row,
                                          static_cast<const InT*>(c.v) + row, lane, ok, page,
                                          static_cast<std::int32_t>(position & slot_mask), kv_head);
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
