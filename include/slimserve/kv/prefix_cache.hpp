#pragma once
/// \file
/// \brief Prefix cache over a PagePool: full pages indexed by a chained hash of (parent,
/// token ids, extra keys), hits confirmed by comparing the stored tokens.
///
/// A page's identity is its whole prefix: the entry records the exact parent page (as a
/// handle), the page's tokens and the extra keys (tenant / cache salt, adapter id), and a
/// lookup compares all three at every level, so a hash collision can cost a probe but never
/// produce a wrong hit, and different salts never share a page. Unreferenced cached pages sit
/// on the pool's LRU list and are evicted (leaf pages first) only when no free page is left;
/// eviction gives the page a new owner and therefore a new tag.
///
/// Fixed memory: one entry per page, an open-addressing table of 2x the pages, and
/// `num_pages * page_size` stored tokens; no allocation per lookup or insert.
/// Thread safety: none (see SharedPagePool).

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "slimserve/config.hpp"
#include "slimserve/kv/page_pool.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

using TokenId = std::int32_t;
using BlockHash = std::uint64_t;

/// What besides the tokens decides whether two prefixes may share pages.
struct CacheKeyExtras {
  std::uint64_t cache_salt = 0;  ///< tenant / per-user salt: different salts never share
  std::uint64_t adapter_id = 0;  ///< LoRA adapter (0 = base model)
  friend constexpr bool operator==(const CacheKeyExtras&, const CacheKeyExtras&) = default;
};

struct PrefixCacheStats {
  std::uint64_t hit_pages = 0;     ///< pages served from the cache
  std::uint64_t lookups = 0;       ///< match_prefix calls
  std::uint64_t misses = 0;        ///< match_prefix calls that stopped before the last full page
  std::uint64_t inserted_pages = 0;
  std::uint64_t evictions = 0;     ///< cached pages taken back by the pool
  std::int32_t indexed_pages = 0;  ///< pages currently in the index (referenced or not)
  PagePoolCounts pool;             ///< free / used / cached (evictable) / retired pages
};

struct PrefixCacheOptions {
  std::int32_t page_size = 0;   ///< tokens per page
  std::uint64_t hash_seed = 0;  ///< mixes into every hash (set per deployment against probing)
  /// Keeps only the low bits of every hash (1..64). Tests lower it to force collisions,
  /// which must cost probes and never a wrong hit.
  int hash_bits = 64;
};

class PrefixCache final : public EvictionListener {
 public:
  /// A cache indexing `pool`'s pages. It registers itself as the pool's eviction listener and
  /// keeps a pointer to the pool: the pool must stay where it is (not be moved) while the cache
  /// exists, and the cache is not movable either (it is returned by pointer).
  static Result<std::unique_ptr<PrefixCache>> create(PagePool& pool,
                                                     const PrefixCacheOptions& options);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  /// The longest cached prefix of `tokens` in whole pages: for each hit page takes a
  /// reference (the caller owns it, as if allocated) and writes its handle to `out`. Returns
  /// the number of pages matched (the first `matched * page_size` tokens are cached). `out`
  /// needs room for `tokens.size() / page_size` handles. To keep the last token for the
  /// forward pass, pass all tokens but the last.
  Result<std::int32_t> match_prefix(std::span<const TokenId> tokens, const CacheKeyExtras& extras,
                                    std::span<PageHandle> out);

  /// Indexes the full pages of a sequence: `pages[i]` holds tokens
  /// `[i*page_size, (i+1)*page_size)`; a trailing partial page is ignored. A page whose
  /// content is already cached under another page is left out (the request keeps it as a
  /// private page). Returns how many of `pages` are now in the index. All handles must be live.
  Result<std::int32_t> insert(std::span<const TokenId> tokens, const CacheKeyExtras& extras,
                              std::span<const PageHandle> pages);

  /// The chained hash of one page: what the index is keyed by (exposed for tests and tools).
  BlockHash chain_hash(BlockHash parent, std::span<const TokenId> page_tokens) const noexcept;
  /// The hash a sequence's first page chains from.
  BlockHash root_hash(const CacheKeyExtras& extras) const noexcept;

  PrefixCacheStats stats() const noexcept;
  std::int32_t page_size() const noexcept { return page_size_; }
  /// Whether `page` is in the index.
  bool is_indexed(PageId page) const noexcept {
    return page >= 0 && page < static_cast<PageId>(entries_.size()) && entries_[page].indexed;
  }
  /// Audit (O(num_pages)): the table and the entries agree with each other and with the pool.
  Status check_invariants() const;

  void on_page_evicted(PageId page) override;

 private:
  struct Entry {
    BlockHash hash = 0;
    PageHandle parent{};  // the cached page before this one (id -1 for a first page)
    PageTag tag = 0;      // the page's tag when indexed (constant while indexed)
    CacheKeyExtras extras{};
    bool indexed = false;
  };
  PrefixCache(PagePool& pool, const PrefixCacheOptions& options);
  // The indexed page with this exact identity, or -1.
  PageId find(BlockHash hash, PageHandle parent, const CacheKeyExtras& extras,
              std::span<const TokenId> page_tokens) const noexcept;
  void table_insert(PageId page) noexcept;
  void table_erase(PageId page) noexcept;
  std::span<const TokenId> stored_tokens(PageId page) const noexcept;

  PagePool* pool_;
  std::int32_t page_size_;
  std::uint64_t hash_seed_;
  std::uint64_t hash_mask_;
  std::vector<Entry> entries_;     // [num_pages]
  std::vector<TokenId> tokens_;    // [num_pages, page_size]
  std::vector<PageId> table_;      // open addressing, -1 = empty; size a power of two
  std::uint64_t table_mask_ = 0;
  std::int32_t indexed_pages_ = 0;
  std::uint64_t hit_pages_ = 0;
  std::uint64_t lookups_ = 0;
  std::uint64_t misses_ = 0;
  std::uint64_t inserted_pages_ = 0;
  std::uint64_t evictions_ = 0;
};

}  // namespace kv
SLIMSERVE_NAMESPACE_END
