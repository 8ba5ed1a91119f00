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
///  * with RequestPageSets, the completion thread posts whole requests instead
///    (`post_finish(ref)`): the drain finishes each exactly once. A request posted twice, or a
///    reference that is no longer active, is refused and counted (`refused_releases()`), never
///    taken from another holder. Raw handles posted twice cannot be told from two holders'
///    releases by the pool: engines that post handles must post each reference once.

#include <cstdint>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "slimserve/config.hpp"
#include "slimserve/kv/page_pool.hpp"
#include "slimserve/kv/prefix_cache.hpp"
#include "slimserve/kv/request_pages.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

class SharedPagePool {
 public:
  /// `pool` (and `cache`, optional, which must index `pool`) outlive this object.
  explicit SharedPagePool(PagePool& pool, PrefixCache* cache = nullptr,
                          RequestPageSets* requests = nullptr)
      : pool_(&pool), cache_(cache), requests_(requests) {}
  SharedPagePool(const SharedPagePool&) = delete;
  SharedPagePool& operator=(const SharedPagePool&) = delete;

  /// Runs `fn(PagePool&, PrefixCache*)` with the pool locked and returns what it returns.
  template <class Fn>
  decltype(auto) with_lock(Fn&& fn) {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    return std::forward<Fn>(fn)(*pool_, cache_);
  }
  /// Runs `fn(RequestPageSets&)` with the pool locked (requires the RequestPageSets given at
  /// construction).
  template <class Fn>
  decltype(auto) with_requests(Fn&& fn) {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    return std::forward<Fn>(fn)(*requests_);
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

  /// Any thread: queues a finished request (its full pages go to the prefix cache when
  /// `tokens` are given). Needs the RequestPageSets given at construction.
  void post_finish(RequestRef request, std::vector<TokenId> tokens = {},
                   CacheKeyExtras extras = {}) {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    posted_finishes_.push_back(PostedFinish{request, std::move(tokens), extras});
  }

  /// Scheduler thread: releases every posted page (each handle on its own, so one bad handle
  /// does not keep the others) and finishes every posted request (each exactly once). Returns
  /// the first error, after applying all the rest; refused ones are counted.
  Status drain_releases() {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      draining_.swap(posted_);  // the completion thread keeps posting into the other vectors
      draining_finishes_.swap(posted_finishes_);
    }
    Status first_error;
    with_lock([&](PagePool& pool, PrefixCache*) {
      for (const PageHandle page : draining_) {
        Status status = pool.release(page);
        if (!status.ok()) {
          ++refused_;
          if (first_error.ok()) first_error = std::move(status);
        }
      }
      for (const PostedFinish& finish : draining_finishes_) {
        Status status = requests_ == nullptr
                            ? make_status(StatusCode::failed_precondition,
                                          "post_finish without RequestPageSets")
                            : requests_->finish(finish.request, finish.tokens, finish.extras);
        if (!status.ok()) {
          ++refused_;
          if (first_error.ok()) first_error = std::move(status);
        }
      }
    });
    draining_.clear();
    draining_finishes_.clear();
    return first_error;
  }

  /// Posted releases and finishes the drain refused (scheduler thread).
  std::uint64_t refused_releases() const noexcept { return refused_; }

 private:
  struct PostedFinish {
    RequestRef request;
    std::vector<TokenId> tokens;
    CacheKeyExtras extras;
  };
  PagePool* pool_;
  PrefixCache* cache_;
  RequestPageSets* requests_;
  std::uint64_t refused_ = 0;                    // only the draining (scheduler) thread
  std::mutex pool_mutex_;
  std::mutex queue_mutex_;
  std::vector<PageHandle> posted_;    // guarded by queue_mutex_
  std::vector<PageHandle> draining_;  // only the draining (scheduler) thread
  std::vector<PostedFinish> posted_finishes_;    // guarded by queue_mutex_
  std::vector<PostedFinish> draining_finishes_;  // only the draining (scheduler) thread
};

}  // namespace kv
SLIMSERVE_NAMESPACE_END
