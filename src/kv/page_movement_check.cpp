// Page movement: host-side geometry, buffer descriptors and list preflight.
#include <cstring>
#include <vector>

#include "slimserve/kv/page_movement.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

namespace {
std::int64_t data_page_bytes(const attention::PagedKVCacheView& cache) {
  return static_cast<std::int64_t>(cache.page_size) * cache.num_kv_heads *
         attention::head_vector_bytes(cache.dtype, cache.head_dim);
}
std::int64_t scale_page_bytes(const attention::PagedKVCacheView& cache) {
  return cache.scale_mode == attention::KvScaleMode::per_token
             ? static_cast<std::int64_t>(cache.page_size) * cache.num_kv_heads *
                   static_cast<std::int64_t>(sizeof(float))
             : 0;
}
Status check_page_id(PageId page, const attention::PagedKVCacheView& cache, const char* what,
                     std::size_t index) {
  if (page == guard_page_id) {
    return make_status(StatusCode::invalid_argument, what, " ", index,
                       ": the guard page (page 0) is never moved");
  }
  if (page < 0 || page >= cache.num_pages) {
    return make_status(StatusCode::out_of_range, what, " ", index, ": page id ", page,
                       " outside [1, ", cache.num_pages, ")");
  }
  return {};
}
}  // namespace

std::int64_t page_record_bytes(const attention::PagedKVCacheView& cache) noexcept {
  return 2 * data_page_bytes(cache) + 2 * scale_page_bytes(cache);
}

std::int64_t swap_slot_bytes(const attention::PagedKVCacheView& cache) noexcept {
  return kv_record_header_bytes + page_record_bytes(cache);
}

std::int64_t export_buffer_bytes(const attention::PagedKVCacheView& cache,
                                 std::int32_t num_pages) noexcept {
  return kv_buffer_header_bytes + swap_slot_bytes(cache) * num_pages;
}

Result<RecordIdentity> read_buffer_identity(std::span<const std::byte> header) {
  if (header.size() < static_cast<std::size_t>(kv_buffer_identity_offset) + sizeof(RecordIdentity)) {
    return make_status(StatusCode::invalid_argument, "KV buffer header: ", header.size(),
                       " bytes, need ", kv_buffer_identity_offset + sizeof(RecordIdentity),
                       " for the exporter's identity");
  }
  RecordIdentity identity;
  std::memcpy(&identity, header.data() + kv_buffer_identity_offset, sizeof identity);
  return identity;
}

KvBufferDescriptor describe_export(const attention::PagedKVCacheView& cache,
                                   std::int32_t num_pages, std::int64_t num_tokens) noexcept {
  KvBufferDescriptor d{};
  d.dtype = cache.dtype;
  d.layout = cache.layout;
  d.scale_mode = cache.scale_mode == attention::KvScaleMode::per_token
                     ? attention::KvScaleMode::per_token
                     : attention::KvScaleMode::none;  // per-tensor scales travel out of band
  d.page_size = cache.page_size;
  d.num_kv_heads = cache.num_kv_heads;
  d.head_dim = cache.head_dim;
  d.num_pages = num_pages;
  d.num_tokens = num_tokens;
  d.record_bytes = page_record_bytes(cache);
  return d;
}

Result<KvBufferDescriptor> read_buffer_descriptor(std::span<const std::byte> header) {
  if (header.size() < sizeof(KvBufferDescriptor)) {
    return make_status(StatusCode::invalid_argument, "KV buffer header: ", header.size(),
                       " bytes, need ", sizeof(KvBufferDescriptor));
  }
  KvBufferDescriptor d;
  std::memcpy(&d, header.data(), sizeof d);
  if (d.magic != KvBufferDescriptor::expected_magic) {
    return make_status(StatusCode::invalid_argument, "KV buffer header: magic ", d.magic,
                       " is not a slimserve KV export");
  }
  if (d.version != KvBufferDescriptor::current_version) {
    return make_status(StatusCode::unsupported, "KV buffer header: version ", d.version,
                       ", this library reads version ", KvBufferDescriptor::current_version);
  }
  if (d.num_pages < 1 || d.page_size < 1 ||
      d.num_tokens <= static_cast<std::int64_t>(d.num_pages - 1) * d.page_size ||
      d.num_tokens > static_cast<std::int64_t>(d.num_pages) * d.page_size) {
    return make_status(StatusCode::invalid_argument, "KV buffer header: ", d.num_tokens,
                       " tokens do not fill ", d.num_pages, " pages of ", d.page_size);
  }
  return d;
}

Status check_import_compatible(const KvBufferDescriptor& d, const attention::PagedKVCacheView& cache) {
  const KvBufferDescriptor mine = describe_export(cache, d.num_pages, d.num_tokens);
  if (d.dtype != mine.dtype || d.layout != mine.layout || d.scale_mode != mine.scale_mode) {
    return make_status(StatusCode::invalid_argument, "import: buffer holds ",
                       attention::to_string(d.dtype), " ", attention::to_string(d.layout),
                       " scales ", attention::to_string(d.scale_mode), ", the cache is ",
                       attention::to_string(mine.dtype), " ", attention::to_string(mine.layout),
                       " scales ", attention::to_string(mine.scale_mode));
  }
  if (d.page_size != mine.page_size || d.num_kv_heads != mine.num_kv_heads ||
      d.head_dim != mine.head_dim || d.record_bytes != mine.record_bytes) {
    return make_status(StatusCode::invalid_argument, "import: buffer pages are ", d.page_size,
                       " tokens x ", d.num_kv_heads, " heads x ", d.head_dim, " (", d.record_bytes,
                       " bytes), the cache's ", mine.page_size, " x ", mine.num_kv_heads, " x ",
                       mine.head_dim, " (", mine.record_bytes, " bytes)");
  }
  return {};
}

Status check_page_copies(std::span<const PageCopy> copies, const attention::PagedKVCacheView& cache) {
  SLIMSERVE_RETURN_IF_ERROR(attention::validate_cache_view(cache));
  // 0 = untouched, 1 = read, 2 = written: a page written twice, or read and written, races.
  std::vector<std::uint8_t> use(static_cast<std::size_t>(cache.num_pages), 0);
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const PageCopy& c = copies[i];
    SLIMSERVE_RETURN_IF_ERROR(check_page_id(c.src, cache, "copy", i));
    SLIMSERVE_RETURN_IF_ERROR(check_page_id(c.dst, cache, "copy", i));
    if (c.tokens < 1 || c.tokens > cache.page_size) {
      return make_status(StatusCode::invalid_argument, "copy ", i, ": tokens ", c.tokens,
                         " outside 1..", cache.page_size);
    }
    if (c.writer == no_writer) {
      return make_status(StatusCode::invalid_argument, "copy ", i,
                         ": no writer identity (the destination must be writable by the mover)");
    }
    auto& src_use = use[static_cast<std::size_t>(c.src)];
    auto& dst_use = use[static_cast<std::size_t>(c.dst)];
    if (c.src == c.dst || dst_use != 0 || src_use == 2) {
      return make_status(StatusCode::invalid_argument, "copy ", i, ": page ",
                         src_use == 2 ? c.src : c.dst,
                         " is written by one copy and read or written by another in the same "
                         "launch (copies run in parallel)");
    }
    src_use = 1;
    dst_use = 2;
  }
  return {};
}

Status check_page_swaps(std::span<const PageSwap> swaps, SwapDirection direction,
                        const attention::PagedKVCacheView& cache, std::int32_t host_slots) {
  SLIMSERVE_RETURN_IF_ERROR(attention::validate_cache_view(cache));
  if (!is_valid(direction)) {
    return make_status(StatusCode::invalid_argument, "swap: unknown direction ",
                       static_cast<int>(direction));
  }
  std::vector<std::uint8_t> page_used(static_cast<std::size_t>(cache.num_pages), 0);
  std::vector<std::uint8_t> slot_used(static_cast<std::size_t>(host_slots > 0 ? host_slots : 0), 0);
  for (std::size_t i = 0; i < swaps.size(); ++i) {
    const PageSwap& sw = swaps[i];
    SLIMSERVE_RETURN_IF_ERROR(check_page_id(sw.page, cache, "swap", i));
    if (sw.host_slot < 0 || sw.host_slot >= host_slots) {
      return make_status(StatusCode::out_of_range, "swap ", i, ": host slot ", sw.host_slot,
                         " outside [0, ", host_slots, ")");
    }
    if (direction == SwapDirection::host_to_device && sw.writer == no_writer) {
      return make_status(StatusCode::invalid_argument, "swap ", i,
                         ": no writer identity (a swapped-in page must be writable by the mover)");
    }
    // The written side must be unique: pages when swapping in, host slots when swapping out.
    auto& written = direction == SwapDirection::host_to_device
                        ? page_used[static_cast<std::size_t>(sw.page)]
                        : slot_used[static_cast<std::size_t>(sw.host_slot)];
    if (written != 0) {
      return make_status(StatusCode::invalid_argument, "swap ", i, ": ",
                         direction == SwapDirection::host_to_device ? "page " : "host slot ",
                         direction == SwapDirection::host_to_device ? sw.page : sw.host_slot,
                         " is written twice in one launch");
    }
    written = 1;
  }
  return {};
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
