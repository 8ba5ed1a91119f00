// PagePool: the out-of-line parts (creation, bulk calls, eviction, error messages, audits).
#include "slimserve/kv/page_pool.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "host_allocation.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

namespace {
// Pool epochs: the highest tag any destroyed pool of this process issued, and the live pools'
// published highest tags. A new pool starts its tags above all of them, so no handle of an
// earlier pool matches one of its pages.
struct PoolRegistry {
  std::mutex mutex;
  PageTag destroyed_high = 0;                    // guarded by mutex
  std::vector<std::atomic<PageTag>*> live;       // guarded by mutex
};
PoolRegistry& registry() {
  static PoolRegistry instance;
  return instance;
}
// A pool needs room for many owners per page; when fewer tags than this are left above the
// high-water mark, the process's tag space starts over at 0 (after ~4 billion issued tags).
constexpr PageTag min_tag_headroom = PageTag{1} << 24;

const char* state_name(PageState state) {
  switch (state) {
    case PageState::free: return "free";
    case PageState::in_use: return "in use";
    case PageState::cached: return "cached (unreferenced)";
    case PageState::retired: return "retired";
    case PageState::guard: return "the guard page";
  }
  return "unknown";
}
}  // namespace

Result<PagePool> PagePool::create(const PagePoolOptions& options) {
  if (options.num_pages < 2) {
    return make_status(StatusCode::invalid_argument, "num_pages must be >= 2 (page 0 is the ",
                       "guard page), got ", options.num_pages);
  }
  if (options.max_tag <= never_owned_tag) {
    return make_status(StatusCode::invalid_argument, "max_tag must be >= 1, got ",
                       options.max_tag);
  }
  const auto n = static_cast<std::size_t>(options.num_pages);
  const std::uint64_t bytes = n * (sizeof(PageMeta) + 2 * sizeof(PageId));
  SLIMSERVE_RETURN_IF_ERROR(detail::check_host_bytes(bytes, "PagePool"));
  PagePool pool;
  Status made = detail::allocate_or_refuse("PagePool", bytes, [&] {
    pool.meta_.resize(n);
    pool.free_stack_.resize(n);
    pool.dirty_.reserve(n);
    pool.published_high_ = std::make_unique<std::atomic<PageTag>>(0);
  });
  if (!made.ok()) return made;
  {
    PoolRegistry& pools = registry();
    std::lock_guard<std::mutex> lock(pools.mutex);
    PageTag high = pools.destroyed_high;
    for (const std::atomic<PageTag>* live : pools.live) {
      high = std::max(high, live->load(std::memory_order_relaxed));
    }
    pool.tag_base_ = high == 0 ? 0 : high + 1;  // the first pool of a process starts at 0
    if (pool.tag_base_ > std::numeric_limits<PageTag>::max() - min_tag_headroom) {
      pool.tag_base_ = 0;  // the process's tag space is used up: start over
    }
    pool.tag_bound_ = pool.tag_base_;
    pool.published_high_->store(pool.tag_base_, std::memory_order_relaxed);
    made = detail::allocate_or_refuse("PagePool", sizeof(void*), [&] {
      pools.live.push_back(pool.published_high_.get());
    });
    if (!made.ok()) {
      pool.published_high_.reset();  // not registered: nothing to publish
      return made;
    }
  }
  pool.max_tag_ = options.max_tag > std::numeric_limits<PageTag>::max() - pool.tag_base_
                      ? std::numeric_limits<PageTag>::max()
                      : pool.tag_base_ + options.max_tag;
  for (PageMeta& m : pool.meta_) m.tag = pool.tag_base_;
  pool.meta_[guard_page_id].state = PageState::guard;
  pool.meta_[guard_page_id].tag = guard_page_tag;
  // Stack top = lowest id, so a fresh pool hands out pages 1, 2, 3, ...
  for (PageId page = options.num_pages - 1; page >= 1; --page) {
    pool.free_stack_[pool.free_count_++] = page;
  }
  pool.mark_all_dirty();  // the device array starts out unknown
  return pool;
}

void PagePool::publish_tag_high_water() const noexcept {
  if (published_high_ == nullptr) return;  // moved from
  PoolRegistry& pools = registry();
  std::lock_guard<std::mutex> lock(pools.mutex);
  PageTag highest = tag_base_;  // exact, so a re-created pool wastes no tags
  for (const PageMeta& m : meta_) highest = std::max(highest, m.tag);
  pools.destroyed_high = std::max(pools.destroyed_high, highest);
  std::erase(pools.live, published_high_.get());
}

PagePool::~PagePool() { publish_tag_high_water(); }

void PagePool::raise_tag_bound(PageTag tag) noexcept {
  tag_bound_ = tag > std::numeric_limits<PageTag>::max() - tag_bound_step
                   ? std::numeric_limits<PageTag>::max()
                   : tag + tag_bound_step;
  published_high_->store(tag_bound_, std::memory_order_relaxed);
}

PagePool& PagePool::operator=(PagePool&& other) noexcept {
  if (this != &other) {
    publish_tag_high_water();  // the pool being replaced is gone: later pools start above it
    meta_ = std::move(other.meta_);
    published_high_ = std::move(other.published_high_);
    tag_bound_ = other.tag_bound_;
    free_stack_ = std::move(other.free_stack_);
    dirty_ = std::move(other.dirty_);
    other.meta_.clear();
    free_count_ = other.free_count_;
    used_count_ = other.used_count_;
    lru_count_ = other.lru_count_;
    retired_count_ = other.retired_count_;
    lru_head_ = other.lru_head_;
    lru_tail_ = other.lru_tail_;
    max_tag_ = other.max_tag_;
    tag_base_ = other.tag_base_;
    last_writer_ = other.last_writer_;
    listener_ = other.listener_;
    change_epoch_ = other.change_epoch_;
  }
  return *this;
}

Status PagePool::handle_error(PageHandle page, const char* action) const {
  if (!in_range(page.id)) {
    return make_status(StatusCode::out_of_range, action, ": page id ", page.id,
                       " outside [0, ", num_pages(), ")");
  }
  const PageMeta& m = meta_[page.id];
  if (m.state == PageState::guard) {
    return make_status(StatusCode::invalid_argument, action, ": page ", page.id,
                       " is the guard page; it is never owned");
  }
  if (m.tag != page.tag) {
    return make_status(StatusCode::stale_handle, action, ": page ", page.id, " has tag ", m.tag,
                       ", the handle has tag ", page.tag,
                       page.tag <= tag_base_ ? " (the handle is not from this pool: an earlier "
                                               "pool's, or never issued)"
                                             : " (the page has had another owner)");
  }
  if (m.state == PageState::in_use) {
    return make_status(StatusCode::internal, action, ": page ", page.id, " is live");
  }
  return make_status(StatusCode::failed_precondition, action, ": page ", page.id, " (tag ",
                     page.tag, ") is ", state_name(m.state),
                     ", it has no reference left (double free or reference-count underflow)");
}

Status PagePool::validate(PageHandle page) const {
  if (is_live(page)) return {};
  return handle_error(page, "validate");
}

Status PagePool::allocate(std::span<PageHandle> out, WriterId writer) {
  const auto wanted = static_cast<std::int64_t>(out.size());
  if (wanted > available_pages()) {
    return make_status(StatusCode::resource_exhausted, "need ", wanted, " pages; ", free_count_,
                       " free + ", lru_count_, " evictable = ", available_pages(), " available (",
                       used_count_, " in use, ", retired_count_, " retired, of ", num_pages(),
                       "); nothing was taken");
  }
  std::size_t i = 0;
  // The common case: the free list covers the request, no eviction check per page.
  const std::size_t from_free = std::min<std::size_t>(out.size(), free_count_);
  for (; i < from_free; ++i) out[i] = take_page(free_stack_[--free_count_], writer);
  for (; i < out.size(); ++i) out[i] = take_page(pop_available(), writer);
  return {};
}

Status PagePool::release(std::span<const PageHandle> pages) {
  // Pass 1 drops references without freeing; on any error it restores what it dropped, so a
  // duplicate handle with too few references is caught as well as a stale one.
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const PageHandle page = pages[i];
    const bool ok = in_range(page.id) && meta_[page.id].tag == page.tag &&
                    meta_[page.id].state == PageState::in_use && meta_[page.id].refs > 0;
    if (!ok) [[unlikely]] {
      for (std::size_t j = 0; j < i; ++j) ++meta_[pages[j].id].refs;
      if (is_live(page)) {  // live but its references are used up earlier in this call
        return make_status(StatusCode::failed_precondition, "release: page ", page.id,
                           " appears more often in the batch than it has references (",
                           "reference-count underflow); nothing was released");
      }
      return handle_error(page, "release");
    }
    --meta_[page.id].refs;
  }
  // Pass 2 frees pages that reached zero (each once: the state changes on the first visit).
  for (const PageHandle page : pages) {
    PageMeta& m = meta_[page.id];
    if (m.refs == 0 && m.state == PageState::in_use) drop_last_reference(page.id);
  }
  return {};
}

Result<AppendTarget> PagePool::prepare_append(PageHandle last_page, WriterId writer) {
  if (!is_live(last_page)) return handle_error(last_page, "prepare_append");
  const PageMeta& m = meta_[last_page.id];
  if (m.writer != no_writer && m.writer != writer) {
    return make_status(StatusCode::failed_precondition, "prepare_append: page ", last_page.id,
                       " is writable by request ", m.writer, ", not by ", writer,
                       " (the caller does not hold it)");
  }
  if (m.refs == 1 && !m.registered) {
    set_writer(last_page.id, writer);
    return AppendTarget{last_page, PageHandle{}, false};
  }
  Result<PageHandle> fresh = allocate();
  if (!fresh.ok()) return fresh.status();
  set_writer(fresh->id, writer);
  // Cannot fail: last_page was validated and still holds the caller's reference.
  Status dropped = release(last_page);
  if (!dropped.ok()) return dropped;
  return AppendTarget{*fresh, last_page, true};
}

Status PagePool::grant_write(PageHandle page, WriterId writer) {
  if (!is_live(page)) return handle_error(page, "grant_write");
  const PageMeta& m = meta_[page.id];
  if (writer == no_writer) {
    return make_status(StatusCode::invalid_argument, "grant_write: page ", page.id,
                       ": no_writer is not a request (use revoke_write)");
  }
  if (m.refs != 1 || m.registered) {
    return make_status(StatusCode::failed_precondition, "grant_write: page ", page.id, " has ",
                       m.refs, m.registered ? " references and is in the prefix cache"
                                            : " references",
                       "; only a sole holder of an unindexed page may write it (copy it first: "
                       "prepare_append)");
  }
  if (m.writer != no_writer && m.writer != writer) {
    return make_status(StatusCode::failed_precondition, "grant_write: page ", page.id,
                       " is writable by request ", m.writer, ", not by ", writer);
  }
  set_writer(page.id, writer);
  return {};
}

Status PagePool::revoke_write(PageHandle page) {
  if (!is_live(page)) return handle_error(page, "revoke_write");
  set_writer(page.id, no_writer);
  return {};
}

PageId PagePool::pop_available() noexcept {
  if (free_count_ > 0) return free_stack_[--free_count_];
  // Evict: the oldest unreferenced cached page that no other cached page extends (a leaf), so
  // a prefix is not cut in front of pages that could still hit; the oldest page otherwise.
  PageId victim = lru_head_;
  PageId candidate = lru_head_;
  for (int scanned = 0; candidate != -1 && scanned < leaf_scan_limit; ++scanned) {
    if (meta_[candidate].cached_children == 0) {
      victim = candidate;
      break;
    }
    candidate = meta_[candidate].lru_next;
  }
  lru_remove(victim);
  unregister(victim);
  return victim;
}

void PagePool::unlink_parent(PageId page) noexcept {
  const PageHandle parent = meta_[page].cache_parent;
  // The parent link is a handle: if the parent has had a new owner since, it is not touched.
  if (in_range(parent.id) && meta_[parent.id].tag == parent.tag && meta_[parent.id].registered &&
      meta_[parent.id].cached_children > 0) {
    --meta_[parent.id].cached_children;
  }
  meta_[page].cache_parent = PageHandle{};
}

void PagePool::link_parent(PageId page, PageHandle parent) noexcept {
  if (in_range(parent.id) && parent.id != guard_page_id && meta_[parent.id].tag == parent.tag &&
      meta_[parent.id].registered) {
    meta_[page].cache_parent = parent;
    ++meta_[parent.id].cached_children;
  }
}

void PagePool::unregister(PageId page) noexcept {
  meta_[page].registered = false;
  unlink_parent(page);
  if (listener_ != nullptr) listener_->on_page_evicted(page);
}

Status PagePool::relink_cached(PageHandle page, PageHandle parent) {
  if (!is_live(page)) return handle_error(page, "relink_cached");
  if (!meta_[page.id].registered) {
    return make_status(StatusCode::failed_precondition, "relink_cached: page ", page.id,
                       " is not in the prefix cache");
  }
  unlink_parent(page.id);
  link_parent(page.id, parent);
  return {};
}

void PagePool::lru_push_back(PageId page) noexcept {
  PageMeta& m = meta_[page];
  m.lru_prev = lru_tail_;
  m.lru_next = -1;
  if (lru_tail_ != -1) {
    meta_[lru_tail_].lru_next = page;
  } else {
    lru_head_ = page;
  }
  lru_tail_ = page;
  ++lru_count_;
}

void PagePool::lru_remove(PageId page) noexcept {
  PageMeta& m = meta_[page];
  if (m.lru_prev != -1) {
    meta_[m.lru_prev].lru_next = m.lru_next;
  } else {
    lru_head_ = m.lru_next;
  }
  if (m.lru_next != -1) {
    meta_[m.lru_next].lru_prev = m.lru_prev;
  } else {
    lru_tail_ = m.lru_prev;
  }
  m.lru_prev = m.lru_next = -1;
  --lru_count_;
}

Status PagePool::register_cached(PageHandle page, PageHandle parent) {
  if (!is_live(page)) return handle_error(page, "register_cached");
  PageMeta& m = meta_[page.id];
  if (m.registered) {
    return make_status(StatusCode::failed_precondition, "register_cached: page ", page.id,
                       " is already in the prefix cache");
  }
  m.registered = true;
  m.cache_parent = PageHandle{};
  set_writer(page.id, no_writer);  // cached contents never change
  link_parent(page.id, parent);
  return {};
}

Status PagePool::acquire_cached(PageHandle page) {
  if (!in_range(page.id) || meta_[page.id].tag != page.tag || !meta_[page.id].registered) {
    if (is_live(page)) {
      return make_status(StatusCode::failed_precondition, "acquire_cached: page ", page.id,
                         " is not in the prefix cache");
    }
    return handle_error(page, "acquire_cached");
  }
  PageMeta& m = meta_[page.id];
  if (m.state == PageState::cached) {
    lru_remove(page.id);
    m.state = PageState::in_use;
    m.refs = 1;
    ++used_count_;
    return {};
  }
  return share(page);
}

PagePoolCounts PagePool::counts() const noexcept {
  return PagePoolCounts{free_count_, used_count_, lru_count_, retired_count_, num_pages()};
}

void PagePool::clear_dirty() noexcept {
  for (const PageId page : dirty_) meta_[page].dirty = false;
  dirty_.clear();
}

void PagePool::mark_all_dirty() {
  for (PageId page = 0; page < num_pages(); ++page) mark_dirty(page);
}

Status PagePool::check_invariants() const {
  const std::int32_t n = num_pages();
  std::vector<std::uint8_t> seen(static_cast<std::size_t>(n), 0);
  if (meta_[guard_page_id].state != PageState::guard || meta_[guard_page_id].tag != guard_page_tag) {
    return make_status(StatusCode::internal, "the guard page lost its state or tag");
  }
  for (std::int32_t i = 0; i < free_count_; ++i) {
    const PageId page = free_stack_[i];
    if (!in_range(page) || seen[page] != 0 || meta_[page].state != PageState::free) {
      return make_status(StatusCode::internal, "free list entry ", i, " (page ", page,
                         ") is out of range, listed twice or not free");
    }
    seen[page] = 1;
  }
  std::int32_t lru_seen = 0;
  PageId prev = -1;
  for (PageId page = lru_head_; page != -1; page = meta_[page].lru_next) {
    if (!in_range(page) || seen[page] != 0 || meta_[page].state != PageState::cached ||
        meta_[page].lru_prev != prev || !meta_[page].registered || meta_[page].refs != 0) {
      return make_status(StatusCode::internal, "LRU list broken at page ", page);
    }
    seen[page] = 1;
    prev = page;
    if (++lru_seen > n) return make_status(StatusCode::internal, "LRU list has a cycle");
  }
  if (prev != lru_tail_ || lru_seen != lru_count_) {
    return make_status(StatusCode::internal, "LRU tail/count disagree: counted ", lru_seen,
                       ", recorded ", lru_count_);
  }
  std::int32_t used = 0;
  std::int32_t retired = 0;
  std::int32_t dirty = 0;
  for (PageId page = 0; page < n; ++page) {
    const PageMeta& m = meta_[page];
    if (m.dirty) ++dirty;
    if (m.writer != no_writer && m.state != PageState::in_use) {
      return make_status(StatusCode::internal, "page ", page, " is ", state_name(m.state),
                         " but writable by ", m.writer);
    }
    if (m.tag > max_tag_ && page != guard_page_id) {
      return make_status(StatusCode::internal, "page ", page, " tag ", m.tag, " above max_tag");
    }
    switch (m.state) {
      case PageState::in_use:
        if (m.refs < 1) return make_status(StatusCode::internal, "page ", page, " in use, 0 refs");
        if (m.tag <= tag_base_) {
          return make_status(StatusCode::internal, "page ", page, " in use with tag ", m.tag,
                             " <= the pool's base ", tag_base_);
        }
        if (m.writer != no_writer && (m.refs != 1 || m.registered)) {
          return make_status(StatusCode::internal, "page ", page, " writable by ", m.writer,
                             " with ", m.refs, " references", m.registered ? ", cached" : "");
        }
        ++used;
        break;
      case PageState::retired:
        if (m.tag != max_tag_ || m.registered) {
          return make_status(StatusCode::internal, "retired page ", page, " below max_tag");
        }
        ++retired;
        break;
      case PageState::free:
      case PageState::cached:
        if (seen[page] == 0 || m.refs != 0) {
          return make_status(StatusCode::internal, "page ", page, " ", state_name(m.state),
                             " but not listed or still referenced");
        }
        if (m.state == PageState::free && m.registered) {
          return make_status(StatusCode::internal, "free page ", page, " still in the cache");
        }
        break;
      case PageState::guard:
        if (page != guard_page_id) return make_status(StatusCode::internal, "second guard page");
        break;
    }
  }
  if (used != used_count_ || retired != retired_count_ ||
      free_count_ + used + lru_count_ + retired + 1 != n) {
    return make_status(StatusCode::internal, "counts disagree: free ", free_count_, " used ", used,
                       "/", used_count_, " cached ", lru_count_, " retired ", retired, "/",
                       retired_count_, " total ", n);
  }
  if (dirty != static_cast<std::int32_t>(dirty_.size())) {
    return make_status(StatusCode::internal, "dirty flags disagree with the dirty list");
  }
  return {};
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
