// SharedPagePool: a scheduler thread and a completion thread sharing one pool (run under TSan
// in the thread-sanitizer build).
#include <catch2/catch.hpp>

#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include "slimserve/kv/shared_page_pool.hpp"

using namespace slimserve;
using namespace slimserve::kv;

TEST_CASE("shared pool: scheduler allocates, completion thread posts releases", "[kv][threads]") {
  PagePool pool = std::move(PagePool::create(PagePoolOptions{257})).value();
  auto cache = std::move(PrefixCache::create(pool, PrefixCacheOptions{4})).value();
  SharedPagePool shared(pool, cache.get());
  constexpr int requests = 2000;
  constexpr int pages_per_request = 4;

  std::mutex handoff_mutex;
  std::deque<std::vector<PageHandle>> in_flight;  // "GPU work" the completion thread finishes
  std::atomic<bool> scheduler_done{false};
  std::atomic<int> completed{0};

  std::thread completion([&] {
    for (;;) {
      std::vector<PageHandle> finished;
      {
        std::lock_guard<std::mutex> lock(handoff_mutex);
        if (!in_flight.empty()) {
          finished = std::move(in_flight.front());
          in_flight.pop_front();
        }
      }
      if (!finished.empty()) {
        shared.post_release(finished);
        completed.fetch_add(1);
      } else if (scheduler_done.load()) {
        return;
      } else {
        std::this_thread::yield();
      }
    }
  });

  int submitted = 0;
  int errors = 0;
  while (submitted < requests) {
    if (!shared.drain_releases().ok()) ++errors;
    std::vector<PageHandle> pages(pages_per_request);
    const Status got = shared.allocate(pages);
    if (!got.ok()) {
      std::this_thread::yield();  // pool full: wait for completions
      continue;
    }
    // A prefix-cache insert under the same lock, as a scheduler would do per step.
    shared.with_lock([&](PagePool& p, PrefixCache* c) {
      std::vector<TokenId> tokens(pages_per_request * 4, submitted + 1);
      if (!c->insert(tokens, {}, pages).ok()) ++errors;
      if (!p.check_invariants().ok()) ++errors;
    });
    {
      std::lock_guard<std::mutex> lock(handoff_mutex);
      in_flight.push_back(std::move(pages));
    }
    ++submitted;
  }
  scheduler_done.store(true);
  completion.join();
  CHECK(shared.drain_releases().ok());
  CHECK(errors == 0);
  CHECK(completed.load() == requests);
  shared.with_lock([](PagePool& p, PrefixCache* c) {
    CHECK(p.counts().used == 0);
    CHECK(p.counts().free + p.counts().cached == 256);
    CHECK(p.check_invariants().ok());
    CHECK(c->check_invariants().ok());
  });
}

TEST_CASE("shared pool: a bad posted handle is reported, the others are still released",
          "[kv][threads]") {
  PagePool pool = std::move(PagePool::create(PagePoolOptions{8})).value();
  SharedPagePool shared(pool);
  std::vector<PageHandle> pages(3);
  REQUIRE(shared.allocate(pages).ok());
  const PageHandle stale{pages[1].id, pages[1].tag + 5};
  const std::vector<PageHandle> posted{pages[0], stale, pages[1], pages[2]};
  shared.post_release(posted);
  const Status drained = shared.drain_releases();
  CHECK(drained.code() == StatusCode::stale_handle);
  shared.with_lock([](PagePool& p, PrefixCache*) {
    CHECK(p.counts().used == 0);
    CHECK(p.counts().free == 7);
    CHECK(p.check_invariants().ok());
  });
  CHECK(shared.drain_releases().ok());  // nothing left
}
