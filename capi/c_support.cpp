// The C ABI's shared pieces (c_support.hpp).
#include "c_support.hpp"

#include <algorithm>
#include <string>

namespace slimserve_capi {
namespace {
thread_local std::string last_error;
}  // namespace

slimserve_status record(const Status& status) {
  if (status.ok()) {
    last_error.clear();
    return SLIMSERVE_OK;
  }
  last_error = status.to_string();
  return static_cast<slimserve_status>(status.code());
}

const char* last_error_message() { return last_error.c_str(); }

Status to_cache(const slimserve_kv_cache* c, attention::PagedKVCacheView& out,
                std::int64_t page_stride) {
  if (c == nullptr) return null_argument("cache");
  out.k_pages = c->k_pages;
  out.v_pages = c->v_pages;
  out.k_scale = c->k_scale;
  out.v_scale = c->v_scale;
  out.k_token_scales = c->k_token_scales;
  out.v_token_scales = c->v_token_scales;
  out.num_pages = c->num_pages;
  out.page_size = c->page_size;
  out.num_kv_heads = c->num_kv_heads;
  out.head_dim = c->head_dim;
  out.page_stride = page_stride;
  SLIMSERVE_RETURN_IF_ERROR(to_enum(c->dtype, "KV dtype", out.dtype));
  SLIMSERVE_RETURN_IF_ERROR(to_enum(c->layout, "KV layout", out.layout));
  SLIMSERVE_RETURN_IF_ERROR(to_enum(c->scale_mode, "scale mode", out.scale_mode));
  return attention::can_implement(out);
}

Status to_mla_scale_mode(std::int32_t value, attention::MlaScaleMode& out) {
  SLIMSERVE_RETURN_IF_ERROR(to_enum(value, "MLA scale mode", out));
  if (out > attention::MlaScaleMode::per_token_group) {
    return make_status(StatusCode::invalid_argument, "unknown MLA scale mode ", value);
  }
  return {};
}

Status to_mla_cache(const slimserve_mla_cache& c, attention::MlaCacheView& out) {
  out.pages = c.pages;
  out.latent_scale = c.latent_scale;
  out.num_pages = c.num_pages;
  out.page_size = c.page_size;
  SLIMSERVE_RETURN_IF_ERROR(to_kv_dtype(c.dtype, out.dtype));
  SLIMSERVE_RETURN_IF_ERROR(to_mla_scale_mode(c.scale_mode, out.scale_mode));
  return attention::validate_mla_cache_view(out);
}

}  // namespace slimserve_capi
