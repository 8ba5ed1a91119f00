#pragma once
/// \file
/// \brief A non-owning view of a paged K/V cache: geometry, element type, layout and scales.
///
/// Pages hold `page_size` tokens of every KV head. K and V are two arrays of the same shape, in
/// one of two layouts:
///   NHD: [num_pages, page_size, num_kv_heads, head_dim]  (a token's heads are contiguous)
///   HND: [num_pages, num_kv_heads, page_size, head_dim]  (a head's tokens are contiguous)
/// Pages are `page_stride` storage elements apart (0: packed, packed_page_elements: page_size *
/// num_kv_heads * head_dim for the byte-sized formats; for NVFP4, whose page arrays are bytes,
/// page_size * num_kv_heads * head_vector_bytes), so K and V may also share one allocation with
/// their pages interleaved, [num_pages, 2, page]: v_pages = k_pages + one page, page_stride =
/// twice that (vLLM's blocks, NVFP4 included). Paged
/// attention reads and append_kv writes any page_stride; the other kernels (CUDA-core decode,
/// dequantize, page moves) take packed pages only and refuse others (require_packed_pages).
/// Scale convention (every path, K and V alike): stored = quantize(real / scale) with
/// saturating round-to-nearest-even, real = stored * scale.
///   - KvScaleMode::none: scale 1 (16-bit caches only; FP8 must say where its scale is).
///   - KvScaleMode::per_tensor: one calibrated float each for K and V, as device pointers so a
///     captured CUDA graph reads the current value at replay.
///   - KvScaleMode::per_token: one float per (token, head) for K and one for V, written by the
///     append kernel from that token's amax; stored beside the pages in arrays shaped like the
///     pages with head_dim = 1. Costs 8 bytes per token per KV head (K + V). FP8 caches only.
/// Plain C++: usable by host code that never includes a CUDA header.

#include <cmath>
#include <cstdint>
#include <string_view>

#include "slimserve/activation_dtype.hpp"
#include "slimserve/config.hpp"
#include "slimserve/kv/cache_head_dims.hpp"
#include "slimserve/kv/kv_format.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

/// Element type of the cached K/V pages: KvDtype, with its traits, in kv_format.hpp.
/// Element type of activations: queries, outputs, and new K/V handed to the append kernel
/// (the library-wide enum; this alias keeps the component's historical name).
using ActivationDtype = slimserve::ActivationDtype;
using slimserve::is_valid;
using slimserve::to_string;
enum class KvLayout : std::uint8_t { nhd, hnd };
enum class KvScaleMode : std::uint8_t { none, per_tensor, per_token };

/// Range checks for values that cross a boundary as integers (C ABI, Python, casts).
constexpr bool is_valid(KvLayout layout) noexcept {
  return layout == KvLayout::nhd || layout == KvLayout::hnd;
}
constexpr bool is_valid(KvScaleMode mode) noexcept {
  return static_cast<std::uint8_t>(mode) <= static_cast<std::uint8_t>(KvScaleMode::per_token);
}

constexpr std::string_view to_string(KvLayout layout) noexcept {
  return layout == KvLayout::nhd ? "NHD" : "HND";
}
constexpr std::string_view to_string(KvScaleMode mode) noexcept {
  switch (mode) {
    case KvScaleMode::none: return "none";
    case KvScaleMode::per_tensor: return "per_tensor";
    case KvScaleMode::per_token: return "per_token";
  }
  return "unknown";
}

/// What the kernels support; anything else is rejected by preflight.
constexpr bool supported_page_size(int page_size) noexcept {
  return page_size == 16 || page_size == 32 || page_size == 64 || page_size == 128;
}
/// The refusal of any other page size, with the reason and the nearest supported size. A page
/// is addressed as a power-of-two tile of at least 16 tokens (one MMA tile of keys, positions
/// split into page and slot by a shift and a mask); a token-granular pool (SGLang's
/// token_to_kv_pool, page_size 1) maps onto page_size 16 (slot s: page s / 16, offset s % 16).
inline Status unsupported_page_size(std::string_view what, int page_size) {
  int nearest = 16;
  for (const int size : {32, 64, 128}) {
    if (std::abs(size - page_size) < std::abs(nearest - page_size)) nearest = size;
  }
  return make_status(StatusCode::unsupported, what, "page_size ", page_size,
                     " is not supported: the kernels take 16, 32, 64 or 128 (a page is a power-of-two tile of "
                     "at least one 16-token MMA tile); nearest supported: ", nearest);
}
/// head_dims of a paged cache (and of paged attention): the typed list in head_dims.hpp.
constexpr bool supported_head_dim(int head_dim) noexcept { return PagedHeadDims::contains(head_dim); }

struct PagedKVCacheView {
  void* k_pages = nullptr;  ///< [num_pages, page_size, H, D] (NHD) or [num_pages, H, page_size, D]
  void* v_pages = nullptr;  ///< same shape as k_pages
  const float* k_scale = nullptr;  ///< per_tensor: one device float
  const float* v_scale = nullptr;  ///< per_tensor: one device float
  float* k_token_scales = nullptr;  ///< per_token: [num_pages, page_size, H] or [num_pages, H, page_size]
  float* v_token_scales = nullptr;  ///< per_token: same shape as k_token_scales
  std::int32_t num_pages = 0;
  std::int32_t page_size = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  KvDtype dtype = KvDtype::bf16;
  KvLayout layout = KvLayout::nhd;
  KvScaleMode scale_mode = KvScaleMode::none;
  /// Storage elements (storage_bytes each: the element, or a byte for NVFP4) from one page to
  /// the next in k_pages and in v_pages; 0 = packed. Per-token scale arrays stay packed.
  std::int64_t page_stride = 0;
};

/// Storage elements of one packed page: page_size * num_kv_heads * head_dim for the
/// byte-sized formats; page_size * num_kv_heads * head_vector_bytes bytes for NVFP4.
constexpr std::int64_t packed_page_elements(const PagedKVCacheView& cache) {
  return static_cast<std::int64_t>(cache.page_size) * cache.num_kv_heads *
         (head_vector_bytes(cache.dtype, cache.head_dim) / storage_bytes(cache.dtype));
}
/// Bytes from one page to the next in k_pages and v_pages (the packed page's bytes when
/// page_stride is 0).
constexpr std::int64_t page_stride_bytes(const PagedKVCacheView& cache) {
  return (cache.page_stride != 0 ? cache.page_stride : packed_page_elements(cache)) * storage_bytes(cache.dtype);
}

/// Bytes to allocate for each of k_pages and v_pages of a packed cache:
/// num_pages * page_size * num_kv_heads * head_vector_bytes(dtype, head_dim) (the MLA view's
/// counterpart is MlaCacheView::bytes()). A combined K/V allocation read through page_stride
/// holds both: 2 * packed_pages_bytes(cache).
constexpr std::int64_t packed_pages_bytes(const PagedKVCacheView& cache) {
  return static_cast<std::int64_t>(cache.num_pages) * cache.page_size * cache.num_kv_heads *
         head_vector_bytes(cache.dtype, cache.head_dim);
}

/// Floats in each of k_token_scales and v_token_scales: num_pages * page_size * num_kv_heads
/// for a per_token cache, 0 for the other scale modes (per_tensor reads one float each).
constexpr std::int64_t token_scale_count(const PagedKVCacheView& cache) {
  return cache.scale_mode == KvScaleMode::per_token
             ? static_cast<std::int64_t>(cache.num_pages) * cache.page_size * cache.num_kv_heads
             : 0;
}

/// For the kernels whose offsets assume packed pages (cache_offset): refuses a view with
/// another page_stride, naming the kernel.
inline Status require_packed_pages(const PagedKVCacheView& cache, std::string_view kernel) {
  if (cache.page_stride != 0 && cache.page_stride != packed_page_elements(cache)) {
    return make_status(StatusCode::unsupported, kernel, " takes packed pages (page_stride 0 or ",
                       packed_page_elements(cache), " elements), got page_stride ", cache.page_stride,
                       "; only paged attention and append_kv take interleaved or strided K/V pages");
  }
  return {};
}

/// Index of element `d` of (page, slot, head) in the page array; pass head_dim = 1 for the
/// per-token scale arrays, which share the layout.
SLIMSERVE_HOST_DEVICE constexpr std::int64_t cache_offset(KvLayout layout, std::int32_t page_size,
                                                          std::int32_t num_kv_heads,
                                                          std::int32_t head_dim, std::int32_t page,
                                                          std::int32_t slot, std::int32_t head,
                                                          std::int32_t d) {
  const std::int64_t token_major =
      layout == KvLayout::nhd
          ? (static_cast<std::int64_t>(page) * page_size + slot) * num_kv_heads + head
          : (static_cast<std::int64_t>(page) * num_kv_heads + head) * page_size + slot;
  return token_major * head_dim + d;
}

/// Bytes of K + V (+ scales) one token occupies in the cache.
constexpr std::int64_t cache_bytes_per_token(KvDtype dtype, KvScaleMode mode,
                                             std::int32_t num_kv_heads, std::int32_t head_dim) {
  const std::int64_t data = 2LL * num_kv_heads * head_vector_bytes(dtype, head_dim);
  const std::int64_t scales =
      mode == KvScaleMode::per_token ? 2LL * num_kv_heads * static_cast<std::int64_t>(sizeof(float)) : 0;
  return data + scales;
}

/// Tokens of one layer that fit in 1 GiB (pages are allocated whole; the per-tensor scales'
/// 8 bytes are ignored).
constexpr std::int64_t tokens_per_gib(KvDtype dtype, KvScaleMode mode, std::int32_t num_kv_heads,
                                      std::int32_t head_dim, std::int32_t page_size) {
  const std::int64_t page_bytes = cache_bytes_per_token(dtype, mode, num_kv_heads, head_dim) * page_size;
  return (std::int64_t{1} << 30) / page_bytes * page_size;
}

/// Host check of a calibrated scale before the caller uploads it: finite and > 0.
inline Status validate_static_scale(float scale, std::string_view what) {
  if (!std::isfinite(scale) || !(scale > 0.0f)) {
    return make_status(StatusCode::invalid_argument, what,
                       " must be finite and > 0 (stored = quantize(real / scale)), got ", scale);
  }
  return {};
}
inline Status validate_static_scales(float k_scale, float v_scale) {
  SLIMSERVE_RETURN_IF_ERROR(validate_static_scale(k_scale, "k_scale"));
  return validate_static_scale(v_scale, "v_scale");
}

/// A kernel family's preflight of the cache's format: refuses (unsupported) a format whose
/// trait does not list the family, naming the format and the formats the family takes.
/// `dtype` must be valid (validate_cache_view first).
Status require_kernel(KvDtype dtype, KvKernel kernel);

/// Shape, type, enum-range and pointer checks of a view (the page contents are not read).
Status validate_cache_view(const PagedKVCacheView& cache);
/// The preflight name every component uses (same as validate_cache_view).
inline Status can_implement(const PagedKVCacheView& cache) { return validate_cache_view(cache); }

}  // namespace attention
SLIMSERVE_NAMESPACE_END
