// PrefixCache: chained hashing, exact confirmation, index maintenance on eviction.
#include "slimserve/kv/prefix_cache.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "host_allocation.hpp"
#include "slimserve/detail/mix64.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

namespace {

using ::slimserve::detail::mix64;

constexpr std::uint64_t hash_step(std::uint64_t state, std::uint64_t word) noexcept {
  return mix64(state ^ (word + 0x9E3779B97F4A7C15ull + (state << 6) + (state >> 2)));
}

}  // namespace

Result<std::unique_ptr<PrefixCache>> PrefixCache::create(PagePool& pool,
                                                         const PrefixCacheOptions& options) {
  if (options.page_size < 1) {
    return make_status(StatusCode::invalid_argument, "prefix cache page_size must be >= 1, got ",
                       options.page_size);
  }
  if (options.hash_bits < 1 || options.hash_bits > 64) {
    return make_status(StatusCode::invalid_argument, "hash_bits must be in 1..64, got ",
                       options.hash_bits);
  }
  const auto tokens = static_cast<std::uint64_t>(pool.num_pages()) * options.page_size;
  if (tokens > (std::uint64_t{1} << 34)) {
    return make_status(StatusCode::resource_exhausted, "prefix cache would store ", tokens,
                       " tokens (", pool.num_pages(), " pages of ", options.page_size, ")");
  }
  const auto pages = static_cast<std::uint64_t>(pool.num_pages());
  const std::uint64_t bytes = pages * sizeof(Entry) + tokens * sizeof(TokenId) +
                              std::bit_ceil(std::max<std::uint64_t>(2 * pages, 16)) * sizeof(PageId);
  SLIMSERVE_RETURN_IF_ERROR(detail::check_host_bytes(bytes, "PrefixCache"));
  std::unique_ptr<PrefixCache> cache;
  SLIMSERVE_RETURN_IF_ERROR(detail::allocate_or_refuse("PrefixCache", bytes, [&] {
    cache.reset(new PrefixCache(pool, options));
  }));
  return cache;
}

PrefixCache::PrefixCache(PagePool& pool, const PrefixCacheOptions& options)
    : pool_(&pool),
      page_size_(options.page_size),
      hash_seed_(options.hash_seed),
      hash_mask_(options.hash_bits == 64 ? ~std::uint64_t{0}
                                         : (std::uint64_t{1} << options.hash_bits) - 1) {
  const auto pages = static_cast<std::size_t>(pool.num_pages());
  entries_.resize(pages);
  tokens_.resize(pages * static_cast<std::size_t>(page_size_));
  const std::size_t table_size = std::bit_ceil(std::max<std::size_t>(2 * pages, 16));
  table_.assign(table_size, -1);
  table_mask_ = table_size - 1;
  pool.set_eviction_listener(this);
}

PrefixCache::~PrefixCache() { pool_->set_eviction_listener(nullptr); }

BlockHash PrefixCache::root_hash(const CacheKeyExtras& extras) const noexcept {
  return hash_step(hash_step(mix64(hash_seed_ ^ 0x5bd1e9955bd1e995ull), extras.cache_salt),
                   extras.adapter_id) &
         hash_mask_;
}

BlockHash PrefixCache::chain_hash(BlockHash parent,
                                  std::span<const TokenId> page_tokens) const noexcept {
  std::uint64_t state = parent;
  std::size_t i = 0;
  for (; i + 1 < page_tokens.size(); i += 2) {  // two tokens per 64-bit word
    const auto word = static_cast<std::uint64_t>(static_cast<std::uint32_t>(page_tokens[i])) |
                      static_cast<std::uint64_t>(static_cast<std::uint32_t>(page_tokens[i + 1]))
                          << 32;
    state = hash_step(state, word);
  }
  if (i < page_tokens.size()) {
    state = hash_step(state, static_cast<std::uint32_t>(page_tokens[i]));
  }
  return hash_step(state, page_tokens.size()) & hash_mask_;
}

std::span<const TokenId> PrefixCache::stored_tokens(PageId page) const noexcept {
  return {tokens_.data() + static_cast<std::size_t>(page) * page_size_,
          static_cast<std::size_t>(page_size_)};
}

PageId PrefixCache::find(BlockHash hash, PageHandle parent, const CacheKeyExtras& extras,
                         std::span<const TokenId> page_tokens) const noexcept {
  for (std::uint64_t slot = hash & table_mask_;; slot = (slot + 1) & table_mask_) {
    const PageId page = table_[slot];
    if (page == -1) return -1;
    const Entry& entry = entries_[page];
    if (entry.hash == hash && entry.parent == parent && entry.extras == extras &&
        std::equal(page_tokens.begin(), page_tokens.end(), stored_tokens(page).begin())) {
      return page;
    }
  }
}

void PrefixCache::table_insert(PageId page) noexcept {
  std::uint64_t slot = entries_[page].hash & table_mask_;
  while (table_[slot] != -1) slot = (slot + 1) & table_mask_;
  table_[slot] = page;  // the table is twice the pages: there is always an empty slot
}

void PrefixCache::table_erase(PageId page) noexcept {
  std::uint64_t hole = entries_[page].hash & table_mask_;
  while (table_[hole] != page) hole = (hole + 1) & table_mask_;
  // Backward-shift deletion: move later entries of the probe run into the hole when their
  // home slot does not lie (cyclically) between the hole and their current slot.
  for (std::uint64_t next = (hole + 1) & table_mask_; table_[next] != -1;
       next = (next + 1) & table_mask_) {
    const std::uint64_t home = entries_[table_[next]].hash & table_mask_;
    const bool home_between = hole <= next ? (hole < home && home <= next)
                                           : (hole < home || home <= next);
    if (!home_between) {
      table_[hole] = table_[next];
      hole = next;
    }
  }
  table_[hole] = -1;
}

Result<std::int32_t> PrefixCache::match_prefix(std::span<const TokenId> tokens,
                                               const CacheKeyExtras& extras,
                                               std::span<PageHandle> out) {
  const std::size_t full_pages = tokens.size() / static_cast<std::size_t>(page_size_);
  if (out.size() < full_pages) {
    return make_status(StatusCode::invalid_argument, "match_prefix: room for ", out.size(),
                       " handles, ", tokens.size(), " tokens may match ", full_pages, " pages");
  }
  ++lookups_;
  BlockHash hash = root_hash(extras);
  PageHandle parent{};
  std::size_t matched = 0;
  for (; matched < full_pages; ++matched) {
    const auto page_tokens = tokens.subspan(matched * page_size_, page_size_);
    hash = chain_hash(hash, page_tokens);
    const PageId page = find(hash, parent, extras, page_tokens);
    if (page == -1) break;
    const PageHandle handle{page, entries_[page].tag};
    if (!pool_->acquire_cached(handle).ok()) break;  // cannot happen while indexed; be safe
    out[matched] = handle;
    parent = handle;
  }
  if (matched < full_pages) ++misses_;
  hit_pages_ += matched;
  return static_cast<std::int32_t>(matched);
}

Result<std::int32_t> PrefixCache::insert(std::span<const TokenId> tokens,
                                         const CacheKeyExtras& extras,
                                         std::span<const PageHandle> pages) {
  const std::size_t full_pages =
      std::min(tokens.size() / static_cast<std::size_t>(page_size_), pages.size());
  for (std::size_t i = 0; i < full_pages; ++i) {
    SLIMSERVE_RETURN_IF_ERROR(pool_->validate(pages[i]));
  }
  BlockHash hash = root_hash(extras);
  PageHandle parent{};
  std::int32_t indexed = 0;
  for (std::size_t i = 0; i < full_pages; ++i) {
    const PageHandle page = pages[i];
    const auto page_tokens = tokens.subspan(i * page_size_, page_size_);
    hash = chain_hash(hash, page_tokens);
    const PageId existing = find(hash, parent, extras, page_tokens);
    if (existing != -1) {  // already indexed: this page, or a twin the request does not hold
      if (existing == page.id) ++indexed;
      parent = PageHandle{existing, entries_[existing].tag};
      continue;
    }
    Entry& entry = entries_[page.id];
    if (entry.indexed) {
      // Already indexed along another chain of pages with the same contents (twins cached by
      // different requests). Its contents must be these tokens; otherwise the caller passed
      // the wrong ones.
      if (!(entry.extras == extras) ||
          !std::equal(page_tokens.begin(), page_tokens.end(), stored_tokens(page.id).begin())) {
        return make_status(StatusCode::invalid_argument, "insert: page ", page.id,
                           " is already cached with other contents (page ", i,
                           " of the sequence)");
      }
      // If its parent left the index (evicted while this page stayed held), adopt the new one
      // so lookups along this chain reach it again.
      const bool parent_gone = entry.parent.id != -1 &&
                               (!is_indexed(entry.parent.id) ||
                                entries_[entry.parent.id].tag != entry.parent.tag);
      if (parent_gone && entry.hash == hash) {
        SLIMSERVE_RETURN_IF_ERROR(pool_->relink_cached(page, parent));
        entry.parent = parent;
      }
      ++indexed;
      parent = page;
      continue;
    }
    SLIMSERVE_RETURN_IF_ERROR(pool_->register_cached(page, parent));
    entry = Entry{hash, parent, page.tag, extras, true};
    std::copy(page_tokens.begin(), page_tokens.end(),
              tokens_.begin() + static_cast<std::ptrdiff_t>(page.id) * page_size_);
    table_insert(page.id);
    ++indexed_pages_;
    ++inserted_pages_;
    ++indexed;
    parent = page;
  }
  return indexed;
}

void PrefixCache::on_page_evicted(PageId page) {
  if (!is_indexed(page)) return;
  table_erase(page);
  entries_[page].indexed = false;
  --indexed_pages_;
  ++evictions_;
}

PrefixCacheStats PrefixCache::stats() const noexcept {
  return PrefixCacheStats{hit_pages_, lookups_,       misses_,          inserted_pages_,
                          evictions_, indexed_pages_, pool_->counts()};
}

Status PrefixCache::check_invariants() const {
  std::int32_t in_table = 0;
  for (std::size_t slot = 0; slot < table_.size(); ++slot) {
    const PageId page = table_[slot];
    if (page == -1) continue;
    ++in_table;
    if (!is_indexed(page)) {
      return make_status(StatusCode::internal, "table slot ", slot, " holds unindexed page ", page);
    }
    if (find(entries_[page].hash, entries_[page].parent, entries_[page].extras,
             stored_tokens(page)) == -1) {
      return make_status(StatusCode::internal, "indexed page ", page, " cannot be found");
    }
  }
  if (in_table != indexed_pages_) {
    return make_status(StatusCode::internal, "table holds ", in_table, " pages, ", indexed_pages_,
                       " indexed");
  }
  for (PageId page = 0; page < static_cast<PageId>(entries_.size()); ++page) {
    const Entry& entry = entries_[page];
    if (entry.indexed != pool_->is_cache_registered(page)) {
      return make_status(StatusCode::internal, "page ", page, " indexed=", entry.indexed,
                         " but registered=", pool_->is_cache_registered(page));
    }
    if (entry.indexed && pool_->tag(page) != entry.tag) {
      return make_status(StatusCode::internal, "indexed page ", page, " changed its tag");
    }
  }
  return {};
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
