// PagePool: ownership, generation tags, misuse detection, copy-on-write, tag retirement.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "slimserve/kv/page_pool.hpp"
#include "support/host_memory.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {
PagePool make_pool(std::int32_t pages, PageTag max_tag = 0xFFFFFFFFu) {
  Result<PagePool> pool = PagePool::create(PagePoolOptions{pages, max_tag});
  REQUIRE(pool.ok());
  return std::move(pool).value();
}
void require_consistent(const PagePool& pool) {
  const Status audit = pool.check_invariants();
  INFO(audit.to_string());
  REQUIRE(audit.ok());
}
}  // namespace

TEST_CASE("page pool: creation rejects bad options", "[kv][pool]") {
  CHECK(PagePool::create(PagePoolOptions{1}).status().code() == StatusCode::invalid_argument);
  CHECK(PagePool::create(PagePoolOptions{-3}).status().code() == StatusCode::invalid_argument);
  CHECK(PagePool::create(PagePoolOptions{8, 0}).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("page pool: a size the host cannot hold is resource_exhausted, never bad_alloc", "[kv][pool]") {
  // 2^31 - 1 pages need over 80 GiB of bookkeeping. Before the check the factory threw
  // std::bad_alloc (terminating an engine built without exception handling).
  if (slimserve_test::physical_memory_bytes() > (std::uint64_t{1} << 36)) {
    WARN("not run: this host could hold 2^31 pages' bookkeeping");
    return;
  }
  Result<PagePool> huge = PagePool::create(PagePoolOptions{std::numeric_limits<std::int32_t>::max()});
  CHECK(huge.status().code() == StatusCode::resource_exhausted);
  INFO(huge.status().to_string());
  CHECK(huge.status().to_string().find("host memory") != std::string::npos);
  // A pool created afterwards is unaffected (the refused one left no trace in the registry).
  PagePool pool = make_pool(4);
  CHECK(pool.counts().free == 3);
}

TEST_CASE("page pool: allocate and release, tags change only with a new owner", "[kv][pool]") {
  PagePool pool = make_pool(5);  // guard + 4 usable
  CHECK(pool.counts().free == 4);
  CHECK(pool.state(guard_page_id) == PageState::guard);
  std::vector<PageHandle> pages(4);
  REQUIRE(pool.allocate(pages).ok());
  for (const PageHandle& page : pages) {
    CHECK(page.id != guard_page_id);
    CHECK(page.tag == pool.tag_base() + 1);  // the first owner of this pool
    CHECK(pool.ref_count(page.id) == 1);
  }
  CHECK(pool.counts().free == 0);
  CHECK(pool.counts().used == 4);
  REQUIRE(pool.share(pages[0]).ok());
  REQUIRE(pool.release(pages[0]).ok());  // refcount drop: the tag stays
  CHECK(pool.tag(pages[0].id) == pool.tag_base() + 1);
  REQUIRE(pool.release(pages[0]).ok());
  CHECK(pool.state(pages[0].id) == PageState::free);
  CHECK(pool.tag(pages[0].id) == pool.tag_base() + 1);
  Result<PageHandle> again = pool.allocate();
  REQUIRE(again.ok());
  CHECK(again->id == pages[0].id);
  CHECK(again->tag == 2);  // new owner, new tag
  require_consistent(pool);
}

TEST_CASE("page pool: bulk allocation is all or nothing", "[kv][pool]") {
  PagePool pool = make_pool(9);
  std::vector<PageHandle> five(5);
  REQUIRE(pool.allocate(five).ok());
  std::vector<PageHandle> four(4, PageHandle{77, 77});
  const Status short_status = pool.allocate(four);
  CHECK(short_status.code() == StatusCode::resource_exhausted);
  CHECK(short_status.message().find("need 4 pages") != std::string_view::npos);
  CHECK(short_status.message().find("3 available") != std::string_view::npos);
  for (const PageHandle& page : four) CHECK(page == PageHandle{77, 77});  // untouched
  CHECK(pool.counts().free == 3);
  std::vector<PageHandle> three(3);
  CHECK(pool.allocate(three).ok());
  CHECK(pool.allocate().status().code() == StatusCode::resource_exhausted);
  require_consistent(pool);
}

TEST_CASE("page pool: misuse gets a clear error and changes nothing", "[kv][pool]") {
  PagePool pool = make_pool(6);
  PageHandle a = *pool.allocate();
  PageHandle b = *pool.allocate();
  const PagePoolCounts before = pool.counts();

  SECTION("id out of range") {
    CHECK(pool.release(PageHandle{6, 1}).code() == StatusCode::out_of_range);
    CHECK(pool.release(PageHandle{-1, 1}).code() == StatusCode::out_of_range);
    CHECK(pool.share(PageHandle{1000, 1}).code() == StatusCode::out_of_range);
  }
  SECTION("the guard page is never owned") {
    CHECK(pool.release(guard_page).code() == StatusCode::invalid_argument);
    CHECK(pool.share(guard_page).code() == StatusCode::invalid_argument);
  }
  SECTION("stale handle after a new owner") {
    REQUIRE(pool.release(a).ok());
    PageHandle reused = *pool.allocate();
    REQUIRE(reused.id == a.id);
    const Status stale = pool.release(a);
    CHECK(stale.code() == StatusCode::stale_handle);
    CHECK(stale.message().find("tag " + std::to_string(reused.tag)) != std::string_view::npos);
    CHECK(pool.share(a).code() == StatusCode::stale_handle);
    CHECK(pool.prepare_append(a).status().code() == StatusCode::stale_handle);
    CHECK(pool.ref_count(reused.id) == 1);
    REQUIRE(pool.release(reused).ok());
    REQUIRE(pool.release(b).ok());
    CHECK(pool.counts().free == 5);
    require_consistent(pool);
    return;
  }
  SECTION("double free") {
    REQUIRE(pool.release(a).ok());
    const Status twice = pool.release(a);
    CHECK(twice.code() == StatusCode::failed_precondition);
    CHECK(twice.message().find("double free") != std::string_view::npos);
    CHECK(pool.counts().free == before.free + 1);
    REQUIRE(pool.release(b).ok());
    require_consistent(pool);
    return;
  }
  SECTION("bulk release: a duplicate beyond the reference count (underflow)") {
    const std::vector<PageHandle> batch{b, a, a};
    CHECK(pool.release(batch).code() == StatusCode::failed_precondition);
    CHECK(pool.ref_count(a.id) == 1);
    CHECK(pool.ref_count(b.id) == 1);
  }
  SECTION("bulk release: a stale handle in the middle") {
    const std::vector<PageHandle> batch{a, PageHandle{b.id, b.tag + 1}, b};
    CHECK(pool.release(batch).code() == StatusCode::stale_handle);
    CHECK(pool.ref_count(a.id) == 1);
  }
  CHECK(pool.counts().free == before.free);
  CHECK(pool.counts().used == before.used);
  CHECK(pool.is_live(a));
  CHECK(pool.is_live(b));
  require_consistent(pool);
  const std::vector<PageHandle> both{a, b};
  CHECK(pool.release(both).ok());
  CHECK(pool.counts().free == 5);
  require_consistent(pool);
}

TEST_CASE("page pool: copy-on-write before appending into a shared last page", "[kv][pool]") {
  PagePool pool = make_pool(4);
  PageHandle last = *pool.allocate();
  Result<AppendTarget> own = pool.prepare_append(last);
  REQUIRE(own.ok());
  CHECK_FALSE(own->needs_copy);
  CHECK(own->page == last);

  REQUIRE(pool.share(last).ok());  // a fork now shares the last page
  Result<AppendTarget> forked = pool.prepare_append(last);
  REQUIRE(forked.ok());
  CHECK(forked->needs_copy);
  CHECK(forked->copy_from == last);
  CHECK(forked->page.id != last.id);
  CHECK(pool.ref_count(last.id) == 1);  // the caller's reference moved to the new page
  CHECK(pool.ref_count(forked->page.id) == 1);

  REQUIRE(pool.share(last).ok());
  PageHandle filler = *pool.allocate();  // the pool is now full
  const Result<AppendTarget> no_room = pool.prepare_append(last);
  CHECK(no_room.status().code() == StatusCode::resource_exhausted);
  CHECK(pool.ref_count(last.id) == 2);  // nothing changed
  (void)filler;
  require_consistent(pool);
}

TEST_CASE("page pool: a page whose tag reaches max_tag is retired, never wrapped", "[kv][pool]") {
  constexpr PageTag max_tag = 3;
  PagePool pool = make_pool(3, max_tag);  // 2 usable pages
  std::vector<PageTag> seen_tags;
  for (int round = 0; round < 10; ++round) {
    Result<PageHandle> page = pool.allocate();
    if (!page.ok()) {
      CHECK(page.status().code() == StatusCode::resource_exhausted);
      break;
    }
    CHECK(page->tag > pool.tag_base());
    CHECK(page->tag <= pool.max_tag());
    REQUIRE(pool.release(*page).ok());
    require_consistent(pool);
  }
  // Both pages went through tags 1..3 and were retired: 6 allocations in all.
  CHECK(pool.counts().retired == 2);
  CHECK(pool.counts().free == 0);
  CHECK(pool.max_tag() == pool.tag_base() + max_tag);
  CHECK(pool.tag(1) == pool.max_tag());
  CHECK(pool.tag(2) == pool.max_tag());
  CHECK(pool.release(PageHandle{1, pool.max_tag()}).code() == StatusCode::failed_precondition);
}

TEST_CASE("page pool: dirty list names each changed page once", "[kv][pool]") {
  PagePool pool = make_pool(8);
  CHECK(pool.dirty_pages().size() == 8);  // a new pool: every entry unknown to the device
  pool.clear_dirty();
  CHECK(pool.dirty_pages().empty());
  PageHandle a = *pool.allocate();
  REQUIRE(pool.release(a).ok());
  PageHandle b = *pool.allocate();  // same page again
  REQUIRE(b.id == a.id);
  PageHandle c = *pool.allocate();
  REQUIRE(pool.share(c).ok());
  REQUIRE(pool.release(c).ok());
  REQUIRE(pool.dirty_pages().size() == 2);
  CHECK(pool.dirty_pages()[0] == a.id);
  CHECK(pool.dirty_pages()[1] == c.id);
  require_consistent(pool);
}

TEST_CASE("page pool: write rights are granted to a sole holder and revoked at once", "[kv][pool]") {
  PagePool pool = make_pool(8);
  const WriterId alice = pool.new_writer();
  const WriterId bob = pool.new_writer();
  REQUIRE(alice != no_writer);
  REQUIRE(bob != alice);
  std::vector<PageHandle> pages(2);
  REQUIRE(pool.allocate(pages, alice).ok());
  CHECK(pool.writer(pages[0].id) == alice);
  CHECK(pool.writer(pages[1].id) == alice);
  // Another request cannot take the right, nor append through the page.
  CHECK(pool.grant_write(pages[0], bob).code() == StatusCode::failed_precondition);
  CHECK(pool.prepare_append(pages[0], bob).status().code() == StatusCode::failed_precondition);
  CHECK(pool.writer(pages[0].id) == alice);
  // Sharing revokes; a shared page cannot be granted.
  REQUIRE(pool.share(pages[0]).ok());
  CHECK(pool.writer(pages[0].id) == no_writer);
  CHECK(pool.grant_write(pages[0], alice).code() == StatusCode::failed_precondition);
  // Copy-on-write: the writer moves to a fresh page, the old one stays read-only.
  Result<AppendTarget> target = pool.prepare_append(pages[0], alice);
  REQUIRE(target.ok());
  REQUIRE(target->needs_copy);
  CHECK(pool.writer(target->page.id) == alice);
  CHECK(pool.writer(pages[0].id) == no_writer);
  // The other holder is now alone: prepare_append grants it in place.
  Result<AppendTarget> in_place = pool.prepare_append(pages[0], bob);
  REQUIRE(in_place.ok());
  CHECK_FALSE(in_place->needs_copy);
  CHECK(pool.writer(pages[0].id) == bob);
  // Releasing the last reference revokes; an explicit revoke too.
  REQUIRE(pool.revoke_write(pages[1]).ok());
  CHECK(pool.writer(pages[1].id) == no_writer);
  REQUIRE(pool.grant_write(pages[1], alice).ok());
  REQUIRE(pool.release(pages[1]).ok());
  CHECK(pool.writer(pages[1].id) == no_writer);
  CHECK(pool.grant_write(pages[0], no_writer).code() == StatusCode::invalid_argument);
  require_consistent(pool);
}

TEST_CASE("page pool: a re-created pool never matches an earlier pool's handles", "[kv][pool]") {
  std::vector<PageHandle> old_handles(6);
  PageTag old_base = 0;
  {
    PagePool first = make_pool(8);
    old_base = first.tag_base();
    for (int round = 0; round < 5; ++round) {  // push some tags well past the first owner
      REQUIRE(first.allocate(old_handles).ok());
      REQUIRE(first.release(std::span<const PageHandle>(old_handles)).ok());
    }
    REQUIRE(first.allocate(old_handles).ok());
  }
  PagePool second = make_pool(8);
  CHECK(second.tag_base() > old_base);
  std::vector<PageHandle> fresh(6);
  // Whatever the new pool does, no old handle becomes valid.
  for (int round = 0; round < 8; ++round) {
    REQUIRE(second.allocate(fresh).ok());
    for (const PageHandle& old : old_handles) {
      CHECK_FALSE(second.is_live(old));
      CHECK(second.validate(old).code() == StatusCode::stale_handle);
    }
    REQUIRE(second.release(std::span<const PageHandle>(fresh)).ok());
  }
  // Move-assigning a new pool over an old one publishes the old one's tags too.
  PagePool third = make_pool(8);
  REQUIRE(third.allocate(fresh).ok());
  const PageTag third_high = third.tag(fresh[0].id);
  third = make_pool(8);
  CHECK(third.tag_base() > third_high);
}
