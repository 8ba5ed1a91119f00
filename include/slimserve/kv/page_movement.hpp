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
///
/// Identity on every record that leaves the cache: each swap slot and each page record of an
/// export buffer starts with a KvRecordHeader (whose request wrote it, from which pool, the
/// engine's sequence number, the slot or page index, the filled slots and a checksum of the
/// record). Swap-out and export seal it from the copy (the checksum of the words they move);
/// swap-in and import verify it on the device before any byte lands (a verify kernel ahead of
/// the copy): a slot holding another request's record, a stale record, another
/// request's export buffer of the same shape or a corrupted record is refused
/// (record_mismatch) and the destination pages keep every byte.

#include <cstdint>
#include <span>

#include "slimserve/runtime/stream.hpp"
#include "slimserve/kv/kv_cache_view.hpp"
#include "slimserve/config.hpp"
#include "slimserve/detail/mix64.hpp"
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

/// Whose a record is: written into every record header on the way out (swap-out, export) and
/// compared with every header on the way in (swap-in, import).
struct RecordIdentity {
  PageTag pool = 0;             ///< the pool the record left: its tag_base (DeviceTagArray::synced_pool)
  WriterId writer = no_writer;  ///< the request identity that wrote it (the swap-out / export mover)
  std::uint32_t sequence = 0;   ///< the engine's number for this record set (e.g. the request's
                                ///< preemption count): a stale record of the same request differs
  friend constexpr bool operator==(const RecordIdentity&, const RecordIdentity&) = default;
};
static_assert(sizeof(RecordIdentity) == 12, "RecordIdentity is shared with device code and the C ABI");

/// The 32 bytes in front of every record that leaves the cache (a swap slot, an export page).
struct KvRecordHeader {
  static constexpr std::uint32_t expected_magic = 0x524B5353u;  // "SSKR"
  std::uint32_t magic = expected_magic;
  RecordIdentity identity{};
  std::int32_t index = 0;      ///< swap: the host slot; export: the page's index in the request
  std::int32_t tokens = 0;     ///< filled slots (swap: the page's device-held fill at swap-out)
  std::uint64_t checksum = 0;  ///< record_checksum over the record's bytes and the fields above
};
inline constexpr std::int64_t kv_record_header_bytes = 32;
static_assert(sizeof(KvRecordHeader) == kv_record_header_bytes && kv_record_header_bytes % 16 == 0,
              "records after a header stay 16-byte aligned");

/// The checksum: a sum (so blocks can fold it in any order) of one mixed term per 4-byte word
/// and its byte offset in the record, sealed with the header's fields. A word moved, changed or
/// taken from another record changes it; so does any identity field.
SLIMSERVE_HOST_DEVICE constexpr std::uint64_t record_word_term(std::int64_t offset, std::uint32_t word) {
  return ::slimserve::detail::mix64((static_cast<std::uint64_t>(offset) << 32 | word) + 0x9E3779B97F4A7C15ull);
}
SLIMSERVE_HOST_DEVICE constexpr std::uint64_t record_checksum(std::uint64_t word_sum,
                                                              const RecordIdentity& identity,
                                                              std::int32_t index, std::int32_t tokens) {
  std::uint64_t h = ::slimserve::detail::mix64(word_sum ^ 0x5353524B00000000ull);
  h = ::slimserve::detail::mix64(h ^ (static_cast<std::uint64_t>(identity.pool) << 32 | identity.writer));
  h = ::slimserve::detail::mix64(h ^ (static_cast<std::uint64_t>(identity.sequence) << 32 | static_cast<std::uint32_t>(index)));
  return ::slimserve::detail::mix64(h ^ static_cast<std::uint32_t>(tokens));
}
/// Whether a header says what the reader expects: the magic, the identity, the index, the
/// token count (`tokens` < 0: any count in 0..page_size) and the checksum of `word_sum`.
SLIMSERVE_HOST_DEVICE constexpr bool record_header_matches(const KvRecordHeader& header,
                                                           const RecordIdentity& expected,
                                                           std::int32_t index, std::int32_t tokens,
                                                           std::int32_t page_size,
                                                           std::uint64_t word_sum) {
  const bool tokens_ok = tokens < 0 ? header.tokens >= 0 && header.tokens <= page_size
                                    : header.tokens == tokens;
  return header.magic == KvRecordHeader::expected_magic && header.identity == expected &&
         header.index == index && tokens_ok &&
         header.checksum == record_checksum(word_sum, expected, index, header.tokens);
}

enum class SwapDirection : std::uint8_t { device_to_host, host_to_device };
/// Directions arrive as integers too (C ABI, casts): every call checks before using one.
constexpr bool is_valid(SwapDirection direction) noexcept {
  return direction == SwapDirection::device_to_host || direction == SwapDirection::host_to_device;
}

struct SwapPagesArguments {
  attention::PagedKVCacheView cache;
  const DeviceTagArray* page_tags = nullptr;
  void* host_records = nullptr;  ///< pinned (mapped) host memory, [host_slots, swap_slot_bytes], 16-byte aligned
  std::int32_t host_slots = 0;
  const PageSwap* swaps = nullptr;   ///< device, [num_swaps]
  std::int32_t num_swaps = 0;
  SwapDirection direction = SwapDirection::device_to_host;
  RequestStatus* statuses = nullptr;  ///< device, [num_swaps]
  /// device, [num_swaps]: swap-out writes identities[i] into swap i's slot header; swap-in
  /// refuses (record_mismatch, nothing written) a slot whose header says otherwise. Null:
  /// {page_tags->synced_pool(), the swap's writer, sequence 0}, which lets only the identity
  /// that swapped a record out swap it back in (a resumed request with a new identity passes
  /// the old one here).
  const RecordIdentity* identities = nullptr;
};

/// The header at the start of an exported buffer: enough to refuse an incompatible import.
struct KvBufferDescriptor {
  static constexpr std::uint32_t expected_magic = 0x564B5353u;  // "SSKV"
  static constexpr std::uint32_t current_version = 2;  ///< 2: every page record has a KvRecordHeader
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
/// Records start this many bytes into the buffer: the descriptor, then (at byte 48) the
/// exporter's RecordIdentity, padded for 16-byte loads. Each record is a KvRecordHeader and
/// the page's bytes (swap_slot_bytes apart).
inline constexpr std::int64_t kv_buffer_header_bytes = 64;
inline constexpr std::int64_t kv_buffer_identity_offset = 48;
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
  /// Written into the buffer and every record header. writer == no_writer (the default):
  /// {page_tags->synced_pool(), request.writer, 0}.
  RecordIdentity identity{};
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
  /// Whose buffer this must be (the exporter's identity, as the transfer's metadata says):
  /// every record header must carry it, its page index and token count, and a matching
  /// checksum, else the request is refused (record_mismatch) and no page is written.
  RecordIdentity expected{};
};

/// Bytes of one page record of `cache` (K, V and, for per_token scales, their scales).
std::int64_t page_record_bytes(const attention::PagedKVCacheView& cache) noexcept;
/// Bytes of one swap slot (and one record of an export buffer): the header and the record.
std::int64_t swap_slot_bytes(const attention::PagedKVCacheView& cache) noexcept;
/// Bytes an export of `num_pages` pages needs.
std::int64_t export_buffer_bytes(const attention::PagedKVCacheView& cache,
                                 std::int32_t num_pages) noexcept;
/// The descriptor an export of `request` from `cache` writes.
KvBufferDescriptor describe_export(const attention::PagedKVCacheView& cache,
                                   std::int32_t num_pages, std::int64_t num_tokens) noexcept;
/// Parses and checks a header copied to the host (`header` = the buffer's first bytes).
Result<KvBufferDescriptor> read_buffer_descriptor(std::span<const std::byte> header);
/// The exporter's identity a buffer's header claims (`header` = the buffer's first
/// kv_buffer_header_bytes). What the importer should expect comes from the transfer's own
/// metadata; the claim is for messages and for callers that can only check integrity.
Result<RecordIdentity> read_buffer_identity(std::span<const std::byte> header);
/// Whether a buffer described by `descriptor` can be imported into `cache` (same dtype,
/// layout, scale mode, page size, heads, head_dim and record size), naming the first mismatch.
Status check_import_compatible(const KvBufferDescriptor& descriptor,
                               const attention::PagedKVCacheView& cache);

/// Host preflight of a copy list (host copy of `copies`): ids in [1, num_pages) (no guard
/// page), tokens in 1..page_size, src != dst, and no page written twice or both read and
/// written in one launch (the copies run in parallel).
Status check_page_copies(std::span<const PageCopy> copies, const attention::PagedKVCacheView& cache);
/// Host preflight of a swap list: ids in [1, num_pages), host slots in [0, host_slots), no
/// page or slot written twice. (The identities are device data: a swap-in's are compared on
/// the device with the slot headers.)
Status check_page_swaps(std::span<const PageSwap> swaps, SwapDirection direction,
                        const attention::PagedKVCacheView& cache, std::int32_t host_slots);

/// Launches (after the shape/pointer preflight; run the list checks above on host copies).
Status copy_pages(const CopyPagesArguments& arguments, cudaStream_t stream);
Status swap_pages(const SwapPagesArguments& arguments, cudaStream_t stream);
Status export_request(const ExportRequestArguments& arguments, cudaStream_t stream);
Status import_request(const ImportRequestArguments& arguments, cudaStream_t stream);

}  // namespace kv
SLIMSERVE_NAMESPACE_END
