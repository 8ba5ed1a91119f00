// PrefixCache: exact hits, collisions never hit wrongly, salts isolated, LRU leaf-first
// eviction only when free pages run out, eviction changes the tag, statistics.
#include <catch2/catch.hpp>

#include <bit>
#include <memory>
#include <vector>

#include "slimserve/kv/prefix_cache.hpp"
#include "support/host_memory.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {
constexpr std::int32_t page_size = 4;

struct Fixture {
  PagePool pool;
  std::unique_ptr<PrefixCache> cache;
  explicit Fixture(std::int32_t pages, int hash_bits = 64)
      : pool(std::move(PagePool::create(PagePoolOptions{pages})).value()) {
    auto made = PrefixCache::create(pool, PrefixCacheOptions{page_size, 1234, hash_bits});
    REQUIRE(made.ok());
    cache = std::move(made).value();
  }
  void audit() const {
    const Status pool_audit = pool.check_invariants();
    const Status cache_audit = cache->check_invariants();
    INFO(pool_audit.to_string() << " / " << cache_audit.to_string());
    REQUIRE(pool_audit.ok());
    REQUIRE(cache_audit.ok());
  }
  // Allocates pages for `tokens`, indexes the full ones and releases them (cached, unreferenced).
  std::vector<PageHandle> prefill_and_finish(const std::vector<TokenId>& tokens,
                                             CacheKeyExtras extras = {}) {
    std::vector<PageHandle> pages((tokens.size() + page_size - 1) / page_size);
    REQUIRE(pool.allocate(pages).ok());
    Result<std::int32_t> indexed = cache->insert(tokens, extras, pages);
    REQUIRE(indexed.ok());
    // Release the tail first, as engines should, so leaves are older in the LRU than parents.
    for (auto it = pages.rbegin(); it != pages.rend(); ++it) REQUIRE(pool.release(*it).ok());
    return pages;
  }
};

std::vector<TokenId> random_tokens(std::mt19937_64& rng, std::size_t count) {
  std::uniform_int_distribution<TokenId> token(1, 50000);
  std::vector<TokenId> tokens(count);
  for (TokenId& t : tokens) t = token(rng);
  return tokens;
}
}  // namespace

TEST_CASE("prefix cache: a finished sequence's full pages hit with the same tags", "[kv][cache]") {
  Fixture f(32);
  auto rng = slimserve_test::make_rng(11);
  const auto tokens = random_tokens(rng, 3 * page_size + 2);  // 3 full pages + 2 tokens
  const auto pages = f.prefill_and_finish(tokens);
  CHECK(f.cache->stats().indexed_pages == 3);
  CHECK(f.pool.counts().cached == 3);
  f.audit();

  std::vector<PageHandle> hit(8);
  Result<std::int32_t> matched = f.cache->match_prefix(tokens, {}, hit);
  REQUIRE(matched.ok());
  REQUIRE(*matched == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(hit[i] == pages[i]);  // same page, same tag: the refcount drop kept it
    CHECK(f.pool.ref_count(hit[i].id) == 1);
  }
  CHECK(f.pool.counts().cached == 0);
  // A sequence diverging in its second page hits only the first.
  auto other = tokens;
  other[page_size + 1] += 1;
  Result<std::int32_t> partial = f.cache->match_prefix(other, {}, hit);
  REQUIRE(partial.ok());
  CHECK(*partial == 1);
  CHECK(f.pool.ref_count(pages[0].id) == 2);
  const PrefixCacheStats stats = f.cache->stats();
  CHECK(stats.hit_pages == 4);
  CHECK(stats.lookups == 2);
  CHECK(stats.misses == 1);
  f.audit();
}

TEST_CASE("prefix cache: different salts or adapters never share", "[kv][cache]") {
  Fixture f(32);
  auto rng = slimserve_test::make_rng(12);
  const auto tokens = random_tokens(rng, 2 * page_size);
  f.prefill_and_finish(tokens, CacheKeyExtras{7, 0});
  std::vector<PageHandle> hit(2);
  CHECK(*f.cache->match_prefix(tokens, CacheKeyExtras{8, 0}, hit) == 0);
  CHECK(*f.cache->match_prefix(tokens, CacheKeyExtras{7, 3}, hit) == 0);
  CHECK(*f.cache->match_prefix(tokens, CacheKeyExtras{0, 0}, hit) == 0);
  CHECK(*f.cache->match_prefix(tokens, CacheKeyExtras{7, 0}, hit) == 2);
  f.audit();
}

TEST_CASE("prefix cache: hash collisions cost probes, never wrong hits", "[kv][cache]") {
  Fixture f(256, /*hash_bits=*/3);  // 8 distinct hashes: nearly everything collides
  auto rng = slimserve_test::make_rng(13);
  std::vector<std::vector<TokenId>> sequences;
  std::vector<CacheKeyExtras> extras;
  for (int s = 0; s < 20; ++s) {
    sequences.push_back(random_tokens(rng, 3 * page_size));
    extras.push_back(CacheKeyExtras{static_cast<std::uint64_t>(s % 3), 0});
    f.prefill_and_finish(sequences.back(), extras.back());
    f.audit();
  }
  for (std::size_t s = 0; s < sequences.size(); ++s) {
    std::vector<PageHandle> hit(3);
    REQUIRE(*f.cache->match_prefix(sequences[s], extras[s], hit) == 3);
    // The hit pages hold exactly these tokens: insert again finds them as already indexed.
    CHECK(*f.cache->insert(sequences[s], extras[s], hit) == 3);
    REQUIRE(f.pool.release(std::span<const PageHandle>(hit)).ok());
    auto changed = sequences[s];
    changed.back() ^= 0x40;  // last page differs
    CHECK(*f.cache->match_prefix(changed, extras[s], hit) == 2);
    REQUIRE(f.pool.release(std::span<const PageHandle>(hit.data(), 2)).ok());
  }
  f.audit();
}

TEST_CASE("prefix cache: eviction waits for free pages to run out, leaves first, new tags",
          "[kv][cache]") {
  Fixture f(7);  // 6 usable pages
  auto rng = slimserve_test::make_rng(14);
  const auto first = random_tokens(rng, 3 * page_size);
  const auto first_pages = f.prefill_and_finish(first);  // 3 cached, 3 free
  std::vector<PageHandle> fresh(3);
  REQUIRE(f.pool.allocate(fresh).ok());  // served by the free list: nothing evicted
  CHECK(f.cache->stats().evictions == 0);
  CHECK(f.cache->stats().indexed_pages == 3);

  Result<PageHandle> evicting = f.pool.allocate();  // no free page: evicts one cached page
  REQUIRE(evicting.ok());
  CHECK(f.cache->stats().evictions == 1);
  CHECK(evicting->id == first_pages[2].id);  // the leaf (last page), not the root
  CHECK(evicting->tag == first_pages[2].tag + 1);
  CHECK_FALSE(f.cache->is_indexed(first_pages[2].id));
  f.audit();

  std::vector<PageHandle> hit(3);
  CHECK(*f.cache->match_prefix(first, {}, hit) == 2);  // the prefix before the leaf still hits
  CHECK(hit[0] == first_pages[0]);
  // The evicted page's old handle is stale everywhere.
  CHECK(f.pool.release(first_pages[2]).code() == StatusCode::stale_handle);
  // All-or-nothing counts evictable pages: 0 free, 0 evictable now (hits hold them).
  std::vector<PageHandle> two(2);
  CHECK(f.pool.allocate(two).code() == StatusCode::resource_exhausted);
  f.audit();
}

TEST_CASE("prefix cache: bad calls are rejected", "[kv][cache]") {
  Fixture f(8);
  CHECK(PrefixCache::create(f.pool, PrefixCacheOptions{0}).status().code() ==
        StatusCode::invalid_argument);
  // 2^30 tokens per page x 8 pages = 2^33 tokens (32 GiB of stored tokens): more than the
  // host holds, so resource_exhausted instead of the std::bad_alloc it threw before.
  if (slimserve_test::physical_memory_bytes() < (std::uint64_t{1} << 35)) {
    Result<std::unique_ptr<PrefixCache>> huge =
        PrefixCache::create(f.pool, PrefixCacheOptions{std::int32_t{1} << 30});
    INFO(huge.status().to_string());
    CHECK(huge.status().code() == StatusCode::resource_exhausted);
  }
  std::vector<TokenId> tokens(2 * page_size, 5);
  std::vector<PageHandle> small(1);
  CHECK(f.cache->match_prefix(tokens, {}, small).status().code() == StatusCode::invalid_argument);
  const PageTag never_issued = f.pool.tag_base() + 1000;
  std::vector<PageHandle> stale{{1, never_issued}, {2, never_issued}};
  CHECK(f.cache->insert(tokens, {}, stale).status().code() == StatusCode::stale_handle);
  f.audit();
}

TEST_CASE("prefix cache: the chained hash spreads every token, its order, the parent and the seed",
          "[kv][cache]") {
  auto rng = slimserve_test::make_rng(17);
  Fixture f(8);
  PagePool other_pool = std::move(PagePool::create(PagePoolOptions{8})).value();
  auto made = PrefixCache::create(other_pool, PrefixCacheOptions{page_size, 4321, 64});
  REQUIRE(made.ok());
  const std::vector<TokenId> page = random_tokens(rng, page_size);
  const BlockHash root = f.cache->root_hash({});
  const BlockHash hash = f.cache->chain_hash(root, page);
  CHECK(f.cache->chain_hash(root, page) == hash);  // a pure function of its inputs
  // The deployment's seed enters at the root, so every chain from it differs.
  CHECK((*made)->root_hash({}) != root);
  CHECK((*made)->chain_hash((*made)->root_hash({}), page) != hash);
  CHECK(f.cache->chain_hash(root ^ 1, page) != hash);
  int flipped_bits = 0;
  for (std::size_t i = 0; i < page.size(); ++i) {
    std::vector<TokenId> changed = page;
    changed[i] ^= 1;  // one bit of one token
    const BlockHash h = f.cache->chain_hash(root, changed);
    CHECK(h != hash);
    flipped_bits += std::popcount(h ^ hash);
  }
  // A finalizer spreads a one-bit change over about half of the 64 bits.
  CHECK(flipped_bits > 16 * page_size);
  CHECK(flipped_bits < 48 * page_size);
  std::vector<TokenId> swapped = page;
  std::swap(swapped[0], swapped[1]);
  if (swapped != page) CHECK(f.cache->chain_hash(root, swapped) != hash);
}
