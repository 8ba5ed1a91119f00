// RequestPageSets: each request's pages are released exactly once, write rights follow the
// pages, and misuse (a second release, a release by a non-holder, a stale reference) is
// refused, counted and changes nothing. Also SharedPagePool::post_finish posted twice.
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <vector>

#include "slimserve/kv/request_pages.hpp"
#include "slimserve/kv/shared_page_pool.hpp"
#include "support/host_memory.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {

constexpr std::int32_t page_size = 4;

struct Fixture {
  PagePool pool;
  std::unique_ptr<PrefixCache> cache;
  std::unique_ptr<RequestPageSets> sets;
  explicit Fixture(std::int32_t pages)
      : pool(std::move(PagePool::create(PagePoolOptions{pages})).value()),
        cache(std::move(PrefixCache::create(pool, PrefixCacheOptions{page_size, 3})).value()),
        sets(std::move(RequestPageSets::create(pool, cache.get(), RequestPageSetsOptions{8, page_size})).value()) {}
  void audit() {
    REQUIRE(pool.check_invariants().ok());
    REQUIRE(cache->check_invariants().ok());
    REQUIRE(sets->check_invariants().ok());
  }
};

std::vector<TokenId> sequence(int count, TokenId first) {
  std::vector<TokenId> tokens(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) tokens[static_cast<std::size_t>(i)] = first + i;
  return tokens;
}

}  // namespace

TEST_CASE("request pages: admit with prefix hits, append, copy-on-write, finish exactly once", "[kv][requests]") {
  Fixture f(32);
  const auto prompt = sequence(10, 100);  // pages: 4 + 4 + 2
  PagePlan plan;
  Result<RequestRef> a = f.sets->admit(prompt, {}, &plan);
  REQUIRE(a.ok());
  CHECK(plan.cached_tokens == 0);
  REQUIRE(f.sets->pages(*a).size() == 3);
  for (const PageHandle& page : f.sets->pages(*a)) CHECK(f.pool.writer(page.id) == a->writer);
  f.audit();
  // Append within the last page (in place), then across a page boundary.
  REQUIRE(f.sets->append(*a, 1).ok());
  Result<PagePlan> grown = f.sets->append(*a, 3);
  REQUIRE(grown.ok());
  CHECK_FALSE(grown->needs_copy);
  CHECK(f.sets->tokens(*a) == 14);
  CHECK(f.sets->pages(*a).size() == 4);
  f.audit();
  // Finish into the cache: full pages indexed and read-only; a second finish is refused.
  auto tokens = sequence(14, 100);
  REQUIRE(f.sets->finish(*a, tokens, {}).ok());
  const Status again = f.sets->finish(*a, tokens, {});
  CHECK(again.code() == StatusCode::failed_precondition);
  CHECK(again.message().find("slot") != std::string_view::npos);
  CHECK(f.sets->counts().refused == 1);
  f.audit();
  // A new request hits the cached pages: read-only; its own pages writable.
  Result<RequestRef> b = f.sets->admit(sequence(13, 100), {}, &plan);
  REQUIRE(b.ok());
  CHECK(plan.cached_tokens == 12);
  const auto b_pages = f.sets->pages(*b);
  for (int i = 0; i < 3; ++i) CHECK(f.pool.writer(b_pages[static_cast<std::size_t>(i)].id) == no_writer);
  CHECK(f.pool.writer(b_pages[3].id) == b->writer);
  // A stale reference to the finished request (same slot reused) is refused, not served.
  CHECK(b->slot == a->slot);
  CHECK(f.sets->append(*a, 1).status().code() == StatusCode::failed_precondition);
  CHECK(f.sets->pages(*a).empty());
  CHECK(f.sets->counts().refused == 2);
  // A release by a non-holder: a reference with the right slot and another identity.
  CHECK(f.sets->finish(RequestRef{b->slot, b->writer + 1}).code() == StatusCode::failed_precondition);
  CHECK(f.sets->counts().refused == 3);
  CHECK(f.sets->is_active(*b));
  f.audit();
}

TEST_CASE("request pages: fork shares read-only pages; each side copies on append", "[kv][requests]") {
  Fixture f(32);
  Result<RequestRef> parent = f.sets->admit(sequence(6, 1), {});
  REQUIRE(parent.ok());
  Result<RequestRef> child = f.sets->fork(*parent);
  REQUIRE(child.ok());
  CHECK(child->writer != parent->writer);
  for (const PageHandle& page : f.sets->pages(*parent)) CHECK(f.pool.writer(page.id) == no_writer);
  f.audit();
  // The child appends first: copy-on-write; the source stays held until the copy is enqueued,
  // so the parent copies too instead of being granted a page the child's copy still reads.
  Result<PagePlan> child_plan = f.sets->append(*child, 1);
  REQUIRE(child_plan.ok());
  REQUIRE(child_plan->needs_copy);
  CHECK(child_plan->copy_tokens == 2);
  CHECK(f.pool.writer(child_plan->copy_to.id) == child->writer);
  CHECK(f.sets->pending_copy_sources().size() == 1);
  Result<PagePlan> parent_plan = f.sets->append(*parent, 1);
  REQUIRE(parent_plan.ok());
  CHECK(parent_plan->needs_copy);
  CHECK(f.pool.writer(child_plan->copy_from.id) == no_writer);
  f.audit();
  f.sets->release_copy_sources();
  CHECK(f.sets->pending_copy_sources().empty());
  CHECK(f.pool.state(child_plan->copy_from.id) == PageState::free);  // both moved off it
  f.audit();
  REQUIRE(f.sets->finish(*child).ok());
  REQUIRE(f.sets->finish(*parent).ok());
  CHECK(f.pool.counts().used == 0);
  f.audit();
}

TEST_CASE("request pages: preempt and resume under a new identity; all or nothing on shortage", "[kv][requests]") {
  Fixture f(7);  // 6 usable pages
  const auto prompt = sequence(9, 50);  // 3 pages
  Result<RequestRef> a = f.sets->admit(prompt, {});
  REQUIRE(a.ok());
  Result<RequestRef> b = f.sets->admit(sequence(9, 70), {});
  REQUIRE(b.ok());
  // No room: nothing taken.
  const auto before = f.pool.counts();
  CHECK(f.sets->admit(sequence(5, 90), {}).status().code() == StatusCode::resource_exhausted);
  CHECK(f.sets->append(*a, 8).status().code() == StatusCode::resource_exhausted);
  CHECK(f.pool.counts().used == before.used);
  CHECK(f.sets->tokens(*a) == 9);
  f.audit();
  REQUIRE(f.sets->preempt(*a).ok());
  CHECK(f.sets->counts().preempted == 1);
  CHECK(f.sets->preempt(*a).code() == StatusCode::failed_precondition);  // not active any more
  CHECK(f.sets->resume(*a, sequence(8, 50), {}).status().code() == StatusCode::invalid_argument);
  Result<RequestRef> resumed = f.sets->resume(*a, prompt, {});
  REQUIRE(resumed.ok());
  CHECK(resumed->slot == a->slot);
  CHECK(resumed->writer != a->writer);  // tables of the preempted incarnation match nothing
  CHECK_FALSE(f.sets->is_active(*a));
  CHECK(f.sets->finish(*a).code() == StatusCode::failed_precondition);
  REQUIRE(f.sets->finish(*resumed).ok());
  REQUIRE(f.sets->finish(*b).ok());
  CHECK(f.sets->counts().active == 0);
  f.audit();
}

TEST_CASE("request pages: a request posted twice to the completion queue is finished once", "[kv][requests]") {
  Fixture f(16);
  SharedPagePool shared(f.pool, f.cache.get(), f.sets.get());
  Result<RequestRef> a = shared.with_requests([](RequestPageSets& sets) { return sets.admit(sequence(6, 1), {}); });
  Result<RequestRef> b = shared.with_requests([](RequestPageSets& sets) { return sets.admit(sequence(6, 1), {}); });
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  shared.post_finish(*a, sequence(6, 1));
  shared.post_finish(*a, sequence(6, 1));  // the bug: the same completion posted twice
  const Status drained = shared.drain_releases();
  CHECK(drained.code() == StatusCode::failed_precondition);
  CHECK(shared.refused_releases() == 1);
  CHECK(f.sets->is_active(*b));
  for (const PageHandle& page : f.sets->pages(*b)) CHECK(f.pool.is_live(page));  // b kept all of its references
  CHECK(f.sets->counts().refused == 1);
  f.audit();
}

TEST_CASE("request pages: factory sizes, empty admits and the pool's release errors", "[kv][requests]") {
  Fixture f(32);
  // 2^31 - 1 slots need over 80 GiB: resource_exhausted, not the std::bad_alloc it threw.
  if (slimserve_test::physical_memory_bytes() <= (std::uint64_t{1} << 36)) {
    auto huge = RequestPageSets::create(
        f.pool, f.cache.get(), RequestPageSetsOptions{std::numeric_limits<std::int32_t>::max(), page_size});
    INFO(huge.status().to_string());
    CHECK(huge.status().code() == StatusCode::resource_exhausted);
  }
  // A request of no tokens is refused and takes nothing (it used to get a slot and no pages).
  const auto free_before = f.pool.counts().free;
  Result<RequestRef> empty = f.sets->admit(std::span<const TokenId>{}, {});
  CHECK(empty.status().code() == StatusCode::invalid_argument);
  CHECK(f.sets->counts().active == 0);
  CHECK(f.pool.counts().free == free_before);
  f.audit();

  // The engine releases one of a request's pages behind the sets' back: finish releases the
  // rest, frees the slot and returns the pool's refusal (it used to return ok).
  const auto prompt = sequence(10, 300);
  Result<RequestRef> a = f.sets->admit(prompt, {});
  REQUIRE(a.ok());
  const PageHandle middle = f.sets->pages(*a)[1];
  REQUIRE(f.pool.release(middle).ok());
  Status finished = f.sets->finish(*a);
  INFO(finished.to_string());
  CHECK(finished.code() == StatusCode::failed_precondition);
  CHECK(finished.to_string().find("finish") != std::string::npos);
  CHECK(f.sets->counts().release_errors == 1);
  CHECK(f.sets->counts().active == 0);
  CHECK_FALSE(f.sets->is_active(*a));
  CHECK(f.pool.counts().free == free_before);  // every other page came back
  f.audit();

  // The same through preempt.
  Result<RequestRef> b = f.sets->admit(prompt, {});
  REQUIRE(b.ok());
  REQUIRE(f.pool.release(f.sets->pages(*b)[0]).ok());
  CHECK(f.sets->preempt(*b).code() == StatusCode::failed_precondition);
  CHECK(f.sets->counts().release_errors == 2);
  CHECK(f.sets->counts().preempted == 1);
  CHECK(f.pool.counts().free == free_before);
  f.audit();

  // A copy-on-write source released behind the sets' back: counted and kept.
  Result<RequestRef> c = f.sets->admit(sequence(6, 500), {});
  REQUIRE(c.ok());
  Result<RequestRef> child = f.sets->fork(*c);
  REQUIRE(child.ok());
  Result<PagePlan> plan = f.sets->append(*child, 1);
  REQUIRE(plan.ok());
  REQUIRE(plan->needs_copy);
  REQUIRE(f.sets->pending_copy_sources().size() == 1);
  const PageHandle source = f.sets->pending_copy_sources()[0];
  REQUIRE(f.pool.release(source).ok());  // the sets' extra reference, taken by someone else
  REQUIRE(f.pool.release(source).ok());  // and the parent's
  f.sets->release_copy_sources();
  CHECK(f.sets->counts().release_errors == 3);
  CHECK_FALSE(f.sets->last_release_error().ok());
}

TEST_CASE("request pages: adopt takes pages filled elsewhere, all or nothing", "[kv][requests]") {
  Fixture f(32);
  const std::int32_t available = f.pool.available_pages();
  std::vector<PageHandle> pages(3);
  REQUIRE(f.pool.allocate(pages).ok());
  std::swap(pages[0], pages[2]);  // not in the pool's order
  PageHandle shared{};  // the page the test shares (two references)
  auto refused = [&](std::span<const PageHandle> offered, std::int64_t tokens, StatusCode code, const char* says,
                     bool audit = true) {
    Result<RequestRef> ref = f.sets->adopt(offered, tokens);
    INFO(ref.status().to_string());
    CHECK(ref.status().code() == code);
    CHECK(ref.status().to_string().find(says) != std::string::npos);
    CHECK(f.sets->counts().active == 0);
    for (const PageHandle& page : pages) {  // still the caller's, one reference, no new owner
      CHECK(f.pool.is_live(page));
      CHECK(f.pool.ref_count(page.id) == (page == shared ? 2 : 1));
    }
    if (audit) f.audit();  // (a page the test made writable outside the sets fails the sets' audit)
  };
  refused(pages, 13, StatusCode::invalid_argument, "need");  // 13 tokens of 4 per page: 4 pages
  refused(pages, 8, StatusCode::invalid_argument, "need");
  refused(pages, 0, StatusCode::invalid_argument, "need");
  const std::vector<PageHandle> twice{pages[0], pages[1], pages[0]};
  refused(twice, 10, StatusCode::invalid_argument, "listed twice");
  std::vector<PageHandle> stale = pages;
  stale[1].tag += 1;
  refused(stale, 10, StatusCode::stale_handle, "page 1");
  REQUIRE(f.pool.share(pages[2]).ok());
  shared = pages[2];
  refused(pages, 10, StatusCode::failed_precondition, "shared");
  REQUIRE(f.pool.release(pages[2]).ok());
  shared = PageHandle{};
  REQUIRE(f.pool.grant_write(pages[1], f.pool.new_writer()).ok());
  refused(pages, 10, StatusCode::failed_precondition, "writable", false);
  REQUIRE(f.pool.revoke_write(pages[1]).ok());
  f.audit();

  Result<RequestRef> a = f.sets->adopt(pages, 10);
  REQUIRE(a.ok());
  REQUIRE(f.sets->pages(*a).size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(f.sets->pages(*a)[i] == pages[i]);
    CHECK(f.pool.writer(pages[i].id) == a->writer);
  }
  CHECK(f.sets->tokens(*a) == 10);
  f.audit();
  Result<PagePlan> grown = f.sets->append(*a, 3);  // 2 more in the last page, then a new page
  REQUIRE(grown.ok());
  CHECK_FALSE(grown->needs_copy);
  CHECK(f.sets->pages(*a).size() == 4);
  f.audit();
  REQUIRE(f.sets->finish(*a).ok());
  CHECK(f.pool.available_pages() == available);

  // No free slot: refused, the caller keeps its page.
  std::vector<RequestRef> held;
  for (int i = 0; i < 8; ++i) held.push_back(*f.sets->admit(sequence(2, 500 + 10 * i), {}));
  std::vector<PageHandle> one(1);
  REQUIRE(f.pool.allocate(one).ok());
  Result<RequestRef> full = f.sets->adopt(one, 4);
  CHECK(full.status().code() == StatusCode::resource_exhausted);
  CHECK(f.pool.is_live(one[0]));
  REQUIRE(f.pool.release(one[0]).ok());
  for (const RequestRef& request : held) REQUIRE(f.sets->finish(request).ok());
  f.audit();
  CHECK(f.pool.available_pages() == available);
}
