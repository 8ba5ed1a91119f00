#pragma once
/// \file
/// \brief Fused quantize-and-append: new K/V tokens (BF16/FP16) into their page slots.
///
/// Grid: (num_tokens, ceil(num_kv_heads / heads_per_block)); each block handles one token and
/// `heads_per_block` heads, `head_dim / 8` threads per head, each thread 8 input elements
/// (one 16-byte load). A token whose destination is not provably inside its request's pages
/// (request index, position, page id, tag-check verdict) is skipped as a whole block: nothing
/// is written.

#include <cmath>
#include <cstdint>

#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

struct AppendParams {
  void* k_pages;  // [num_pages, page_size, H, D] or [num_pages, H, page_size, D]
  void* v_pages;
  const float* k_scale;  // per_tensor
  const float* v_scale;
  float* k_token_scales;  // per_token, pages' layout with D = 1
  float* v_token_scales;
  std::int32_t num_pages;
  std::int32_t page_size;
  std::int32_t num_kv_heads;
  KvLayout layout;
  KvScaleMode scale_mode;
  // Page table (CSR) and per-request verdicts (may be null: no check).
  const std::int32_t* indptr;         // [batch_size + 1]
  const std::int32_t* indices;        // [indptr[batch_size]]
  const std::int32_t* last_page_len;  // [batch_size]
  const kv::RequestStatus* status;    // [batch_size] or null
  std::int32_t batch_size;
  // New tokens.
  const void* k_new;  // [num_tokens, H, D]
  const void* v_new;  // [num_tokens, H, D]
  const std::int32_t* token_request;   // [num_tokens] (explicit destinations) or null
  const std::int32_t* token_position;  // [num_tokens] (explicit destinations) or null
  const std::int32_t* append_indptr;   // [batch_size + 1] (chunk mode: each request's last tokens)
  std::int32_t num_tokens;
};

/// Where token t goes: request and position, or request = -1 when it must be skipped.
struct TokenDestination {
  std::int32_t request = -1;
  std::int32_t page = -1;
  std::int32_t slot = 0;
};

SLIMSERVE_DEVICE inline TokenDestination find_destination(const AppendParams& p, std::int32_t t) {
  TokenDestination dest;
  std::int32_t b = -1;
  std::int64_t position = -1;
  std::int64_t length = 0;
  auto request_length = [&](std::int32_t r) -> std::int64_t {
    const std::int32_t pages = p.indptr[r + 1] - p.indptr[r];
    const std::int32_t last = p.last_page_len[r];
    if (pages <= 0 || last < 1 || last > p.page_size) return 0;  // device backstop
    return static_cast<std::int64_t>(pages - 1) * p.page_size + last;
  };
  if (p.token_request != nullptr) {
    b = p.token_request[t];
    if (b < 0 || b >= p.batch_size) return dest;
    position = p.token_position[t];
    length = request_length(b);
  } else {
    // Chunk mode: the request whose [append_indptr[b], append_indptr[b+1]) holds t.
    std::int32_t lo = 0, hi = p.batch_size;  // invariant: append_indptr[lo] <= t < append_indptr[hi]
    if (t < p.append_indptr[0] || t >= p.append_indptr[p.batch_size]) return dest;
    while (hi - lo > 1) {
      const std::int32_t mid = (lo + hi) / 2;
      if (p.append_indptr[mid] <= t) lo = mid; else hi = mid;
    }
    b = lo;
    length = request_length(b);
    const std::int32_t count = p.append_indptr[b + 1] - p.append_indptr[b];
    position = length - count + (t - p.append_indptr[b]);
  }
  if (p.status != nullptr && !kv::request_ok(p.status[b])) return dest;
  if (position < 0 || position >= length) return dest;
  const std::int32_t page_index = static_cast<std::int32_t>(position / p.page_size);
  const std::int32_t page = p.indices[p.indptr[b] + page_index];
  if (page < 0 || page >= p.num_pages) return dest;
  dest.request = b;
  dest.page = page;
  dest.slot = static_cast<std::int32_t>(position % p.page_size);
  return dest;
}

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

template <class KvT, class InT, int HeadDim>
__global__ void append_kernel(const AppendParams p) {
  constexpr int in_elements = vector_elements<InT>;  // 8
  constexpr int lanes = HeadDim / in_elements;       // threads per head vector
  static_assert(lanes <= 32 && (lanes & (lanes - 1)) == 0, "a head vector fits one warp");

  const std::int32_t t = static_cast<std::int32_t>(blockIdx.x);
  const TokenDestination dest = find_destination(p, t);
  if (dest.request < 0) return;  // whole block: no shuffle is left half-done

  const int heads_per_block = static_cast<int>(blockDim.x) / lanes;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  const std::int32_t head =
      static_cast<std::int32_t>(blockIdx.y) * heads_per_block + static_cast<int>(threadIdx.x) / lanes;
  const bool head_valid = head < p.num_kv_heads;

  // [num_tokens, H, D] inputs: 8 elements per thread.
  const std::int64_t in_offset = (static_cast<std::int64_t>(t) * p.num_kv_heads + head) * HeadDim +
                                 lane * in_elements;
  float k[in_elements];
  float v[in_elements];
  float k_amax = 0.0f, v_amax = 0.0f;
  {
    Vec16 kv = {}, vv = {};
    if (head_valid) {
      kv = load16(static_cast<const InT*>(p.k_new) + in_offset);
      vv = load16(static_cast<const InT*>(p.v_new) + in_offset);
    }
SLIMSERVE_ATTENTION_UNROLL
    for (int i = 0; i < in_elements; ++i) {
      k[i] = element_to_float<InT>(kv, i);
      v[i] = element_to_float<InT>(vv, i);
      k_amax = fmaxf(k_amax, fabsf(k[i]));
      v_amax = fmaxf(v_amax, fabsf(v[i]));
    }
  }

  float k_scale = 1.0f, v_scale = 1.0f;
  if (p.scale_mode == KvScaleMode::per_tensor) {
    k_scale = *p.k_scale;
    v_scale = *p.v_scale;
  } else if (p.scale_mode == KvScaleMode::per_token) {
    k_scale = per_token_scale<KvT>(group_max<lanes>(k_amax));
    v_scale = per_token_scale<KvT>(group_max<lanes>(v_amax));
  }
  if (!head_valid) return;  // after the shuffles

  if (p.scale_mode == KvScaleMode::per_token && lane == 0) {
    const std::int64_t s = cache_offset(p.layout, p.page_size, p.num_kv_heads, 1, dest.page,
                                        dest.slot, head, 0);
    p.k_token_scales[s] = k_scale;
    p.v_token_scales[s] = v_scale;
  }
  // Quantize (x / scale, RNE, saturating) a register word at a time: the formats' packed
  // conversions give the bits of the scalar from_float.
  const std::int64_t out = cache_offset(p.layout, p.page_size, p.num_kv_heads, HeadDim, dest.page,
                                        dest.slot, head, lane * in_elements);
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
    store8(static_cast<KvT*>(p.k_pages) + out, kq);
    store8(static_cast<KvT*>(p.v_pages) + out, vq);
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
    store16(static_cast<KvT*>(p.k_pages) + out, kq);
    store16(static_cast<KvT*>(p.v_pages) + out, vq);
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
