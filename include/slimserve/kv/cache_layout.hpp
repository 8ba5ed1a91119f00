#pragma once
/// \file
/// \brief Cache layout descriptors and page-granular transfer lists: what two engines (a
/// prefill pool and a decode pool, other processes or machines) need so a transfer engine
/// (NIXL, UCX, RDMA verbs) moves one request's KV pages between their registered caches in
/// place, without repacking.
///
/// * `CacheLayoutDescriptor`: a fixed-size, padding-free description of one cache's geometry
///   (kind, format, layout, scale mode, page size, heads, head_dim, token record size) and of
///   its arrays (base address, page stride, span in bytes: K, V and the per-token scale
///   arrays of a paged K/V cache; the one record array of an MLA latent cache). Its bytes are
///   the wire form (`serialize_cache_layout` / `parse_cache_layout`).
/// * `check_layout_compatible(local, remote)`: what the receiving side runs before anything
///   moves; a mismatch is refused naming the field and both values. Page counts, addresses and
///   page strides may differ: only the bytes of a page piece must mean the same on both sides.
/// * `build_transfer_list`: for one request, the (source address, destination address, bytes)
///   entries over the two caches: one per page piece, merged where both sides are contiguous.
/// * `registration_regions`: the memory to register with the transfer engine, once per cache
///   (not per request).
///
/// A page piece is a page's filled slots in one array: NHD pages (and the token-major MLA
/// records and per-token scales of an NHD cache) hold a page's first `n` tokens contiguously,
/// so one piece per array; HND pages hold them per head, so a partly filled last page gives one
/// piece per head. Full pages are one piece per array in both layouts.
/// Per-tensor scales are one calibrated float each, not page data: both sides load the same
/// calibration (the descriptor carries the scale mode, not the value).
/// Plain C++ on the host: no CUDA header, nothing launched.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "slimserve/kv/kv_cache_view.hpp"
#include "slimserve/kv/mla_cache_view.hpp"
#include "slimserve/config.hpp"
#include "slimserve/kv/page_access.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

enum class CacheKind : std::uint8_t { paged_kv, mla_latent };
constexpr bool is_valid(CacheKind kind) noexcept {
  return kind == CacheKind::paged_kv || kind == CacheKind::mla_latent;
}
constexpr std::string_view to_string(CacheKind kind) noexcept {
  return kind == CacheKind::paged_kv ? "paged_kv" : kind == CacheKind::mla_latent ? "mla_latent" : "unknown";
}

/// One array of a cache: page `p` starts at `address + p * page_stride`.
struct CacheArray {
  std::uint64_t address = 0;     ///< page 0; 0 when the cache has no such array
  std::int64_t page_stride = 0;  ///< bytes from one page to the next
  std::int64_t bytes = 0;        ///< bytes the array spans: (num_pages - 1) * page_stride + page bytes
  friend constexpr bool operator==(const CacheArray&, const CacheArray&) = default;
};

/// The geometry of one cache. Fields in wire order; the struct is its own serialization
/// (little-endian hosts; 136 bytes, no padding). Same layout as `slimserve_cache_layout`.
struct CacheLayoutDescriptor {
  static constexpr std::uint32_t expected_magic = 0x444C5353u;  // "SSLD"
  static constexpr std::uint32_t current_version = 1;
  std::uint32_t magic = expected_magic;
  std::uint32_t version = current_version;
  CacheKind kind = CacheKind::paged_kv;
  attention::KvDtype dtype = attention::KvDtype::bf16;
  attention::KvLayout layout = attention::KvLayout::nhd;  ///< MLA: nhd (token-major records)
  std::uint8_t scale_mode = 0;  ///< KvScaleMode (paged) or MlaScaleMode (MLA), as its integer
  std::int32_t num_pages = 0;
  std::int32_t page_size = 0;
  std::int32_t num_kv_heads = 0;  ///< MLA: 1 (one latent record per token)
  std::int32_t head_dim = 0;      ///< MLA: the latent dimension (512)
  std::int32_t token_bytes = 0;   ///< bytes of one (token, head) row of K (paged) or one token record (MLA)
  std::int32_t num_arrays = 0;    ///< arrays that follow and hold pages: 1 (MLA), 2 or 4 (per-token scales)
  std::int32_t reserved = 0;      ///< keeps the layout free of padding (the bytes are the wire form)
  CacheArray k;         ///< K pages; MLA: the record array
  CacheArray v;         ///< V pages
  CacheArray k_scales;  ///< per_token scales of K ([num_pages, page_size, H] in the pages' layout)
  CacheArray v_scales;
  friend constexpr bool operator==(const CacheLayoutDescriptor&, const CacheLayoutDescriptor&) = default;

  constexpr std::array<const CacheArray*, 4> arrays() const noexcept { return {&k, &v, &k_scales, &v_scales}; }
};
inline constexpr std::size_t cache_layout_bytes = 136;
static_assert(sizeof(CacheLayoutDescriptor) == cache_layout_bytes,
              "the descriptor is sent and compared as bytes: no padding");

/// One contiguous move: `bytes` from `src` (the source cache) to `dst` (the destination cache).
struct TransferEntry {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::int64_t bytes = 0;
  friend constexpr bool operator==(const TransferEntry&, const TransferEntry&) = default;
};
static_assert(sizeof(TransferEntry) == 24);

/// Describes a paged K/V cache whose K and V pages are `cache.page_stride` elements apart (0:
/// packed); validates the view first.
Result<CacheLayoutDescriptor> describe_cache(const attention::PagedKVCacheView& cache);
/// Describes an MLA latent cache; validates the view first.
Result<CacheLayoutDescriptor> describe_cache(const attention::MlaCacheView& cache);

/// The descriptor's wire form (cache_layout_bytes bytes).
std::array<std::byte, cache_layout_bytes> serialize_cache_layout(const CacheLayoutDescriptor& layout) noexcept;
/// Parses and checks bytes received from a peer: size, magic, version, enum values, geometry
/// (page size, heads, head_dim, record size as a cache of that kind and format has them) and
/// arrays (present, non-overlapping pages: stride >= page bytes, span = what the pages need).
Result<CacheLayoutDescriptor> parse_cache_layout(std::span<const std::byte> bytes);
/// The same checks on a descriptor already in memory.
Status validate_cache_layout(const CacheLayoutDescriptor& layout);

/// Whether pages of `remote` can move to or from `local` byte for byte: same kind, dtype,
/// layout, scale mode, page size, heads, head_dim and token record size. The first mismatch is
/// refused (`invalid_argument`) naming the field and both values.
Status check_layout_compatible(const CacheLayoutDescriptor& local, const CacheLayoutDescriptor& remote);

/// Bytes of one full page in each array (K and V alike; scale arrays: page_bytes_of_scales).
std::int64_t page_data_bytes(const CacheLayoutDescriptor& layout) noexcept;
/// Bytes of one full page of a per-token scale array (0 without per-token scales).
std::int64_t page_scale_bytes(const CacheLayoutDescriptor& layout) noexcept;
/// Bytes one request of `num_tokens` tokens moves (its filled slots, every array).
std::int64_t request_transfer_bytes(const CacheLayoutDescriptor& layout, std::int64_t num_tokens) noexcept;

/// Entries build_transfer_list may write for a request of `num_pages` pages (before merging).
std::int64_t transfer_list_capacity(const CacheLayoutDescriptor& layout, std::int32_t num_pages) noexcept;

struct TransferListArguments {
  CacheLayoutDescriptor src;              ///< the cache the bytes are read from
  CacheLayoutDescriptor dst;              ///< the cache they land in
  std::span<const PageId> src_pages;      ///< the request's pages in src, in sequence order
  std::span<const PageId> dst_pages;      ///< the pages reserved for it in dst, same order
  std::int64_t num_tokens = 0;            ///< (pages - 1) * page_size < num_tokens <= pages * page_size
};

/// The request's transfer list into `out` (at least transfer_list_capacity entries): array by
/// array (K, V, K scales, V scales), page by page, one entry per page piece, an entry merged
/// into the previous one when both its source and destination continue it within the same
/// array (or both end where it starts: pages in descending order on both sides). Returns the entry count. Refuses (nothing written past the count, which is then 0):
/// incompatible layouts (check_layout_compatible), page counts that do not fit num_tokens,
/// ids outside [1, num_pages) of their cache (page 0 is the guard page), a page listed twice
/// on either side, a short `out`.
Result<std::int64_t> build_transfer_list(const TransferListArguments& arguments, std::span<TransferEntry> out);

/// The fewest entries that move the same bytes as `entries` (any order; pieces that do not
/// overlap on either side), in place: sorted by source address, an entry merged into the
/// previous one when its source and its destination both continue it. That is the minimum for
/// any layout (two pieces can be one entry only where they touch on both sides), and it merges
/// across arrays, which build_transfer_list does not: a combined K/V allocation's run of pages
/// (K, V, K, V, ...) becomes one entry. Returns the count; the entries past it are unspecified.
std::int64_t coalesce_transfer_list(std::span<TransferEntry> entries) noexcept;

/// The memory to register with a transfer engine for this cache, once: the arrays, merged
/// where they overlap or touch (a combined K/V allocation is one region). Returns the count.
std::int32_t registration_regions(const CacheLayoutDescriptor& layout, std::span<CacheArray, 4> out) noexcept;

}  // namespace kv
SLIMSERVE_NAMESPACE_END
