#pragma once
/// \file
/// \brief Sharing one PagePool (and its PrefixCache) between a scheduler thread and a
/// completion thread.
///
/// Threading model: PagePool and PrefixCache are single-threaded (no atomics, no locks: the
/// fast path). When more than one thread touches them, every call goes through one
/// SharedPagePool:
///  * `with_lock(fn)` runs `fn(pool, cache)` under the pool mutex, so a scheduler step takes
///    the lock once for all its calls;
///  * a completion thread (the one that learns a request finished or a transfer landed) does
///    not touch the pool: it posts the pages to release with `post_release`, which only takes a
///    short queue lock; the scheduler applies them with `drain_releases()` at the start of its
///    next step. This is also the safe order for GPU work: post a request's pages only after
///    the work that reads or writes them is known to be complete.

#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "slimserve/config.hpp"
#include "slimserve/kv/page_pool.hpp"
#include "slimserve/kv/prefix_cache.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

class SharedPagePool {
 public:
  /// `pool` (and `cache`, optional, which must index `pool`) outlive this object.
  explicit SharedPagePool(PagePool& pool, PrefixCache* cache = nullptr)
      : pool_(&pool), cache_(cache) {}
  SharedPagePool(const SharedPagePool&) = delete;
  SharedPagePool& operator=(const SharedPagePool&) = delete;

  /// Runs `fn(PagePool&, PrefixCache*)` with the pool locked and returns what it returns.
  template <class Fn>
  decltype(auto) with_lock(Fn&& fn) {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    return std::forward<Fn>(fn)(*pool_, cache_);
  }

  Result<PageHandle> allocate() {
    return with_lock([](PagePool& pool, PrefixCache*) { return pool.allocate(); });
  }
  Status allocate(std::span<PageHandle> out) {
    return with_lock([out](PagePool& pool, PrefixCache*) { return pool.allocate(out); });
  }
  Status release(std::span<const PageHandle> pages) {
    return with_lock([pages](PagePool& pool, PrefixCache*) { return pool.release(pages); });
  }
  Status share(PageHandle page) {
    return with_lock([page](PagePool& pool, PrefixCache*) { return pool.share(page); });
  }

  /// Any thread: queues pages to release; nothing is validated until drain_releases().
  void post_release(std::span<const PageHandle> pages) {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    posted_.insert(posted_.end(), pages.begin(), pages.end());
  }

  /// Scheduler thread: releases every posted page (each handle on its own, so one bad handle
  /// does not keep the others). Returns the first error, after applying all the rest.
  Status drain_releases() {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      draining_.swap(posted_);  // the completion thread keeps posting into the other vector
    }
    Status first_error;
    with_lock([&](PagePool& pool, PrefixCache*) {
      for (const PageHandle page : draining_) {
        Status status = pool.release(page);
        if (!status.ok() && first_error.ok()) first_error = std::move(status);
      }
    });
    draining_.clear();
    return first_error;
  }

 private:
  PagePool* pool_;
  PrefixCache* cache_;
  std::mutex pool_mutex_;
  std::mutex queue_mutex_;
  std::vector<PageHandle> posted_;    // guarded by queue_mutex_
  std::vector<PageHandle> draining_;  // only the draining (scheduler) thread
};

}  // namespace kv
SLIMSERVE_NAMESPACE_END
