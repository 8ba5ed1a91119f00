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
/// 16-bit caches compute in their own type; their tiles are the input bytes (cp.async).
///
/// Append. The writer produces exactly the bytes of `append_kv` in chunk form (append_indptr =
/// qo_indptr): the same division by the scale, the same rounding and saturation, the same
/// per-token scales; a token whose page id is outside the cache is skipped, as there.

#include <cstdint>
#include <type_traits>

#include "slimserve/attention/kernels/append_kernel.cuh"
#include "slimserve/attention/kernels/mma_fragments.cuh"
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

/// Stages 16-bit chunk `chunk` (8 elements of the mma type) of one input row into `dst` (FP8
/// caches: converted from the input type, permuted; `valid` false: zeros).
template <class InT, bool IsV>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void stage_fp8_order_chunk(unsigned char* dst, const InT* row,
                                                                   int chunk, bool valid) {
  Vec16 out = {};
  if (valid) {
    const InT* group = row + 16 * (chunk >> 1);
    float x[16];
    float lo[8], hi[8];
    unpack<InT>(load16(group), lo);
    unpack<InT>(load16(group + 8), hi);
SLIMSERVE_ATTENTION_UNROLL
    for (int e = 0; e < 8; ++e) {
      x[e] = lo[e];
      x[8 + e] = hi[e];
    }
    constexpr float limit = format_traits<fp16>::max_finite;  // as the queries: saturate
SLIMSERVE_ATTENTION_UNROLL
    for (int w = 0; w < 4; ++w) {
      const int j0 = 8 * (chunk & 1) + 2 * w;
      out.word[w] = pack_pair<fp16>(fminf(fmaxf(x[fp8_order_source<IsV>(j0)], -limit), limit),
                                    fminf(fmaxf(x[fp8_order_source<IsV>(j0 + 1)], -limit), limit));
    }
  }
  store16(dst, out);
}

/// Quantizes chunk tokens [token_begin, token_end) of one KV head into their slots, as
/// append_kv does. All `threads` threads call it (warp shuffles); head_dim / 8 lanes per token.
template <class KvT, class InT, int HeadDim>
SLIMSERVE_DEVICE void append_chunk_tokens(const ChunkKvParams& c, const std::int32_t* request_pages,
                                          std::int32_t num_pages, std::int32_t page_shift,
                                          std::int32_t num_kv_heads, KvLayout layout,
                                          KvScaleMode scale_mode, const float* k_scale_ptr,
                                          const float* v_scale_ptr, std::int32_t kv_head,
                                          std::int64_t qo_begin, std::int64_t chunk_start,
                                          std::int64_t token_begin, std::int64_t token_end, int tid,
                                          int threads) {
  constexpr int in_elements = vector_elements<InT>;  // 8
  constexpr int lanes = HeadDim / in_elements;
  static_assert(lanes <= 32 && (lanes & (lanes - 1)) == 0, "a head vector fits one warp");
  const int per_pass = threads / lanes;
  const int lane = tid % lanes;
  const std::int32_t page_size = 1 << page_shift;
  for (std::int64_t base = token_begin; base < token_end; base += per_pass) {
    const std::int64_t i = base + tid / lanes;  // chunk token
    const std::int64_t position = chunk_start + i;
    std::int32_t page = -1;
    if (i < token_end) page = request_pages[position >> page_shift];
    const bool ok = page >= 0 && page < num_pages;
    float k[in_elements], v[in_elements];
    float k_amax = 0.0f, v_amax = 0.0f;
    {
      Vec16 kv = {}, vv = {};
      if (ok) {
        const std::int64_t in = (qo_begin + i) * c.token_stride + kv_head * c.head_stride + lane * in_elements;
        kv = load16(static_cast<const InT*>(c.k) + in);
        vv = load16(static_cast<const InT*>(c.v) + in);
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int e = 0; e < in_elements; ++e) {
        k[e] = element_to_float<InT>(kv, e);
        v[e] = element_to_float<InT>(vv, e);
        k_amax = fmaxf(k_amax, fabsf(k[e]));
        v_amax = fmaxf(v_amax, fabsf(v[e]));
      }
    }
    float k_scale = 1.0f, v_scale = 1.0f;
    if (scale_mode == KvScaleMode::per_tensor) {
      k_scale = *k_scale_ptr;
      v_scale = *v_scale_ptr;
    } else if (scale_mode == KvScaleMode::per_token) {
      k_scale = per_token_scale<KvT>(group_max<lanes>(k_amax));
      v_scale = per_token_scale<KvT>(group_max<lanes>(v_amax));
    }
    if (!ok) continue;  // after the shuffles
    const auto slot = static_cast<std::int32_t>(position & (page_size - 1));
    if (scale_mode == KvScaleMode::per_token && lane == 0) {
      const std::int64_t s = cache_offset(layout, page_size, num_kv_heads, 1, page, slot, kv_head, 0);
      c.k_token_scales[s] = k_scale;
      c.v_token_scales[s] = v_scale;
    }
    const std::int64_t out = cache_offset(layout, page_size, num_kv_heads, HeadDim, page, slot, kv_head,
                                          lane * in_elements);
    if constexpr (fp8_format<KvT>) {
      Vec8 kq, vq;
SLIMSERVE_ATTENTION_UNROLL
      for (int w = 0; w < 2; ++w) {
        kq.word[w] = from_float4<KvT>(f32x4{k[4 * w] / k_scale, k[4 * w + 1] / k_scale,
                                            k[4 * w + 2] / k_scale, k[4 * w + 3] / k_scale});
        vq.word[w] = from_float4<KvT>(f32x4{v[4 * w] / v_scale, v[4 * w + 1] / v_scale,
                                            v[4 * w + 2] / v_scale, v[4 * w + 3] / v_scale});
      }
      store8(static_cast<KvT*>(c.k_pages) + out, kq);
      store8(static_cast<KvT*>(c.v_pages) + out, vq);
    } else {
      Vec16 kq, vq;
SLIMSERVE_ATTENTION_UNROLL
      for (int w = 0; w < 4; ++w) {
        kq.word[w] = from_float2<KvT>(f32x2{saturate_finite<KvT>(k[2 * w] / k_scale),
                                            saturate_finite<KvT>(k[2 * w + 1] / k_scale)});
        vq.word[w] = from_float2<KvT>(f32x2{saturate_finite<KvT>(v[2 * w] / v_scale),
                                            saturate_finite<KvT>(v[2 * w + 1] / v_scale)});
      }
      store16(static_cast<KvT*>(c.k_pages) + out, kq);
      store16(static_cast<KvT*>(c.v_pages) + out, vq);
    }
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
