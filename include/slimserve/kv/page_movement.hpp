#pragma once
/// \file
/// \brief Moving KV pages under the tag check: copy_pages (copy-on-write of a shared last
/// page, defragmentation), swap_pages (device cache <-> pinned host slots, for preemption and
/// offload) and export_request / import_request (one request's pages to and from a contiguous,
/// self-describing buffer: the unit prefill/decode disaggregation ships).
///
/// Every cache layout (NHD, HND) and dtype (BF16, FP16, FP8 e4m3/e5m2), per-token scales
/// included: a page *record* is the page's K bytes, then its V bytes, then (per_token scales
/// only) its K scales and V scales, each in the cache's own layout. Pages move as raw bytes
/// (no re-quantization), so a round trip is byte-exact.
///
/// Every page a kernel touches is checked on the device with kv::page_access_verdict against
/// the device tag array: a page it reads must carry the expected tag and be read-only or the
/// mover's own; a page it writes must carry the expected tag and be writable by the mover
/// (`writer`, the identity the pool granted the page to). A move that fails writes nothing,
/// and its RequestStatus says why. Host preflight (`check_*`) refuses bad shapes, pointers,
/// ids, token counts, duplicated destinations and short buffers before any launch.
/// Run steps take a stream and never synchronize (graph-safe: counts are fixed at launch).

#include <cstdint>
#include <span>

#include "slimserve/attention/detail/stream.hpp"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/config.hpp"
#include "slimserve/kv/page_access.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

class DeviceTagArray;  // device_tag_array.hpp: the device's tags and write owners

/// One page-to-page copy inside one cache: slots [0, tokens) of `src` into `dst`.
struct PageCopy {
  PageId src = -1;
  PageTag src_tag = 0;
  PageId dst = -1;
  PageTag dst_tag = 0;
  WriterId writer = no_writer;  ///< holds the write right on dst (and may read src)
  std::int32_t tokens = 0;      ///< 1..page_size: the filled tokens (copy-on-write) or all
};

struct CopyPagesArguments {
  attention::PagedKVCacheView cache;
  const DeviceTagArray* page_tags = nullptr;
  const PageCopy* copies = nullptr;      ///< device, [num_copies]
  std::int32_t num_copies = 0;
  RequestStatus* statuses = nullptr;     ///< device, [num_copies]: each copy's verdict
};

/// One page moving between the cache and slot `host_slot` of a pinned host buffer.
struct PageSwap {
  PageId page = -1;
  PageTag tag = 0;
  WriterId writer = no_writer;  ///< the mover: reads the page (swap out), or writes it (swap in)
  std::int32_t host_slot = -1;  ///< record index in the host buffer
};

enum class SwapDirection : std::uint8_t { device_to_host, host_to_device };
/// Directions arrive as integers too (C ABI, casts): every call checks before using one.
constexpr bool is_valid(SwapDirection direction) noexcept {
  return direction == SwapDirection::device_to_host || direction == SwapDirection::host_to_device;
}

struct SwapPagesArguments {
  attention::PagedKVCacheView cache;
  const DeviceTagArray* page_tags = nullptr;
  void* host_records = nullptr;  ///< pinned (mapped) host memory, [host_slots, record bytes], 16-byte aligned
  std::int32_t host_slots = 0;
  const PageSwap* swaps = nullptr;   ///< device, [num_swaps]
  std::int32_t num_swaps = 0;
  SwapDirection direction = SwapDirection::device_to_host;
  RequestStatus* statuses = nullptr;  ///< device, [num_swaps]
};

/// The header at the start of an exported buffer: enough to refuse an incompatible import.
struct KvBufferDescriptor {
  static constexpr std::uint32_t expected_magic = 0x564B5353u;  // "SSKV"
  static constexpr std::uint32_t current_version = 1;
  std::uint32_t magic = expected_magic;
  std::uint32_t version = current_version;
  attention::KvDtype dtype = attention::KvDtype::bf16;
  attention::KvLayout layout = attention::KvLayout::nhd;
  attention::KvScaleMode scale_mode = attention::KvScaleMode::none;
  std::uint8_t reserved = 0;
  std::int32_t page_size = 0;
  std::int32_t num_kv_heads = 0;
  std::int32_t head_dim = 0;
  std::int32_t num_pages = 0;    ///< records that follow
  std::int32_t reserved2 = 0;    ///< keeps the layout free of padding (the bytes are compared)
  std::int64_t num_tokens = 0;   ///< tokens in those pages
  std::int64_t record_bytes = 0; ///< bytes per page record
  friend constexpr bool operator==(const KvBufferDescriptor&, const KvBufferDescriptor&) = default;
};
/// Records start this many bytes into the buffer (the descriptor, padded for 16-byte loads).
inline constexpr std::int64_t kv_buffer_header_bytes = 64;
static_assert(sizeof(KvBufferDescriptor) == 48 && sizeof(KvBufferDescriptor) <= kv_buffer_header_bytes,
              "the descriptor is copied and compared as bytes: no padding");

/// One request's pages and the mover's identity (device arrays), for export and import.
struct RequestPagesView {
  const PageId* pages = nullptr;  ///< device, [num_pages]
  const PageTag* tags = nullptr;  ///< device, [num_pages]
  std::int32_t num_pages = 0;
  std::int64_t num_tokens = 0;    ///< (num_pages - 1) * page_size < num_tokens <= num_pages * page_size
  WriterId writer = no_writer;    ///< export: the reader; import: holds the write right on every page
};

struct ExportRequestArguments {
  attention::PagedKVCacheView cache;
  const DeviceTagArray* page_tags = nullptr;
  RequestPagesView request;
  void* buffer = nullptr;            ///< device or pinned host, 16-byte aligned
  std::int64_t buffer_bytes = 0;     ///< at least export_buffer_bytes(...)
  RequestStatus* status = nullptr;   ///< device, [1]
};

struct ImportRequestArguments {
  attention::PagedKVCacheView cache;
  const DeviceTagArray* page_tags = nullptr;
  RequestPagesView request;
  const void* buffer = nullptr;      ///< as exported (device or pinned host), 16-byte aligned
  std::int64_t buffer_bytes = 0;
  /// What the host read from the buffer's header (read_buffer_descriptor); the kernel
  /// compares it with the header again before writing a page.
  KvBufferDescriptor descriptor;
  RequestStatus* status = nullptr;   ///< device, [1]
};

/// Bytes of one page record of `cache` (K, V and, for per_token scales, their scales).
std::int64_t page_record_bytes(const attention::PagedKVCacheView& cache) noexcept;
/// Bytes an export of `num_pages` pages needs.
std::int64_t export_buffer_bytes(const attention::PagedKVCacheView& cache,
                                 std::int32_t num_pages) noexcept;
/// The descriptor an export of `request` from `cache` writes.
KvBufferDescriptor describe_export(const attention::PagedKVCacheView& cache,
                                   std::int32_t num_pages, std::int64_t num_tokens) noexcept;
/// Parses and checks a header copied to the host (`header` = the buffer's first bytes).
Result<KvBufferDescriptor> read_buffer_descriptor(std::span<const std::byte> header);
/// Whether a buffer described by `descriptor` can be imported into `cache` (same dtype,
/// layout, scale mode, page size, heads, head_dim and record size), naming the first mismatch.
Status check_import_compatible(const KvBufferDescriptor& descriptor,
                               const attention::PagedKVCacheView& cache);

/// Host preflight of a copy list (host copy of `copies`): ids in [1, num_pages) (no guard
/// page), tokens in 1..page_size, src != dst, and no page written twice or both read and
/// written in one launch (the copies run in parallel).
Status check_page_copies(std::span<const PageCopy> copies, const attention::PagedKVCacheView& cache);
/// Host preflight of a swap list: ids in [1, num_pages), host slots in [0, host_slots), no
/// page or slot written twice.
Status check_page_swaps(std::span<const PageSwap> swaps, SwapDirection direction,
                        const attention::PagedKVCacheView& cache, std::int32_t host_slots);

/// Launches (after the shape/pointer preflight; run the list checks above on host copies).
Status copy_pages(const CopyPagesArguments& arguments, cudaStream_t stream);
Status swap_pages(const SwapPagesArguments& arguments, cudaStream_t stream);
Status export_request(const ExportRequestArguments& arguments, cudaStream_t stream);
Status import_request(const ImportRequestArguments& arguments, cudaStream_t stream);

}  // namespace kv
SLIMSERVE_NAMESPACE_END
