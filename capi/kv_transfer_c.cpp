// The C ABI's cache layouts and transfer lists (ABI 3, include/slimserve/c/slimserve.h) over
// kv/cache_layout.hpp. Exported under the version node SLIMSERVE_C_3. The C struct and the C++
// descriptor are the same bytes (checked below), so a layout crosses by memcpy.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "c_support.hpp"
#include "slimserve/c/slimserve.h"
#include "slimserve/kv/cache_layout.hpp"

namespace {

using namespace slimserve_capi;

static_assert(sizeof(slimserve_cache_layout) == sizeof(kv::CacheLayoutDescriptor));
static_assert(offsetof(slimserve_cache_layout, k) == offsetof(kv::CacheLayoutDescriptor, k));
static_assert(offsetof(slimserve_cache_layout, v_scales) == offsetof(kv::CacheLayoutDescriptor, v_scales));
static_assert(offsetof(slimserve_cache_layout, num_arrays) == offsetof(kv::CacheLayoutDescriptor, num_arrays));
static_assert(sizeof(slimserve_transfer_entry) == sizeof(kv::TransferEntry));
static_assert(sizeof(slimserve_cache_array) == sizeof(kv::CacheArray));
static_assert(SLIMSERVE_CACHE_MLA_LATENT == static_cast<int>(kv::CacheKind::mla_latent));

kv::CacheLayoutDescriptor from_c(const slimserve_cache_layout& layout) {
  kv::CacheLayoutDescriptor out;
  std::memcpy(static_cast<void*>(&out), &layout, sizeof(out));
  return out;
}

void to_c(const kv::CacheLayoutDescriptor& layout, slimserve_cache_layout* out) {
  std::memcpy(out, &layout, sizeof(*out));
}

}  // namespace

extern "C" {

slimserve_status slimserve_describe_kv_cache(const slimserve_kv_cache* cache, int64_t page_stride,
                                             slimserve_cache_layout* out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    attention::PagedKVCacheView view;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(cache, view, page_stride));
    auto layout = kv::describe_cache(view);
    if (!layout.ok()) return layout.status();
    to_c(*layout, out);
    return {};
  });
}

slimserve_status slimserve_describe_mla_cache(const slimserve_mla_cache* cache, slimserve_cache_layout* out) {
  return guarded([&]() -> Status {
    if (cache == nullptr) return null_argument("cache");
    if (out == nullptr) return null_argument("out");
    attention::MlaCacheView view;
    SLIMSERVE_RETURN_IF_ERROR(to_mla_cache(*cache, view));
    auto layout = kv::describe_cache(view);
    if (!layout.ok()) return layout.status();
    to_c(*layout, out);
    return {};
  });
}

slimserve_status slimserve_cache_layout_parse(const void* bytes, size_t num_bytes, slimserve_cache_layout* out) {
  return guarded([&]() -> Status {
    if (bytes == nullptr) return null_argument("bytes");
    if (out == nullptr) return null_argument("out");
    auto layout = kv::parse_cache_layout(std::span(static_cast<const std::byte*>(bytes), num_bytes));
    if (!layout.ok()) return layout.status();
    to_c(*layout, out);
    return {};
  });
}

slimserve_status slimserve_cache_layout_check_compatible(const slimserve_cache_layout* local,
                                                         const slimserve_cache_layout* remote) {
  return guarded([&]() -> Status {
    if (local == nullptr) return null_argument("local");
    if (remote == nullptr) return null_argument("remote");
    return kv::check_layout_compatible(from_c(*local), from_c(*remote));
  });
}

int64_t slimserve_transfer_list_capacity(const slimserve_cache_layout* layout, int32_t num_pages) {
  if (layout == nullptr) return 0;
  const kv::CacheLayoutDescriptor cpp = from_c(*layout);
  return kv::validate_cache_layout(cpp).ok() ? kv::transfer_list_capacity(cpp, num_pages) : 0;
}

slimserve_status slimserve_build_transfer_list(const slimserve_cache_layout* src, const int32_t* src_pages,
                                               const slimserve_cache_layout* dst, const int32_t* dst_pages,
                                               int32_t num_pages, int64_t num_tokens,
                                               slimserve_transfer_entry* out, size_t capacity, size_t* count) {
  if (count != nullptr) *count = 0;
  return guarded([&]() -> Status {
    if (src == nullptr) return null_argument("src");
    if (dst == nullptr) return null_argument("dst");
    if (count == nullptr) return null_argument("count");
    if (num_pages < 0) return make_status(StatusCode::invalid_argument, "num_pages ", num_pages);
    if (num_pages > 0 && (src_pages == nullptr || dst_pages == nullptr)) {
      return null_argument(src_pages == nullptr ? "src_pages" : "dst_pages");
    }
    if (capacity > 0 && out == nullptr) return null_argument("out");
    kv::TransferListArguments arguments;
    arguments.src = from_c(*src);
    arguments.dst = from_c(*dst);
    arguments.src_pages = std::span(src_pages, static_cast<std::size_t>(num_pages));
    arguments.dst_pages = std::span(dst_pages, static_cast<std::size_t>(num_pages));
    arguments.num_tokens = num_tokens;
    auto written = kv::build_transfer_list(arguments, std::span(reinterpret_cast<kv::TransferEntry*>(out), capacity));
    if (!written.ok()) return written.status();
    *count = static_cast<std::size_t>(*written);
    return {};
  });
}

slimserve_status slimserve_coalesce_transfer_list(slimserve_transfer_entry* entries, size_t count,
                                                  size_t* out_count) {
  if (out_count != nullptr) *out_count = 0;
  return guarded([&]() -> Status {
    if (out_count == nullptr) return null_argument("out_count");
    if (count > 0 && entries == nullptr) return null_argument("entries");
    const std::int64_t merged =
        kv::coalesce_transfer_list(std::span(reinterpret_cast<kv::TransferEntry*>(entries), count));
    *out_count = static_cast<std::size_t>(merged);
    return {};
  });
}

int32_t slimserve_cache_registration_regions(const slimserve_cache_layout* layout, slimserve_cache_array* out) {
  if (layout == nullptr || out == nullptr) return 0;
  const kv::CacheLayoutDescriptor cpp = from_c(*layout);
  if (!kv::validate_cache_layout(cpp).ok()) return 0;
  std::array<kv::CacheArray, 4> regions{};
  const std::int32_t n = kv::registration_regions(cpp, regions);
  std::memcpy(out, regions.data(), sizeof(kv::CacheArray) * static_cast<std::size_t>(n));
  return n;
}

}  // extern "C"
