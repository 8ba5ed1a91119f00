#include "slimserve/kv/mla_cache_view.hpp"

#include <cstdint>
#include <limits>

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

Status validate_mla_cache_view(const MlaCacheView& cache) {
  if (cache.latent_dim != mla_latent_dim) {
    return make_status(StatusCode::unsupported, "MLA latent_dim ", cache.latent_dim,
                       " is not supported (512, as DeepSeek-V3 / Kimi K2)");
  }
  if (cache.rope_dim != mla_rope_dim) {
    return make_status(StatusCode::unsupported, "MLA rope_dim ", cache.rope_dim,
                       " is not supported (64, as DeepSeek-V3 / Kimi K2)");
  }
  if (!supported_page_size(cache.page_size)) {
    return unsupported_page_size("MLA ", cache.page_size);
  }
  if (cache.num_pages <= 0) {
    return make_status(StatusCode::invalid_argument, "MLA cache needs num_pages > 0, got ", cache.num_pages);
  }
  if (cache.pages == nullptr) {
    return make_status(StatusCode::invalid_argument, "MLA cache pages must be non-null");
  }
  if (reinterpret_cast<std::uintptr_t>(cache.pages) % 16 != 0) {
    return make_status(StatusCode::invalid_argument, "MLA cache pages must be 16-byte aligned");
  }
  switch (cache.dtype) {
    case KvDtype::bf16:
      if (cache.scale_mode != MlaScaleMode::none) {
        return make_status(StatusCode::invalid_argument, "a bf16 MLA cache takes scale mode none, got ",
                           to_string(cache.scale_mode));
      }
      break;
    case KvDtype::fp8_e4m3:
      if (cache.scale_mode == MlaScaleMode::none) {
        return make_status(StatusCode::invalid_argument,
                           "an fp8_e4m3 MLA cache needs scales (per_token_group or per_tensor); a "
                           "silent 1.0 is refused");
      }
      if (cache.scale_mode == MlaScaleMode::per_tensor && cache.latent_scale == nullptr) {
        return make_status(StatusCode::invalid_argument,
                           "per_tensor MLA scales need a non-null device pointer latent_scale");
      }
      if (cache.scale_mode != MlaScaleMode::per_tensor && cache.scale_mode != MlaScaleMode::per_token_group) {
        return make_status(StatusCode::invalid_argument, "unknown MLA scale mode ",
                           static_cast<int>(cache.scale_mode));
      }
      break;
    case KvDtype::nvfp4:
      // The block scales are in the record; the tensor scale is the one per-tensor float.
      if (cache.scale_mode != MlaScaleMode::per_tensor) {
        return make_status(StatusCode::invalid_argument,
                           "an nvfp4 MLA cache takes scale mode per_tensor (its tensor scale; the block "
                           "scales are in each record), got ", to_string(cache.scale_mode));
      }
      if (cache.latent_scale == nullptr) {
        return make_status(StatusCode::invalid_argument,
                           "an nvfp4 MLA cache needs a non-null device pointer latent_scale (the tensor scale)");
      }
      break;
    default:
      return make_status(StatusCode::unsupported, "MLA latent type ", to_string(cache.dtype),
                         " is not supported (bf16, fp8_e4m3 or nvfp4)");
  }
  if (cache.bytes() / cache.page_size / cache.token_layout().token_bytes != cache.num_pages ||
      static_cast<std::int64_t>(cache.num_pages) * cache.page_size > std::numeric_limits<std::int32_t>::max()) {
    return make_status(StatusCode::invalid_argument, "MLA cache of ", cache.num_pages, " pages of ",
                       cache.page_size, " tokens is too large");
  }
  return {};
}

}  // namespace attention
SLIMSERVE_NAMESPACE_END
