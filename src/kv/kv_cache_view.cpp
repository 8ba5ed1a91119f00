#include "slimserve/kv/kv_cache_view.hpp"

#include <cstdint>
#include <limits>
#include <string>

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

Status require_kernel(KvDtype dtype, KvKernel kernel) {
  if (has_kernel(dtype, kernel)) return {};
  std::string takes;
  for (const KvFormatInfo& f : kv_formats) {
    if ((f.kernels & static_cast<KvKernelSet>(kernel)) == 0) continue;
    takes += takes.empty() ? "" : ", ";
    takes += f.name;
  }
  return make_status(StatusCode::unsupported, to_string(kernel), " does not take ", to_string(dtype),
                     " KV pages yet (it takes ", takes, ")");
}

Status validate_cache_view(const PagedKVCacheView& cache) {
  // Enum values that arrive as integers (C ABI, Python, casts) are checked before any use.
  if (!is_valid(cache.dtype)) {
    return make_status(StatusCode::invalid_argument, "unknown KV dtype ",
                       static_cast<int>(cache.dtype), " (one of ", kv_format_names(), ")");
  }
  if (!is_valid(cache.layout)) {
    return make_status(StatusCode::invalid_argument, "unknown KV layout ",
                       static_cast<int>(cache.layout));
  }
  if (!is_valid(cache.scale_mode)) {
    return make_status(StatusCode::invalid_argument, "unknown scale mode ",
                       static_cast<int>(cache.scale_mode));
  }
  if (!supported_page_size(cache.page_size)) {
    return unsupported_page_size("", cache.page_size);
  }
  if (!supported_head_dim(cache.head_dim)) {
    return make_status(StatusCode::unsupported, "head_dim ", cache.head_dim,
                       " is not supported (", PagedHeadDims::describe(), ")");
  }
  if (cache.num_kv_heads <= 0 || cache.num_pages <= 0) {
    return make_status(StatusCode::invalid_argument, "cache needs num_kv_heads > 0 and num_pages > 0, got ",
                       cache.num_kv_heads, " and ", cache.num_pages);
  }
  // Page offsets are int64 in the kernels; the element count of one head's slice must fit int32.
  const std::int64_t page_elements =
      static_cast<std::int64_t>(cache.page_size) * cache.num_kv_heads * cache.head_dim;
  if (page_elements > std::numeric_limits<std::int32_t>::max()) {
    return make_status(StatusCode::invalid_argument, "a page of ", page_elements,
                       " elements is too large");
  }
  // The page movers and the writers move head vectors in 4-byte words (NVFP4 at head_dim 96
  // would be 54 bytes).
  if (head_vector_bytes(cache.dtype, cache.head_dim) % 4 != 0) {
    return make_status(StatusCode::unsupported, "an ", to_string(cache.dtype), " head vector of head_dim ",
                       cache.head_dim, " is ", head_vector_bytes(cache.dtype, cache.head_dim),
                       " bytes, not whole 4-byte words (", to_string(cache.dtype), " takes head_dim 64, 128, 192, 256)");
  }
  // Page strides count storage elements (bytes for NVFP4, whose head vectors carry their
  // block scales): at least one packed page, and whole 16-byte steps so that every page starts
  // as aligned as the first.
  if (cache.page_stride != 0 && (cache.page_stride < packed_page_elements(cache) ||
                                 cache.page_stride * storage_bytes(cache.dtype) % 16 != 0)) {
    return make_status(StatusCode::invalid_argument, "page_stride ", cache.page_stride,
                       " must be 0 (packed) or at least one page (", packed_page_elements(cache), " ",
                       storage_bytes(cache.dtype) == 1 ? "bytes" : "elements", ") and a multiple of 16 bytes");
  }
  if (cache.k_pages == nullptr || cache.v_pages == nullptr) {
    return make_status(StatusCode::invalid_argument, "k_pages and v_pages must be non-null");
  }
  switch (cache.scale_mode) {
    case KvScaleMode::none:
      if (requires_scale(cache.dtype)) {
        return make_status(StatusCode::invalid_argument, "an ", to_string(cache.dtype), " cache needs scales (",
                           allows_per_token_scales(cache.dtype) ? "per_tensor or per_token"
                                                                : "per_tensor: its FP32 tensor scale",
                           "); a silent 1.0 is refused");
      }
      break;
    case KvScaleMode::per_tensor:
      if (cache.k_scale == nullptr || cache.v_scale == nullptr) {
        return make_status(StatusCode::invalid_argument,
                           "per_tensor scales need non-null device pointers k_scale and v_scale");
      }
      break;
    case KvScaleMode::per_token:
      // Per-token scales map each vector's amax onto the format's largest value; for a 16-bit
      // cache that is ~3e38 (BF16), and q.k over such values overflows FP32.
      if (!allows_per_token_scales(cache.dtype)) {
        return make_status(StatusCode::invalid_argument, "per_token scales are for FP8 caches; a ",
                           to_string(cache.dtype), " cache takes scale mode ",
                           requires_scale(cache.dtype) ? "per_tensor" : "none or per_tensor");
      }
      if (cache.k_token_scales == nullptr || cache.v_token_scales == nullptr) {
        return make_status(StatusCode::invalid_argument,
                           "per_token scales need non-null k_token_scales and v_token_scales arrays");
      }
      break;
    default:
      return make_status(StatusCode::invalid_argument, "unknown scale mode ",
                         static_cast<int>(cache.scale_mode));
  }
  return {};
}

}  // namespace attention
SLIMSERVE_NAMESPACE_END
