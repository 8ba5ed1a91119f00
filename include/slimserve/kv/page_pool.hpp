#pragma once
/// \file
/// \brief A fixed pool of KV-cache pages with reference counts and 32-bit generation tags.
///
/// Every page has a tag that changes each time the page gets a new owner (allocation from the
/// free list, or eviction of a cached page), and never when its reference count merely drops:
/// a page released into the prefix cache keeps its tag, so a later hit still matches. A
/// `PageHandle` is `(page id, tag)`; a handle whose tag differs from the page's current tag is
/// stale, and every call that takes a handle rejects it with StatusCode::stale_handle.
///
/// Page 0 is the guard page: never allocated, freed or cached, with the fixed tag
/// `guard_page_tag`. Page tables pad with it. Tags of real pages start at the pool's
/// `tag_base()` ("never owned") and every owner gets a higher tag. A page whose tag reached
/// `max_tag()` is retired when its last reference goes (it never gets another owner), so tags
/// never wrap.
///
/// Pool epochs: `tag_base()` is above every tag any pool of this process issued before this
/// one was created (pools destroyed since, and pools still alive), so a handle kept from an
/// earlier pool (a re-created pool: `pool = *PagePool::create(...)`) never matches a page of
/// this one. The first pool of a process starts at 0. Pools alive at the same time may issue
/// the same tags later: never mix their handles. After about 4 billion tags issued in one
/// process the tag space starts over at 0.
///
/// Write ownership: a page is either writable by exactly one request (its WriterId, see
/// page_access.hpp) or read-only. Only `allocate(..., writer)`, `grant_write` and
/// `prepare_append(..., writer)` grant the right, and only to a sole holder of a page the prefix
/// cache does not index; `share`, the release of the last reference, `register_cached`,
/// `revoke_write` and the copy-on-write move in `prepare_append` take it away at once. The
/// device tag array mirrors the writer, and the GPU check refuses writes by anyone else and
/// reads of a writable page by anyone else.
///
/// Thread safety: none. A PagePool is the single-threaded fast path; see SharedPagePool
/// (shared_page_pool.hpp) for a scheduler thread and a completion thread sharing one.
/// Hot calls (allocate, release, share) are O(1) (O(n) for n pages) and never allocate memory.

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "slimserve/config.hpp"
#include "slimserve/kv/page_access.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

/// `(page id, generation tag)`: what an owner keeps for each page it holds.
struct PageHandle {
  PageId id = -1;
  PageTag tag = 0;
  friend constexpr bool operator==(const PageHandle&, const PageHandle&) = default;
};

/// The guard page's handle: what page tables hold in padding entries (never inside a request's
/// pages: the builders and the device check refuse it there).
inline constexpr PageHandle guard_page{guard_page_id, guard_page_tag};

enum class PageState : std::uint8_t {
  free = 0,     ///< on the free list
  in_use = 1,   ///< reference count >= 1
  cached = 2,   ///< reference count 0, kept by the prefix cache, evictable (LRU)
  retired = 3,  ///< its tag reached max_tag; never reused
  guard = 4,    ///< page 0
};

struct PagePoolOptions {
  std::int32_t num_pages = 0;  ///< including the guard page: usable pages = num_pages - 1
  /// Owners a page may have before it retires: its tags run from tag_base() + 1 to
  /// tag_base() + max_tag (capped at the largest PageTag). Lower it in tests to reach
  /// retirement quickly.
  PageTag max_tag = std::numeric_limits<PageTag>::max();
};

/// What `prepare_append` tells the caller to do before writing into a request's last page.
struct AppendTarget {
  PageHandle page;       ///< the page to append into (the request's new last page)
  PageHandle copy_from;  ///< when needs_copy: copy the filled tokens of this page into `page`
  bool needs_copy = false;
};

struct PagePoolCounts {
  std::int32_t free = 0;     ///< on the free list
  std::int32_t used = 0;     ///< reference count >= 1
  std::int32_t cached = 0;   ///< unreferenced, kept by the prefix cache (evictable)
  std::int32_t retired = 0;  ///< tag exhausted
  std::int32_t total = 0;    ///< num_pages, guard page included
};

/// Told when the pool takes a cached page back (eviction, or retirement of a cached page), so
/// the prefix cache can drop its index entry. Implemented by PrefixCache.
class EvictionListener {
 public:
  virtual void on_page_evicted(PageId page) = 0;

 protected:
  ~EvictionListener() = default;
};

class PagePool {
 public:
  static Result<PagePool> create(const PagePoolOptions& options);

  PagePool(PagePool&&) noexcept = default;
  PagePool& operator=(PagePool&& other) noexcept;
  /// Publishes the highest tag this pool issued, so pools created later start above it.
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // --- Ownership ---------------------------------------------------------------------------
  /// One page with reference count 1 and a fresh tag. Evicts an unreferenced cached page when
  /// the free list is empty.
  Result<PageHandle> allocate();
  /// `out.size()` pages, all or nothing: on shortage nothing is taken and the error names the
  /// numbers (StatusCode::resource_exhausted). With `writer`, the pages are born writable by it.
  Status allocate(std::span<PageHandle> out, WriterId writer = no_writer);
  /// Drops one reference. At zero the page goes to the prefix cache's LRU list when it is
  /// cached, otherwise back to the free list (or into retirement at max_tag).
  Status release(PageHandle page);
  /// Drops one reference of each handle, all or nothing: a bad handle anywhere (stale, out of
  /// range, more releases than references) changes nothing.
  Status release(std::span<const PageHandle> pages);
  /// Adds a reference (a forked sequence or a shared prefix now also holds the page). A shared
  /// page is read-only: its write right, if any, is revoked.
  Status share(PageHandle page);
  /// Before appending into `last_page`: when it is shared (or cached: its contents must not
  /// change), allocates a fresh page, drops the caller's reference to `last_page` and asks the
  /// caller to copy the filled part. Otherwise returns `last_page` itself. The returned page
  /// becomes writable by `writer` (when given); the old page stays read-only. Refused when
  /// `last_page` is writable by another request (the caller does not hold it). On failure
  /// nothing changes.
  Result<AppendTarget> prepare_append(PageHandle last_page, WriterId writer = no_writer);

  // --- Write ownership ---------------------------------------------------------------------
  /// A new request identity (never 0, not reused within 2^32 - 1 calls).
  WriterId new_writer() noexcept {
    if (++last_writer_ == no_writer) ++last_writer_;
    return last_writer_;
  }
  /// Makes `page` writable by `writer`: the caller must be its only holder, and the prefix
  /// cache must not index it (failed_precondition otherwise; use prepare_append).
  Status grant_write(PageHandle page, WriterId writer);
  /// Makes `page` read-only (for example while a step that reads it is still in flight on
  /// another request's behalf).
  Status revoke_write(PageHandle page);
  WriterId writer(PageId page) const noexcept { return meta_[page].writer; }

  // --- Queries -----------------------------------------------------------------------------
  /// ok when `page` is a live handle (in use, current tag); otherwise the reason.
  Status validate(PageHandle page) const;
  bool is_live(PageHandle page) const noexcept {
    return in_range(page.id) && meta_[page.id].tag == page.tag &&
           meta_[page.id].state == PageState::in_use;
  }
  std::int32_t num_pages() const noexcept { return static_cast<std::int32_t>(meta_.size()); }
  /// The largest tag a page of this pool may carry (absolute, tag_base() included).
  PageTag max_tag() const noexcept { return max_tag_; }
  /// The tag of this pool's never-owned pages; every tag it issues is above it.
  PageTag tag_base() const noexcept { return tag_base_; }
  PageTag tag(PageId page) const noexcept { return meta_[page].tag; }
  std::int32_t ref_count(PageId page) const noexcept { return meta_[page].refs; }
  PageState state(PageId page) const noexcept { return meta_[page].state; }
  bool is_cache_registered(PageId page) const noexcept { return meta_[page].registered; }
  PagePoolCounts counts() const noexcept;
  /// Pages an allocation can get right now: free plus evictable cached pages.
  std::int32_t available_pages() const noexcept { return free_count_ + lru_count_; }
  /// Full audit (O(num_pages)): lists, counts and states agree. For tests and fuzzing.
  Status check_invariants() const;

  // --- Device tag mirroring ----------------------------------------------------------------
  /// Pages whose tag changed since the last clear_dirty(), each listed once. A DeviceTagArray
  /// uploads exactly these entries.
  std::span<const PageId> dirty_pages() const noexcept { return dirty_; }
  void clear_dirty() noexcept;
  /// Marks every page dirty (for example after the device array was lost).
  void mark_all_dirty();
  /// The pool's epoch: every change of a tag or write owner advances it (never 0 once the pool
  /// exists). DeviceTagArray::sync records the epoch it uploaded; a table built at a later
  /// epoch (PageTableShape::pool) was built against changes the device has not seen, and the
  /// tag check refuses it.
  std::uint64_t change_epoch() const noexcept { return change_epoch_; }

  // --- Prefix-cache support (used by PrefixCache) --------------------------------------------
  void set_eviction_listener(EvictionListener* listener) noexcept { listener_ = listener; }
  /// Marks a live page as indexed by the prefix cache; `parent` (may be invalid) is the cached
  /// page before it in its sequence, which stays non-evictable-first while this one is cached.
  Status register_cached(PageHandle page, PageHandle parent);
  /// Moves a cached page under a new parent (its old parent left the cache).
  Status relink_cached(PageHandle page, PageHandle parent);
  /// Takes a reference to a cached page (a prefix hit): unreferenced pages leave the LRU list.
  /// The tag does not change.
  Status acquire_cached(PageHandle page);

 private:
  struct PageMeta {
    PageTag tag = never_owned_tag;
    WriterId writer = no_writer;  // the request allowed to write the page, or no_writer
    std::int32_t refs = 0;
    std::int32_t lru_prev = -1;
    std::int32_t lru_next = -1;
    std::int32_t cached_children = 0;  // cached pages whose parent this is (leaf when 0)
    PageHandle cache_parent{};
    PageState state = PageState::free;
    bool registered = false;  // indexed by the prefix cache
    bool dirty = false;       // listed in dirty_
  };
  // Eviction looks this far into the LRU list for a leaf before taking the oldest page.
  static constexpr int leaf_scan_limit = 32;

  PagePool() = default;
  bool in_range(PageId page) const noexcept { return page >= 0 && page < num_pages(); }
  Status handle_error(PageHandle page, const char* action) const;
  PageHandle take_page(PageId page, WriterId writer) noexcept;  // a new owner: bump the tag
  void set_writer(PageId page, WriterId writer) noexcept {
    if (meta_[page].writer != writer) {
      meta_[page].writer = writer;
      mark_dirty(page);
    }
  }
  void publish_tag_high_water() const noexcept;
  void raise_tag_bound(PageTag tag) noexcept;
  PageId pop_available() noexcept;             // free list first, else evict
  void drop_last_reference(PageId page) noexcept;
  void unregister(PageId page) noexcept;
  void unlink_parent(PageId page) noexcept;
  void link_parent(PageId page, PageHandle parent) noexcept;
  void lru_push_back(PageId page) noexcept;
  void lru_remove(PageId page) noexcept;
  void mark_dirty(PageId page) {
    ++change_epoch_;
    if (!meta_[page].dirty) {
      meta_[page].dirty = true;
      dirty_.push_back(page);  // capacity num_pages reserved: never reallocates
    }
  }

  std::vector<PageMeta> meta_;
  std::vector<PageId> free_stack_;  // [num_pages], the first free_count_ entries are free pages
  std::vector<PageId> dirty_;
  std::int32_t free_count_ = 0;
  std::int32_t used_count_ = 0;
  std::int32_t lru_count_ = 0;
  std::int32_t retired_count_ = 0;
  std::int32_t lru_head_ = -1;  // oldest unreferenced cached page
  std::int32_t lru_tail_ = -1;
  PageTag max_tag_ = std::numeric_limits<PageTag>::max();
  PageTag tag_base_ = 0;
  // Every tag issued so far is <= tag_bound_, which is published (registered with the process's
  // pool registry while this pool lives, stable across moves) so pools created later start
  // above it. Raised in steps of tag_bound_step: the hot path only compares.
  static constexpr PageTag tag_bound_step = 4096;
  PageTag tag_bound_ = 0;
  std::unique_ptr<std::atomic<PageTag>> published_high_;
  WriterId last_writer_ = no_writer;
  EvictionListener* listener_ = nullptr;
  std::uint64_t change_epoch_ = 0;
};

// --- Hot paths, inline ---------------------------------------------------------------------

inline PageHandle PagePool::take_page(PageId page, WriterId writer) noexcept {
  PageMeta& m = meta_[page];
  ++m.tag;
  if (m.tag > tag_bound_) [[unlikely]] raise_tag_bound(m.tag);  // once per 4096 tags
  m.writer = writer;
  m.refs = 1;
  m.state = PageState::in_use;
  m.cached_children = 0;
  m.cache_parent = PageHandle{};
  ++used_count_;
  mark_dirty(page);
  return PageHandle{page, m.tag};
}

inline Result<PageHandle> PagePool::allocate() {
  if (free_count_ > 0) return take_page(free_stack_[--free_count_], no_writer);
  if (lru_count_ == 0) {
    return make_status(StatusCode::resource_exhausted, "no free page: ", free_count_, " free, ",
                       lru_count_, " evictable, ", used_count_, " in use, ", retired_count_,
                       " retired, of ", num_pages());
  }
  return take_page(pop_available(), no_writer);
}

inline Status PagePool::release(PageHandle page) {
  if (!is_live(page)) [[unlikely]] return handle_error(page, "release");
  PageMeta& m = meta_[page.id];
  if (--m.refs == 0) drop_last_reference(page.id);
  return {};
}

inline void PagePool::drop_last_reference(PageId page) noexcept {
  PageMeta& m = meta_[page];
  --used_count_;
  set_writer(page, no_writer);  // nobody writes a page nobody holds
  if (m.tag == max_tag_) {  // no further owner may get this page: retire it
    if (m.registered) unregister(page);
    m.state = PageState::retired;
    ++retired_count_;
  } else if (m.registered) {
    m.state = PageState::cached;
    lru_push_back(page);
  } else {
    m.state = PageState::free;
    free_stack_[free_count_++] = page;
  }
}

inline Status PagePool::share(PageHandle page) {
  if (!is_live(page)) [[unlikely]] return handle_error(page, "share");
  PageMeta& m = meta_[page.id];
  if (m.refs == std::numeric_limits<std::int32_t>::max()) [[unlikely]] {
    return make_status(StatusCode::failed_precondition, "share: page ", page.id,
                       " reference count would overflow");
  }
  ++m.refs;
  set_writer(page.id, no_writer);  // a shared page is read-only
  return {};
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
