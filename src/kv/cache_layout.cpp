#include "slimserve/kv/cache_layout.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {
namespace {

using attention::KvDtype;
using attention::KvLayout;
using attention::KvScaleMode;
using attention::MlaScaleMode;

constexpr const char* array_name(int index) noexcept {
  constexpr const char* names[] = {"k", "v", "k_scales", "v_scales"};
  return names[index];
}

/// Bytes of one full page of array `index` (0, 1: data; 2, 3: per-token scales).
std::int64_t array_page_bytes(const CacheLayoutDescriptor& layout, int index) noexcept {
  return index < 2 ? page_data_bytes(layout) : page_scale_bytes(layout);
}

/// Bytes of one (token, head) unit of array `index`: a K/V row, a token record, a scale.
std::int64_t unit_bytes(const CacheLayoutDescriptor& layout, int index) noexcept {
  return index < 2 ? layout.token_bytes : static_cast<std::int64_t>(sizeof(float));
}

/// (num_pages - 1) * stride + page, or -1 when it does not fit int64.
std::int64_t span_bytes(std::int32_t num_pages, std::int64_t stride, std::int64_t page) noexcept {
  if (num_pages <= 0 || stride < 0 || page < 0) return -1;
  const auto pages = static_cast<std::int64_t>(num_pages - 1);
  if (pages > 0 && stride > (std::numeric_limits<std::int64_t>::max() - page) / pages) return -1;
  return pages * stride + page;
}

CacheArray describe_array(const void* base, std::int32_t num_pages, std::int64_t stride, std::int64_t page) {
  return {static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(base)), stride,
          span_bytes(num_pages, stride, page)};
}

Status check_array(const CacheLayoutDescriptor& layout, int index) {
  const CacheArray& array = *layout.arrays()[index];
  const char* name = array_name(index);
  if (index >= layout.num_arrays) {
    if (array != CacheArray{}) {
      return make_status(StatusCode::invalid_argument, "cache layout: array ", name,
                         " must be all zero in a cache of ", layout.num_arrays, " arrays");
    }
    return {};
  }
  const std::int64_t page = array_page_bytes(layout, index);
  if (array.address == 0) {
    return make_status(StatusCode::invalid_argument, "cache layout: array ", name, " has address 0");
  }
  if (array.page_stride < page) {
    return make_status(StatusCode::invalid_argument, "cache layout: array ", name, " page_stride ",
                       array.page_stride, " is less than a page (", page, " bytes)");
  }
  const std::int64_t bytes = span_bytes(layout.num_pages, array.page_stride, page);
  if (bytes < 0 || array.bytes != bytes) {
    return make_status(StatusCode::invalid_argument, "cache layout: array ", name, " spans ", array.bytes,
                       " bytes; ", layout.num_pages, " pages ", array.page_stride, " bytes apart span ", bytes);
  }
  if (array.address > std::numeric_limits<std::uint64_t>::max() - static_cast<std::uint64_t>(bytes)) {
    return make_status(StatusCode::invalid_argument, "cache layout: array ", name, " wraps the address space");
  }
  return {};
}

Status check_paged_geometry(const CacheLayoutDescriptor& layout) {
  if (!attention::is_valid(layout.layout)) {
    return make_status(StatusCode::invalid_argument, "cache layout: unknown layout ", static_cast<int>(layout.layout));
  }
  const auto mode = static_cast<KvScaleMode>(layout.scale_mode);
  if (!attention::is_valid(mode)) {
    return make_status(StatusCode::invalid_argument, "cache layout: unknown scale mode ",
                       static_cast<int>(layout.scale_mode));
  }
  if (!attention::supported_head_dim(layout.head_dim)) {
    return make_status(StatusCode::invalid_argument, "cache layout: head_dim ", layout.head_dim,
                       " is not one a paged cache takes (", attention::PagedHeadDims::describe(), ")");
  }
  if (layout.num_kv_heads <= 0) {
    return make_status(StatusCode::invalid_argument, "cache layout: num_kv_heads ", layout.num_kv_heads);
  }
  if (attention::requires_scale(layout.dtype) && mode == KvScaleMode::none) {
    return make_status(StatusCode::invalid_argument, "cache layout: an ", attention::to_string(layout.dtype),
                       " cache needs scales (per_tensor or per_token)");
  }
  if (mode == KvScaleMode::per_token && !attention::allows_per_token_scales(layout.dtype)) {
    return make_status(StatusCode::invalid_argument, "cache layout: per_token scales are for FP8 caches");
  }
  const auto row = static_cast<std::int32_t>(attention::head_vector_bytes(layout.dtype, layout.head_dim));
  if (layout.token_bytes != row) {
    return make_status(StatusCode::invalid_argument, "cache layout: token_bytes ", layout.token_bytes,
                       "; a row of ", layout.head_dim, " ", attention::to_string(layout.dtype), " values is ", row);
  }
  const int arrays = mode == KvScaleMode::per_token ? 4 : 2;
  if (layout.num_arrays != arrays) {
    return make_status(StatusCode::invalid_argument, "cache layout: num_arrays ", layout.num_arrays,
                       "; a paged cache with scale mode ", attention::to_string(mode), " has ", arrays);
  }
  return {};
}

Status check_mla_geometry(const CacheLayoutDescriptor& layout) {
  const auto mode = static_cast<MlaScaleMode>(layout.scale_mode);
  if (!attention::mla_format_supported(layout.dtype, mode)) {
    return make_status(StatusCode::invalid_argument, "cache layout: an MLA cache of ", attention::to_string(layout.dtype),
                       " with scale mode ", static_cast<int>(layout.scale_mode),
                       " is not one slimserve makes (bf16 + none, fp8_e4m3 + per_tensor or per_token_group, "
                       "nvfp4 + per_tensor)");
  }
  if (layout.layout != KvLayout::nhd || layout.num_kv_heads != 1 || layout.head_dim != attention::mla_latent_dim) {
    return make_status(StatusCode::invalid_argument, "cache layout: an MLA cache has layout NHD, 1 head and head_dim ",
                       attention::mla_latent_dim, ", got ", attention::to_string(layout.layout), ", ",
                       layout.num_kv_heads, " and ", layout.head_dim);
  }
  const std::int32_t record = attention::mla_token_layout(layout.dtype, mode).token_bytes;
  if (layout.token_bytes != record) {
    return make_status(StatusCode::invalid_argument, "cache layout: token_bytes ", layout.token_bytes,
                       "; this MLA format's record is ", record);
  }
  if (layout.num_arrays != 1) {
    return make_status(StatusCode::invalid_argument, "cache layout: num_arrays ", layout.num_arrays,
                       "; an MLA cache has 1");
  }
  return {};
}

template <class Value>
Status mismatch(std::string_view field, const Value& local, const Value& remote) {
  return make_status(StatusCode::invalid_argument, "cache layout mismatch: ", field, " is ", local,
                     " here and ", remote, " in the remote cache; pages cannot move between them byte for byte");
}

std::string_view scale_mode_name(const CacheLayoutDescriptor& layout) noexcept {
  return layout.kind == CacheKind::mla_latent ? attention::to_string(static_cast<MlaScaleMode>(layout.scale_mode))
                                              : attention::to_string(static_cast<KvScaleMode>(layout.scale_mode));
}

Status check_pages(std::span<const PageId> pages, const CacheLayoutDescriptor& layout, const char* side) {
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (pages[i] < 1 || pages[i] >= layout.num_pages) {
      return make_status(pages[i] == 0 ? StatusCode::invalid_argument : StatusCode::out_of_range, side,
                         " page ", i, " is ", pages[i], pages[i] == 0 ? " (the guard page)" : "",
                         "; the cache's pages are 1..", layout.num_pages - 1);
    }
  }
  std::vector<PageId> sorted(pages.begin(), pages.end());
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice != sorted.end()) {
    return make_status(StatusCode::invalid_argument, side, " page ", *twice,
                       " is listed twice (a page moves once per request)");
  }
  return {};
}

}  // namespace

std::int64_t page_data_bytes(const CacheLayoutDescriptor& layout) noexcept {
  return static_cast<std::int64_t>(layout.page_size) * layout.num_kv_heads * layout.token_bytes;
}

std::int64_t page_scale_bytes(const CacheLayoutDescriptor& layout) noexcept {
  return layout.num_arrays == 4 ? static_cast<std::int64_t>(layout.page_size) * layout.num_kv_heads * 4 : 0;
}

std::int64_t request_transfer_bytes(const CacheLayoutDescriptor& layout, std::int64_t num_tokens) noexcept {
  std::int64_t per_token = 0;
  for (int a = 0; a < layout.num_arrays && a < 4; ++a) per_token += layout.num_kv_heads * unit_bytes(layout, a);
  return num_tokens * per_token;
}

Result<CacheLayoutDescriptor> describe_cache(const attention::PagedKVCacheView& cache) {
  SLIMSERVE_RETURN_IF_ERROR(attention::validate_cache_view(cache));
  CacheLayoutDescriptor layout;
  layout.kind = CacheKind::paged_kv;
  layout.dtype = cache.dtype;
  layout.layout = cache.layout;
  layout.scale_mode = static_cast<std::uint8_t>(cache.scale_mode);
  layout.num_pages = cache.num_pages;
  layout.page_size = cache.page_size;
  layout.num_kv_heads = cache.num_kv_heads;
  layout.head_dim = cache.head_dim;
  layout.token_bytes = static_cast<std::int32_t>(attention::head_vector_bytes(cache.dtype, cache.head_dim));
  // Bytes from the head vector's geometry (a sub-byte format's scales sit in the vector).
  const std::int64_t page = attention::packed_pages_bytes(cache) / cache.num_pages;
  const std::int64_t stride = attention::page_stride_bytes(cache);
  layout.k = describe_array(cache.k_pages, cache.num_pages, stride, page);
  layout.v = describe_array(cache.v_pages, cache.num_pages, stride, page);
  layout.num_arrays = 2;
  if (cache.scale_mode == KvScaleMode::per_token) {
    const std::int64_t scales = static_cast<std::int64_t>(cache.page_size) * cache.num_kv_heads * 4;
    layout.k_scales = describe_array(cache.k_token_scales, cache.num_pages, scales, scales);
    layout.v_scales = describe_array(cache.v_token_scales, cache.num_pages, scales, scales);
    layout.num_arrays = 4;
  }
  SLIMSERVE_RETURN_IF_ERROR(validate_cache_layout(layout));
  return layout;
}

Result<CacheLayoutDescriptor> describe_cache(const attention::MlaCacheView& cache) {
  SLIMSERVE_RETURN_IF_ERROR(attention::validate_mla_cache_view(cache));
  CacheLayoutDescriptor layout;
  layout.kind = CacheKind::mla_latent;
  layout.dtype = cache.dtype;
  layout.layout = KvLayout::nhd;
  layout.scale_mode = static_cast<std::uint8_t>(cache.scale_mode);
  layout.num_pages = cache.num_pages;
  layout.page_size = cache.page_size;
  layout.num_kv_heads = 1;
  layout.head_dim = cache.latent_dim;
  layout.token_bytes = cache.token_layout().token_bytes;
  const std::int64_t page = static_cast<std::int64_t>(cache.page_size) * layout.token_bytes;
  layout.k = describe_array(cache.pages, cache.num_pages, page, page);
  layout.num_arrays = 1;
  SLIMSERVE_RETURN_IF_ERROR(validate_cache_layout(layout));
  return layout;
}

Status validate_cache_layout(const CacheLayoutDescriptor& layout) {
  if (layout.magic != CacheLayoutDescriptor::expected_magic) {
    return make_status(StatusCode::data_loss, "cache layout: bad magic ", layout.magic,
                       " (not a slimserve cache layout)");
  }
  if (layout.version != CacheLayoutDescriptor::current_version) {
    return make_status(StatusCode::unsupported, "cache layout: version ", layout.version, " (this library reads ",
                       CacheLayoutDescriptor::current_version, ")");
  }
  if (!is_valid(layout.kind)) {
    return make_status(StatusCode::invalid_argument, "cache layout: unknown kind ", static_cast<int>(layout.kind));
  }
  if (!attention::is_valid(layout.dtype)) {
    return make_status(StatusCode::invalid_argument, "cache layout: unknown dtype ", static_cast<int>(layout.dtype));
  }
  if (!attention::supported_page_size(layout.page_size)) {
    return make_status(StatusCode::invalid_argument, "cache layout: page_size ", layout.page_size,
                       " (16, 32, 64 or 128)");
  }
  if (layout.num_pages < 2) {
    return make_status(StatusCode::invalid_argument, "cache layout: num_pages ", layout.num_pages,
                       " (the guard page and at least one more)");
  }
  if (layout.reserved != 0) {
    return make_status(StatusCode::invalid_argument, "cache layout: reserved field is ", layout.reserved);
  }
  SLIMSERVE_RETURN_IF_ERROR(layout.kind == CacheKind::paged_kv ? check_paged_geometry(layout)
                                                               : check_mla_geometry(layout));
  for (int a = 0; a < 4; ++a) SLIMSERVE_RETURN_IF_ERROR(check_array(layout, a));
  return {};
}

std::array<std::byte, cache_layout_bytes> serialize_cache_layout(const CacheLayoutDescriptor& layout) noexcept {
  std::array<std::byte, cache_layout_bytes> bytes{};
  std::memcpy(bytes.data(), &layout, cache_layout_bytes);
  return bytes;
}

Result<CacheLayoutDescriptor> parse_cache_layout(std::span<const std::byte> bytes) {
  if (bytes.size() != cache_layout_bytes) {
    return make_status(StatusCode::data_loss, "cache layout: ", bytes.size(), " bytes; a descriptor is ",
                       cache_layout_bytes);
  }
  CacheLayoutDescriptor layout;
  std::memcpy(&layout, bytes.data(), cache_layout_bytes);
  SLIMSERVE_RETURN_IF_ERROR(validate_cache_layout(layout));
  return layout;
}

Status check_layout_compatible(const CacheLayoutDescriptor& local, const CacheLayoutDescriptor& remote) {
  SLIMSERVE_RETURN_IF_ERROR(validate_cache_layout(local));
  SLIMSERVE_RETURN_IF_ERROR(validate_cache_layout(remote));
  if (local.kind != remote.kind) return mismatch("kind", to_string(local.kind), to_string(remote.kind));
  if (local.dtype != remote.dtype) {
    return mismatch("dtype (format)", attention::to_string(local.dtype), attention::to_string(remote.dtype));
  }
  if (local.layout != remote.layout) {
    return mismatch("layout", attention::to_string(local.layout), attention::to_string(remote.layout));
  }
  if (local.scale_mode != remote.scale_mode) return mismatch("scale_mode", scale_mode_name(local), scale_mode_name(remote));
  if (local.page_size != remote.page_size) return mismatch("page_size", local.page_size, remote.page_size);
  if (local.num_kv_heads != remote.num_kv_heads) return mismatch("num_kv_heads", local.num_kv_heads, remote.num_kv_heads);
  if (local.head_dim != remote.head_dim) return mismatch("head_dim", local.head_dim, remote.head_dim);
  if (local.token_bytes != remote.token_bytes) return mismatch("token_bytes", local.token_bytes, remote.token_bytes);
  return {};
}

std::int64_t transfer_list_capacity(const CacheLayoutDescriptor& layout, std::int32_t num_pages) noexcept {
  if (num_pages <= 0) return 0;
  const std::int64_t last = layout.layout == KvLayout::hnd ? layout.num_kv_heads : 1;
  return (static_cast<std::int64_t>(num_pages) - 1 + last) * layout.num_arrays;
}

std::int64_t coalesce_transfer_list(std::span<TransferEntry> entries) noexcept {
  if (entries.size() < 2) return static_cast<std::int64_t>(entries.size());
  std::sort(entries.begin(), entries.end(),
            [](const TransferEntry& a, const TransferEntry& b) { return a.src < b.src; });
  std::size_t last = 0;
  for (std::size_t i = 1; i < entries.size(); ++i) {
    TransferEntry& into = entries[last];
    const auto bytes = static_cast<std::uint64_t>(into.bytes);
    if (entries[i].src == into.src + bytes && entries[i].dst == into.dst + bytes) {
      into.bytes += entries[i].bytes;
    } else {
      entries[++last] = entries[i];
    }
  }
  return static_cast<std::int64_t>(last + 1);
}

Result<std::int64_t> build_transfer_list(const TransferListArguments& arguments, std::span<TransferEntry> out) {
  const CacheLayoutDescriptor& src = arguments.src;
  const CacheLayoutDescriptor& dst = arguments.dst;
  SLIMSERVE_RETURN_IF_ERROR(check_layout_compatible(dst, src));
  const std::int64_t page_size = src.page_size;
  const std::int64_t tokens = arguments.num_tokens;
  if (tokens <= 0 || tokens > page_size * std::numeric_limits<std::int32_t>::max()) {
    return make_status(StatusCode::invalid_argument, "num_tokens ", tokens, " (a request moves at least one token)");
  }
  const std::int64_t pages = (tokens + page_size - 1) / page_size;
  if (static_cast<std::int64_t>(arguments.src_pages.size()) != pages ||
      static_cast<std::int64_t>(arguments.dst_pages.size()) != pages) {
    return make_status(StatusCode::invalid_argument, tokens, " tokens of ", page_size, " per page need ", pages,
                       " pages on each side; got ", arguments.src_pages.size(), " source and ",
                       arguments.dst_pages.size(), " destination pages");
  }
  SLIMSERVE_RETURN_IF_ERROR(check_pages(arguments.src_pages, src, "source"));
  SLIMSERVE_RETURN_IF_ERROR(check_pages(arguments.dst_pages, dst, "destination"));
  const std::int64_t capacity = transfer_list_capacity(src, static_cast<std::int32_t>(pages));
  if (static_cast<std::int64_t>(out.size()) < capacity) {
    return make_status(StatusCode::invalid_argument, "the transfer list holds ", out.size(), " entries; ", pages,
                       " pages may need ", capacity, " (transfer_list_capacity)");
  }
  const bool per_head = src.layout == KvLayout::hnd;
  const std::int64_t heads = src.num_kv_heads;
  std::int64_t count = 0;
  for (int a = 0; a < src.num_arrays; ++a) {
    const CacheArray& from = *src.arrays()[a];
    const CacheArray& to = *dst.arrays()[a];
    const std::int64_t unit = unit_bytes(src, a);
    const std::int64_t first_of_array = count;
    auto emit = [&](std::uint64_t s, std::uint64_t d, std::int64_t bytes) {
      if (count > first_of_array) {
        TransferEntry& last = out[static_cast<std::size_t>(count - 1)];
        if (last.src + static_cast<std::uint64_t>(last.bytes) == s &&
            last.dst + static_cast<std::uint64_t>(last.bytes) == d) {
          last.bytes += bytes;  // continues the entry on both sides
          return;
        }
        if (s + static_cast<std::uint64_t>(bytes) == last.src && d + static_cast<std::uint64_t>(bytes) == last.dst) {
          last.src = s;  // ends where the entry starts on both sides (pages in descending order)
          last.dst = d;
          last.bytes += bytes;
          return;
        }
      }
      out[static_cast<std::size_t>(count++)] = {s, d, bytes};
    };
    for (std::int64_t i = 0; i < pages; ++i) {
      const std::int64_t filled = std::min(page_size, tokens - i * page_size);
      const std::uint64_t s = from.address + static_cast<std::uint64_t>(arguments.src_pages[i] * from.page_stride);
      const std::uint64_t d = to.address + static_cast<std::uint64_t>(arguments.dst_pages[i] * to.page_stride);
      if (filled == page_size || !per_head) {
        emit(s, d, filled * heads * unit);  // NHD, token-major records: the first tokens are contiguous
      } else {
        for (std::int64_t h = 0; h < heads; ++h) {  // HND: each head's first tokens
          const auto offset = static_cast<std::uint64_t>(h * page_size * unit);
          emit(s + offset, d + offset, filled * unit);
        }
      }
    }
  }
  return count;
}

std::int32_t registration_regions(const CacheLayoutDescriptor& layout, std::span<CacheArray, 4> out) noexcept {
  std::array<CacheArray, 4> spans{};
  int n = 0;
  for (int a = 0; a < layout.num_arrays && a < 4; ++a) {
    const CacheArray& array = *layout.arrays()[a];
    if (array.address != 0 && array.bytes > 0) spans[n++] = {array.address, 0, array.bytes};
  }
  for (int i = 1; i < n; ++i) {  // at most 4: insertion sort by address
    for (int j = i; j > 0 && spans[j].address < spans[j - 1].address; --j) std::swap(spans[j], spans[j - 1]);
  }
  std::int32_t count = 0;
  for (int i = 0; i < n; ++i) {
    if (count > 0) {
      CacheArray& last = out[count - 1];
      const std::uint64_t end = last.address + static_cast<std::uint64_t>(last.bytes);
      if (spans[i].address <= end) {
        const std::uint64_t this_end = spans[i].address + static_cast<std::uint64_t>(spans[i].bytes);
        if (this_end > end) last.bytes = static_cast<std::int64_t>(this_end - last.address);
        continue;
      }
    }
    out[count++] = spans[i];
  }
  return count;
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
