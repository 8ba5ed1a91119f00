#pragma once
/// \file
/// \brief The MLA latent cache's writer and reader: fused quantize-and-append of (latent,
/// rope) and the BF16 gather of cached tokens for prefill.
///
/// Both use one 64-thread block per token: thread i owns latent values [8 i, 8 i + 8) (one
/// 16-byte input load), 16 threads per 128-value scale group; threads 0..7 also own the rope.
/// NVFP4: threads 2b and 2b + 1 hold 16-value block b (nvfp4_quantize_lane's lane pairs, in
/// one warp); thread i's 8 codes are the 32-bit word at record byte 4 i, block b's E4M3 scale
/// the byte at 256 + b (the latent is one NVFP4 head vector of 512, mla_cache_view.hpp).

#include <cmath>
#include <cstdint>
#include <cstring>

#include "slimserve/attention/kernels/append_kernel.cuh"
#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/attention/mla_cache_view.hpp"
#include "slimserve/formats/nvfp4.hpp"
#include "slimserve/formats/nvfp4_quantize.cuh"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

inline constexpr int mla_token_threads = mla_latent_dim / 8;  // 64
inline constexpr int mla_rope_threads = mla_rope_dim / 8;     // 8

struct MlaAppendParams {
  /// Destinations: append_kv's fields and rules (find_destination); its K/V pointers unused.
  AppendParams destination;
  unsigned char* pages;  // [num_pages, page_size, token_bytes]
  const float* latent_scale;
  std::int32_t token_bytes;
  std::int32_t scales_offset;
  std::int32_t rope_offset;
  MlaScaleMode scale_mode;
  const void* latent_new;  // latent_new[t * latent_stride + d]
  const void* rope_new;    // rope_new[t * rope_stride + d]
  std::int64_t latent_stride;
  std::int64_t rope_stride;
};

template <class KvT, class InT>
__global__ void __launch_bounds__(mla_token_threads) mla_append_kernel(const MlaAppendParams p) {
  constexpr int group_lanes = mla_scale_group / 8;  // 16 threads per scale group
  const std::int32_t t = static_cast<std::int32_t>(blockIdx.x);
  const TokenDestination dest = find_destination(p.destination, t);
  if (dest.request < 0) return;  // whole block: no shuffle is left half-done
  const int tid = static_cast<int>(threadIdx.x);

  float x[8];
  float amax = 0.0f;
  {
    const Vec16 in = load16(static_cast<const InT*>(p.latent_new) + t * p.latent_stride + 8 * tid);
SLIMSERVE_ATTENTION_UNROLL
    for (int i = 0; i < 8; ++i) {
      x[i] = element_to_float<InT>(in, i);
      amax = fmaxf(amax, fabsf(x[i]));
    }
  }
  float scale = 1.0f;
  if (p.scale_mode == MlaScaleMode::per_tensor) {
    scale = *p.latent_scale;
  } else if (p.scale_mode == MlaScaleMode::per_token_group) {
    if constexpr (!std::is_same_v<KvT, nvfp4>) scale = per_token_scale<KvT>(group_max<group_lanes>(amax));
  }
  unsigned char* record =
      p.pages + (static_cast<std::int64_t>(dest.page) * p.destination.page_size + dest.slot) * p.token_bytes;
  if constexpr (!std::is_same_v<KvT, nvfp4>) {  // NVFP4 is per_tensor only: its scales are the block bytes
    if (p.scale_mode == MlaScaleMode::per_token_group && tid % group_lanes == 0) {
      reinterpret_cast<float*>(record + p.scales_offset)[tid / group_lanes] = scale;
    }
  }
  if constexpr (std::is_same_v<KvT, nvfp4>) {
    // Every thread of the block reaches here (a whole block returns above): the pair shuffle
    // is complete. The tensor scale is the per_tensor float (validate_mla_cache_view).
    const Nvfp4LaneCodes codes = nvfp4_quantize_lane(x, scale);
    reinterpret_cast<std::uint32_t*>(record)[tid] = codes.codes;
    if (tid % 2 == 0) record[mla_latent_dim / 2 + tid / 2] = codes.scale.bits;
  } else if constexpr (fp8_format<KvT>) {
    Vec8 q;
SLIMSERVE_ATTENTION_UNROLL
    for (int w = 0; w < 2; ++w) {
      q.word[w] = from_float4<KvT>(f32x4{x[4 * w] / scale, x[4 * w + 1] / scale, x[4 * w + 2] / scale,
                                         x[4 * w + 3] / scale});
    }
    store8(reinterpret_cast<KvT*>(record) + 8 * tid, q);
  } else {
    Vec16 q;
SLIMSERVE_ATTENTION_UNROLL
    for (int w = 0; w < 4; ++w) {
      q.word[w] = from_float2<KvT>(f32x2{saturate_finite<KvT>(x[2 * w] / scale),
                                         saturate_finite<KvT>(x[2 * w + 1] / scale)});
    }
    store16(reinterpret_cast<KvT*>(record) + 8 * tid, q);
  }
  if (tid < mla_rope_threads) {
    const Vec16 in = load16(static_cast<const InT*>(p.rope_new) + t * p.rope_stride + 8 * tid);
    Vec16 r;
SLIMSERVE_ATTENTION_UNROLL
    for (int w = 0; w < 4; ++w) {
      r.word[w] = from_float2<bf16>(f32x2{saturate_finite<bf16>(element_to_float<InT>(in, 2 * w)),
                                          saturate_finite<bf16>(element_to_float<InT>(in, 2 * w + 1))});
    }
    store16(reinterpret_cast<bf16*>(record + p.rope_offset) + 8 * tid, r);
  }
}

struct MlaGatherParams {
  const unsigned char* pages;
  const float* latent_scale;
  std::int32_t num_pages;
  std::int32_t page_size;
  std::int32_t token_bytes;
  std::int32_t scales_offset;
  std::int32_t rope_offset;
  MlaScaleMode scale_mode;
  const std::int32_t* indptr;
  const std::int32_t* indices;
  const std::int32_t* last_page_len;
  const kv::RequestStatus* status;
  std::int32_t batch_size;
  const std::int32_t* token_indptr;  // [B + 1]
  bf16* out;                         // [rows, out_stride]
  std::int64_t out_stride;
};

template <class KvT>
__global__ void __launch_bounds__(mla_token_threads) mla_gather_kernel(const MlaGatherParams p) {
  const std::int32_t row = static_cast<std::int32_t>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  if (row < p.token_indptr[0] || row >= p.token_indptr[p.batch_size]) return;
  std::int32_t lo = 0, hi = p.batch_size;  // token_indptr[lo] <= row < token_indptr[hi]
  while (hi - lo > 1) {
    const std::int32_t mid = (lo + hi) / 2;
    if (p.token_indptr[mid] <= row) lo = mid; else hi = mid;
  }
  const std::int32_t b = lo;
  const std::int64_t position = row - p.token_indptr[b];
  std::int64_t length = -1;
  {
    const std::int32_t pages = p.indptr[b + 1] - p.indptr[b];
    const std::int32_t last = p.last_page_len[b];
    if (pages == 0) length = 0;
    if (pages > 0 && last >= 1 && last <= p.page_size) length = static_cast<std::int64_t>(pages - 1) * p.page_size + last;
  }
  std::int32_t page = -1;
  if ((p.status == nullptr || kv::request_ok(p.status[b])) && position < length) {
    page = p.indices[p.indptr[b] + static_cast<std::int32_t>(position / p.page_size)];
    if (page >= p.num_pages) page = -1;
  }
  bf16* out = p.out + row * p.out_stride;
  Vec16 latent_out;
  if (page < 0) {
    // Aborted request, a position past its length or a bad page id: a loud NaN row.
SLIMSERVE_ATTENTION_UNROLL
    for (int w = 0; w < 4; ++w) latent_out.word[w] = from_float2<bf16>(f32x2{NAN, NAN});
    store16(out + 8 * tid, latent_out);
    if (tid < mla_rope_threads) store16(out + mla_latent_dim + 8 * tid, latent_out);
    return;
  }
  const unsigned char* record =
      p.pages + (static_cast<std::int64_t>(page) * p.page_size + position % p.page_size) * p.token_bytes;
  float scale = 1.0f;
  if (p.scale_mode == MlaScaleMode::per_tensor) scale = *p.latent_scale;
  if (p.scale_mode == MlaScaleMode::per_token_group) {
    scale = reinterpret_cast<const float*>(record + p.scales_offset)[tid / (mla_scale_group / 8)];
  }
  if constexpr (std::is_same_v<KvT, nvfp4>) {
    // Exact e2m1 x e4m3, times the tensor scale (one FP32 rounding), then BF16. A tensor scale
    // that is not finite and > 0 gives NaN, as the decode does.
    scale = nvfp4_checked_tensor_scale(scale);
    const std::uint32_t codes = reinterpret_cast<const std::uint32_t*>(record)[tid];
    const fp8_e4m3 block_scale = fp8_e4m3::from_bits(record[mla_latent_dim / 2 + tid / 2]);
SLIMSERVE_ATTENTION_UNROLL
    for (int w = 0; w < 4; ++w) {
      latent_out.word[w] = from_float2<bf16>(f32x2{nvfp4_decode(nvfp4_code_at(codes, 2 * w), block_scale, scale),
                                                   nvfp4_decode(nvfp4_code_at(codes, 2 * w + 1), block_scale, scale)});
    }
  } else if constexpr (fp8_format<KvT>) {
    std::uint32_t words[2];
    std::memcpy(words, record + 8 * tid, sizeof(words));
SLIMSERVE_ATTENTION_UNROLL
    for (int w = 0; w < 2; ++w) {
      const f32x4 f = to_float4<KvT>(words[w]);
      latent_out.word[2 * w] = from_float2<bf16>(f32x2{f.x * scale, f.y * scale});
      latent_out.word[2 * w + 1] = from_float2<bf16>(f32x2{f.z * scale, f.w * scale});
    }
  } else {
    latent_out = load16(reinterpret_cast<const KvT*>(record) + 8 * tid);
  }
  store16(out + 8 * tid, latent_out);
  if (tid < mla_rope_threads) {
    store16(out + mla_latent_dim + 8 * tid, load16(reinterpret_cast<const bf16*>(record + p.rope_offset) + 8 * tid));
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
