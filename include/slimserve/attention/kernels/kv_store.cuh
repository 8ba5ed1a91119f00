#pragma once
/// \file
/// \brief The page store: quantize one K and one V head vector and write them into their page
/// slot. The one device function both cache writers call (append_kv's kernel and the fused
/// prefill's chunk writer), so their bytes are equal by construction.
///
/// A head vector is held by a group of `HeadVectorLanes<HeadDim>::lanes` consecutive threads
/// of one warp, 8 input elements (one 16-byte load) per thread. The group is a power of two
/// (its amax for per-token scales is a butterfly of shuffles): head_dim / 8 lanes are active,
/// the rest of the group (head_dim 96: 12 of 16, 192: 24 of 32) load nothing, count 0 in the
/// amax and store nothing.

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "slimserve/attention/kernels/kv_rotate.cuh"
#include "slimserve/attention/kernels/kv_store_nvfp4.cuh"
#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// Threads per head vector in the cache writers: head_dim / 8 rounded up to a power of two
/// (host launch geometry and kernels alike).
SLIMSERVE_HOST_DEVICE constexpr int head_vector_lanes(int head_dim) {
  int lanes = 1;
  while (lanes < head_dim / 8) lanes *= 2;
  return lanes;
}

template <int HeadDim>
struct HeadVectorLanes {
  static constexpr int active = HeadDim / 8;  // 8 input elements (16 bytes) each
  static constexpr int lanes = head_vector_lanes(HeadDim);
  static_assert(HeadDim % 8 == 0, "whole 16-byte input vectors");
  static_assert(lanes <= 32, "a head vector fits one warp");
};

/// Max of |x| over the `Lanes` threads that hold one head vector (aligned groups of a warp).
template <int Lanes>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE float group_max(float x) {
SLIMSERVE_ATTENTION_UNROLL
  for (int offset = Lanes / 2; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

/// Clamps to ±max_finite, keeping NaN: a 16-bit cache saturates like an FP8 one instead of
/// storing ±inf, which would turn a whole attention row into NaN. (FP8 conversions saturate
/// by themselves.)
template <class KvT>
SLIMSERVE_HOST_DEVICE inline float saturate_finite(float x) {
  constexpr float max_finite = format_traits<KvT>::max_finite;
  if (x != x) return x;  // NaN stays NaN (fminf/fmaxf would drop it)
  return fminf(fmaxf(x, -max_finite), max_finite);
}

/// Scale that maps this head vector's amax onto the format's largest finite value.
template <class KvT>
SLIMSERVE_HOST_DEVICE inline float per_token_scale(float amax) {
  const float scale = amax / format_traits<KvT>::max_finite;
  return (scale > 0.0f && std::isfinite(scale)) ? scale : 1.0f;
}

/// Where the writers store: the cache's pages, scales and geometry.
struct PageStoreTarget {
  void* k_pages;  // [num_pages, page_size, H, D] or [num_pages, H, page_size, D]
  void* v_pages;
  float* k_token_scales;  // per_token, pages' layout with D = 1
  float* v_token_scales;
  const float* k_scale;  // per_tensor
  const float* v_scale;
  std::int32_t page_size;
  std::int32_t num_kv_heads;
  KvLayout layout;
  KvScaleMode scale_mode;
  std::int64_t page_stride;  // elements from one page of k_pages (and of v_pages) to the next; 0: packed
};

/// store_head_vectors of the 16-bit and FP8 formats: quantizes the K and V head vectors whose
/// inputs start at `k_row` / `v_row` (head_dim elements of InT each, 16-byte aligned) and
/// stores them at (page, slot, head): x / scale,
/// rounded to nearest even with saturation; per-token scales from the vector's amax.
/// Every thread of the lane group calls it (shuffles); `lane` is the thread's index in its
/// group; `store` false: the group reads and writes nothing (a skipped token or head).
/// `Rotation`: the vectors are rotated first (rotate_loaded_head_vectors).
template <class KvT, class InT, int HeadDim, KvRotation Rotation = KvRotation::none>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void store_scaled_head_vectors(const PageStoreTarget& target, const InT* k_row,
                                                                      const InT* v_row, int lane, bool store,
                                                                      std::int32_t page, std::int32_t slot,
                                                                      std::int32_t head) {
  using Lanes = HeadVectorLanes<HeadDim>;
  constexpr int in_elements = vector_elements<InT>;  // 8
  static_assert(in_elements == 8, "16-bit inputs");
  const bool active = store && lane < Lanes::active;
  float k[in_elements];
  float v[in_elements];
  float k_amax = 0.0f, v_amax = 0.0f;
  {
    Vec16 kv = {}, vv = {};
    if (active) {
      kv = load16(k_row + lane * in_elements);
      vv = load16(v_row + lane * in_elements);
    }
SLIMSERVE_ATTENTION_UNROLL
    for (int i = 0; i < in_elements; ++i) {
      k[i] = element_to_float<InT>(kv, i);
      v[i] = element_to_float<InT>(vv, i);
    }
    rotate_loaded_head_vectors<Rotation, HeadDim>(k, v);
SLIMSERVE_ATTENTION_UNROLL
    for (int i = 0; i < in_elements; ++i) {
      k_amax = fmaxf(k_amax, fabsf(k[i]));
      v_amax = fmaxf(v_amax, fabsf(v[i]));
    }
  }
  float k_scale = 1.0f, v_scale = 1.0f;
  if (target.scale_mode == KvScaleMode::per_tensor) {
    k_scale = *target.k_scale;
    v_scale = *target.v_scale;
  } else if (target.scale_mode == KvScaleMode::per_token) {
    k_scale = per_token_scale<KvT>(group_max<Lanes::lanes>(k_amax));
    v_scale = per_token_scale<KvT>(group_max<Lanes::lanes>(v_amax));
  }
  if (!active) return;  // after the shuffles

  if (target.scale_mode == KvScaleMode::per_token && lane == 0) {
    const std::int64_t s = cache_offset(target.layout, target.page_size, target.num_kv_heads, 1, page, slot, head, 0);
    target.k_token_scales[s] = k_scale;
    target.v_token_scales[s] = v_scale;
  }
  // Quantize a register word at a time: the formats' packed conversions give the bits of the
  // scalar from_float.
  // cache_offset is linear in the page: page 0's offset plus the page's start, so a combined
  // K/V allocation ([num_pages, 2, page], page_stride twice a page) is written in place.
  const std::int64_t page_elements = target.page_stride != 0
                                         ? target.page_stride
                                         : static_cast<std::int64_t>(target.page_size) * target.num_kv_heads * HeadDim;
  const std::int64_t out = page * page_elements + cache_offset(target.layout, target.page_size, target.num_kv_heads,
                                                               HeadDim, 0, slot, head, lane * in_elements);
  if constexpr (fp8_format<KvT>) {
    // 8 FP8 codes: one 8-byte store.
    Vec8 kq, vq;
SLIMSERVE_ATTENTION_UNROLL
    for (int w = 0; w < 2; ++w) {
      kq.word[w] = from_float4<KvT>(f32x4{k[4 * w] / k_scale, k[4 * w + 1] / k_scale,
                                          k[4 * w + 2] / k_scale, k[4 * w + 3] / k_scale});
      vq.word[w] = from_float4<KvT>(f32x4{v[4 * w] / v_scale, v[4 * w + 1] / v_scale,
                                          v[4 * w + 2] / v_scale, v[4 * w + 3] / v_scale});
    }
    store8(static_cast<KvT*>(target.k_pages) + out, kq);
    store8(static_cast<KvT*>(target.v_pages) + out, vq);
  } else {
    // 8 BF16/FP16 values: one 16-byte store.
    Vec16 kq, vq;
SLIMSERVE_ATTENTION_UNROLL
    for (int w = 0; w < 4; ++w) {
      kq.word[w] = from_float2<KvT>(f32x2{saturate_finite<KvT>(k[2 * w] / k_scale),
                                          saturate_finite<KvT>(k[2 * w + 1] / k_scale)});
      vq.word[w] = from_float2<KvT>(f32x2{saturate_finite<KvT>(v[2 * w] / v_scale),
                                          saturate_finite<KvT>(v[2 * w + 1] / v_scale)});
    }
    store16(static_cast<KvT*>(target.k_pages) + out, kq);
    store16(static_cast<KvT*>(target.v_pages) + out, vq);
  }
}

/// Quantizes the K and V head vectors whose inputs start at `k_row` / `v_row` (head_dim
/// elements of InT each, 16-byte aligned) and stores them at (page, slot, head); see
/// store_scaled_head_vectors (16-bit, FP8) and store_nvfp4_head_vectors (NVFP4). `Rotation`:
/// K (and V) are rotated in registers first (rotate_loaded_head_vectors; RotationHeadDims).
template <class KvT, class InT, int HeadDim, KvRotation Rotation = KvRotation::none>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void store_head_vectors(const PageStoreTarget& target, const InT* k_row,
                                                               const InT* v_row, int lane, bool store,
                                                               std::int32_t page, std::int32_t slot,
                                                               std::int32_t head) {
  using Lanes = HeadVectorLanes<HeadDim>;
  if constexpr (std::is_same_v<KvT, nvfp4>) {  // codes and block scales: kv_store_nvfp4.cuh
    store_nvfp4_head_vectors<InT, HeadDim, Lanes::active, Rotation>(target, k_row, v_row, lane, store, page, slot,
                                                                    head);
  } else {
    store_scaled_head_vectors<KvT, InT, HeadDim, Rotation>(target, k_row, v_row, lane, store, page, slot, head);
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
