#include "slimserve/kv/mla_cache_view.hpp"

#include <cstdint>
#include <limits>

#include "slimserve/detail/preflight.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {
namespace {

/// What each latent type takes, as the messages say it (the rule is mla_format_supported's).
struct MlaFormatModes {
  KvDtype dtype;
  const char* modes;
};
constexpr MlaFormatModes mla_format_modes[] = {
    {KvDtype::bf16, "none"},
    {KvDtype::fp8_e4m3, "per_token_group or per_tensor (scales are required: a silent 1.0 is refused)"},
    {KvDtype::nvfp4, "per_tensor (its tensor scale; the block scales are in each record)"},
};

}  // namespace

Status check_mla_format(KvDtype dtype, MlaScaleMode mode) {
  if (mla_format_supported(dtype, mode)) return {};
  for (const MlaFormatModes& format : mla_format_modes) {
    if (format.dtype != dtype) continue;
    if (to_string(mode) == "unknown") {
      return make_status(StatusCode::invalid_argument, "unknown MLA scale mode ", static_cast<int>(mode));
    }
    return make_status(StatusCode::invalid_argument, "MLA latent type ", to_string(dtype), " takes scale mode ",
                       format.modes, ", got ", to_string(mode));
  }
  return make_status(StatusCode::unsupported, "MLA latent type ", to_string(dtype),
                     " is not supported (bf16, fp8_e4m3 or nvfp4)");
}

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
  if (!preflight::aligned16(cache.pages)) {
    return make_status(StatusCode::invalid_argument, "MLA cache pages must be 16-byte aligned");
  }
  SLIMSERVE_RETURN_IF_ERROR(check_mla_format(cache.dtype, cache.scale_mode));
  if (cache.scale_mode == MlaScaleMode::per_tensor && cache.latent_scale == nullptr) {
    return make_status(StatusCode::invalid_argument,
                       "per_tensor MLA scales need a non-null device pointer latent_scale (nvfp4: its tensor "
                       "scale)");
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
