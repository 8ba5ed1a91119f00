#pragma once
/// \file
/// \brief Pages -> BF16: the real values (stored * scale) of listed pages, for engines and tests.
///
/// Grid: (num_listed_pages, 2) (y: 0 = K, 1 = V); block: any size, each thread converting one
/// 16-byte vector of the stored type at a time. Output is NHD-ordered whatever the cache layout:
/// [num_listed_pages, page_size, H_kv, D]. A page id outside the cache yields a NaN-filled page.

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/formats/nvfp4.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

struct DequantizeParams {
  const void* k_pages;
  const void* v_pages;
  const float* k_scale;
  const float* v_scale;
  const float* k_token_scales;
  const float* v_token_scales;
  std::int32_t num_pages;
  std::int32_t page_size;
  std::int32_t num_kv_heads;
  KvLayout layout;
  KvScaleMode scale_mode;
  const std::int32_t* page_ids;  // [num_listed]
  bf16* k_out;                   // [num_listed, page_size, H_kv, D]
  bf16* v_out;
};

template <class KvT, int HeadDim>
  requires(!std::is_same_v<KvT, nvfp4>)
__global__ void dequantize_pages_kernel(const DequantizeParams p) {
  constexpr int E = vector_elements<KvT>;
  const bool is_v = blockIdx.y == 1;
  const KvT* pages = static_cast<const KvT*>(is_v ? p.v_pages : p.k_pages);
  const float* token_scales = is_v ? p.v_token_scales : p.k_token_scales;
  bf16* out = is_v ? p.v_out : p.k_out;
  const std::int64_t listed = blockIdx.x;
  const std::int32_t page = p.page_ids[listed];
  const bool page_valid = page >= 0 && page < p.num_pages;
  const float tensor_scale =
      p.scale_mode == KvScaleMode::per_tensor ? *(is_v ? p.v_scale : p.k_scale) : 1.0f;

  const std::int32_t vectors = p.page_size * p.num_kv_heads * (HeadDim / E);
  for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < vectors;
       i += static_cast<std::int32_t>(blockDim.x)) {
    // i enumerates (slot, head, vector) in NHD order.
    const std::int32_t vec = i % (HeadDim / E);
    const std::int32_t head = (i / (HeadDim / E)) % p.num_kv_heads;
    const std::int32_t slot = i / (HeadDim / E) / p.num_kv_heads;
    bf16* dst = out + (listed * p.page_size * p.num_kv_heads + static_cast<std::int64_t>(slot) * p.num_kv_heads + head) * HeadDim + vec * E;
    if (!page_valid) {
      for (int e = 0; e < E; ++e) dst[e] = from_float<bf16>(NAN);
      continue;
    }
    float scale = tensor_scale;
    if (p.scale_mode == KvScaleMode::per_token) {
      scale = token_scales[cache_offset(p.layout, p.page_size, p.num_kv_heads, 1, page, slot, head, 0)];
    }
    const Vec16 raw = load16(pages + cache_offset(p.layout, p.page_size, p.num_kv_heads, HeadDim,
                                                  page, slot, head, vec * E));
    for (int e = 0; e < E; ++e) dst[e] = from_float<bf16>(element_to_float<KvT>(raw, e) * scale);
  }
}

/// The same for NVFP4 pages (formats/nvfp4.hpp): each thread one 16-element block, real =
/// e2m1 * e4m3 block scale * tensor scale (one FP32 rounding, then BF16's). Bytes are read one
/// at a time: a head vector is 9 * HeadDim / 16 bytes, so its blocks are not 8-byte aligned
/// at every head_dim (a path for engines and tests, not for speed).
template <class KvT, int HeadDim>
  requires std::is_same_v<KvT, nvfp4>
__global__ void dequantize_pages_kernel(const DequantizeParams p) {
  constexpr int blocks = HeadDim / nvfp4_block_elements;
  constexpr std::int64_t vector_bytes = HeadDim / 2 + blocks;
  const bool is_v = blockIdx.y == 1;
  const auto* pages = static_cast<const std::uint8_t*>(is_v ? p.v_pages : p.k_pages);
  bf16* out = is_v ? p.v_out : p.k_out;
  const std::int64_t listed = blockIdx.x;
  const std::int32_t page = p.page_ids[listed];
  const bool page_valid = page >= 0 && page < p.num_pages;
  // An NVFP4 view is per_tensor; a scale outside the format's domain gives NaN, as every reader.
  const float tensor_scale = nvfp4_checked_tensor_scale(*(is_v ? p.v_scale : p.k_scale));

  const std::int32_t count = p.page_size * p.num_kv_heads * blocks;
  for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < count; i += static_cast<std::int32_t>(blockDim.x)) {
    // i enumerates (slot, head, block) in NHD order.
    const std::int32_t block = i % blocks;
    const std::int32_t head = (i / blocks) % p.num_kv_heads;
    const std::int32_t slot = i / blocks / p.num_kv_heads;
    bf16* dst = out + (listed * p.page_size * p.num_kv_heads + static_cast<std::int64_t>(slot) * p.num_kv_heads + head) * HeadDim +
                block * nvfp4_block_elements;
    if (!page_valid) {
      for (int e = 0; e < nvfp4_block_elements; ++e) dst[e] = from_float<bf16>(NAN);
      continue;
    }
    const std::uint8_t* vector =
        pages + cache_offset(p.layout, p.page_size, p.num_kv_heads, 1, page, slot, head, 0) * vector_bytes;
    const fp8_e4m3 scale = fp8_e4m3::from_bits(vector[HeadDim / 2 + block]);
    for (int e = 0; e < nvfp4_block_elements; e += 2) {
      const std::uint8_t pair = vector[block * nvfp4_block_code_bytes + e / 2];
      dst[e] = from_float<bf16>(nvfp4_decode(fp4_e2m1::from_bits(pair), scale, tensor_scale));
      dst[e + 1] = from_float<bf16>(nvfp4_decode(fp4_e2m1::from_bits(static_cast<std::uint8_t>(pair >> 4)), scale, tensor_scale));
    }
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
