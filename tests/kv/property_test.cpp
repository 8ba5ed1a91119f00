// Property test: random sequences of allocate / share / fork / append / free / cache / lookup
// (evictions happen inside allocations) and deliberate stale-handle misuse, checked against a
// simple model after every step.
//
// Operations per configuration: SLIMSERVE_KV_PROPERTY_OPS (default 20000; set 1000000 or more
// for a long run). The seed is printed; SLIMSERVE_TEST_SEED replays a failure.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <vector>

#include "slimserve/kv/prefix_cache.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {

long property_ops() {
  if (const char* text = std::getenv("SLIMSERVE_KV_PROPERTY_OPS")) return std::atol(text);
  return 20000;
}

struct Request {
  std::vector<PageHandle> pages;
  std::vector<TokenId> tokens;  // tokens.size() fits pages: ceil(tokens / page_size) == pages
  CacheKeyExtras extras;
  bool cacheable = true;  // false once its first pages were dropped (no longer a prefix)
};

struct IndexedContent {
  PageTag tag = 0;
  CacheKeyExtras extras;
  std::vector<TokenId> prefix;  // every token up to the end of this page
};

class Harness {
 public:
  Harness(std::int32_t num_pages, std::int32_t page_size, PageTag max_tag, int hash_bits,
          std::uint64_t salt)
      : page_size_(page_size),
        rng_(slimserve_test::make_rng(salt)),
        pool_(std::move(PagePool::create(PagePoolOptions{num_pages, max_tag})).value()),
        cache_(std::move(PrefixCache::create(pool_, PrefixCacheOptions{page_size, salt, hash_bits}))
                   .value()),
        last_tags_(static_cast<std::size_t>(num_pages), 0) {
    for (int t = 0; t < 4; ++t) {  // shared "system prompts" so lookups hit
      std::vector<TokenId> prompt(static_cast<std::size_t>(page_size * (2 + t)));
      for (TokenId& token : prompt) token = pick(1, 5);
      templates_.push_back(std::move(prompt));
    }
  }

  void step() {
    const int op = pick(0, 99);
    if (op < 22) {
      new_request();
    } else if (op < 40) {
      append();
    } else if (op < 50) {
      fork();
    } else if (op < 70) {
      finish();
    } else if (op < 80) {
      cache_insert();
    } else if (op < 90) {
      stale_misuse();
    } else {
      release_one_page();
    }
    check();
  }

  std::int64_t ops_with_effect = 0;
  std::int32_t retired_pages() const { return pool_.counts().retired; }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  void adopt(const std::vector<PageHandle>& fresh) {
    for (const PageHandle page : fresh) {
      REQUIRE(page.id != guard_page_id);
      REQUIRE(page.tag > last_tags_[page.id]);  // a new owner always gets a higher tag
      REQUIRE(model_refs_[page.id] == 0);        // nobody held it
    }
  }

  void new_request() {
    Request request;
    request.extras = CacheKeyExtras{static_cast<std::uint64_t>(pick(0, 2)), 0};
    const auto& prompt = templates_[pick(0, static_cast<int>(templates_.size()) - 1)];
    request.tokens.assign(prompt.begin(), prompt.begin() + pick(1, static_cast<int>(prompt.size())));
    for (int extra = pick(0, 2 * page_size_); extra > 0; --extra) request.tokens.push_back(pick(1, 5));
    // Lookup all but the last token, then allocate the rest, all or nothing.
    std::vector<PageHandle> hits(request.tokens.size());
    const std::span<const TokenId> lookup(request.tokens.data(), request.tokens.size() - 1);
    Result<std::int32_t> matched = cache_->match_prefix(lookup, request.extras, hits);
    REQUIRE(matched.ok());
    for (std::int32_t i = 0; i < *matched; ++i) {
      const PageHandle hit = hits[i];
      const auto found = indexed_.find(hit.id);
      REQUIRE(found != indexed_.end());           // only indexed pages hit
      REQUIRE(found->second.tag == hit.tag);       // with the tag they were indexed with
      REQUIRE(found->second.extras == request.extras);  // salts isolated
      const auto end = static_cast<std::size_t>((i + 1) * page_size_);
      REQUIRE(std::equal(found->second.prefix.begin(), found->second.prefix.end(),
                         request.tokens.begin(), request.tokens.begin() + end));
      REQUIRE(found->second.prefix.size() == end);
      request.pages.push_back(hit);
      ++model_refs_[hit.id];
    }
    const std::size_t needed = (request.tokens.size() + page_size_ - 1) / page_size_;
    std::vector<PageHandle> fresh(needed - request.pages.size());
    const std::int32_t available = pool_.available_pages();
    const Status got = pool_.allocate(fresh);
    if (static_cast<std::int32_t>(fresh.size()) > available) {
      REQUIRE(got.code() == StatusCode::resource_exhausted);
      for (const PageHandle hit : request.pages) {  // give the hits back
        REQUIRE(pool_.release(hit).ok());
        --model_refs_[hit.id];
      }
      return;
    }
    REQUIRE(got.ok());
    adopt(fresh);
    for (const PageHandle page : fresh) {
      ++model_refs_[page.id];
      request.pages.push_back(page);
    }
    requests_.push_back(std::move(request));
    ++ops_with_effect;
  }

  void append() {
    if (requests_.empty()) return;
    Request& request = requests_[pick(0, static_cast<int>(requests_.size()) - 1)];
    if (request.tokens.size() % page_size_ == 0) {  // the last page is full: a new page
      Result<PageHandle> page = pool_.allocate();
      if (!page.ok()) {
        REQUIRE(pool_.available_pages() == 0);
        return;
      }
      adopt({*page});
      ++model_refs_[page->id];
      request.pages.push_back(*page);
    } else {
      const PageHandle last = request.pages.back();
      const std::int32_t available = pool_.available_pages();
      Result<AppendTarget> target = pool_.prepare_append(last);
      const bool must_copy = model_refs_[last.id] > 1 || pool_.is_cache_registered(last.id);
      if (must_copy && available == 0) {
        REQUIRE(target.status().code() == StatusCode::resource_exhausted);
        return;
      }
      REQUIRE(target.ok());
      REQUIRE(target->needs_copy == must_copy);
      if (target->needs_copy) {
        REQUIRE(target->copy_from == last);
        --model_refs_[last.id];
        adopt({target->page});
        ++model_refs_[target->page.id];
        request.pages.back() = target->page;
      }
    }
    request.tokens.push_back(pick(1, 5));
    ++ops_with_effect;
  }

  void fork() {
    if (requests_.empty()) return;
    Request copy = requests_[pick(0, static_cast<int>(requests_.size()) - 1)];
    for (const PageHandle page : copy.pages) {
      REQUIRE(pool_.share(page).ok());
      ++model_refs_[page.id];
    }
    requests_.push_back(std::move(copy));
    ++ops_with_effect;
  }

  void finish() {
    if (requests_.empty()) return;
    const auto index = static_cast<std::size_t>(pick(0, static_cast<int>(requests_.size()) - 1));
    Request request = std::move(requests_[index]);
    requests_.erase(requests_.begin() + static_cast<std::ptrdiff_t>(index));
    std::vector<PageHandle> reversed(request.pages.rbegin(), request.pages.rend());  // tail first
    REQUIRE(pool_.release(std::span<const PageHandle>(reversed)).ok());
    for (const PageHandle page : reversed) {
      --model_refs_[page.id];
      graveyard_.push_back(page);
    }
    if (graveyard_.size() > 64) graveyard_.erase(graveyard_.begin(), graveyard_.begin() + 32);
    ++ops_with_effect;
  }

  void release_one_page() {  // a sliding-window style drop of a request's first page
    if (requests_.empty()) return;
    Request& request = requests_[pick(0, static_cast<int>(requests_.size()) - 1)];
    if (request.pages.size() < 2) return;
    const PageHandle first = request.pages.front();
    REQUIRE(pool_.release(first).ok());
    --model_refs_[first.id];
    graveyard_.push_back(first);
    // The request is now a suffix (drop the page's tokens too): no longer a cacheable prefix.
    request.pages.erase(request.pages.begin());
    request.tokens.erase(request.tokens.begin(), request.tokens.begin() + page_size_);
    request.cacheable = false;
    ++ops_with_effect;
  }

  void cache_insert() {
    if (requests_.empty()) return;
    const Request& request = requests_[pick(0, static_cast<int>(requests_.size()) - 1)];
    if (!request.cacheable) return;
    Result<std::int32_t> indexed = cache_->insert(request.tokens, request.extras, request.pages);
    INFO(indexed.status().to_string());
    REQUIRE(indexed.ok());
    for (std::size_t i = 0; i < request.tokens.size() / page_size_; ++i) {
      const PageHandle page = request.pages[i];
      if (!cache_->is_indexed(page.id)) continue;
      IndexedContent& content = indexed_[page.id];
      if (content.tag == page.tag) continue;
      content = IndexedContent{page.tag, request.extras,
                               std::vector<TokenId>(request.tokens.begin(),
                                                    request.tokens.begin() +
                                                        static_cast<std::ptrdiff_t>((i + 1) * page_size_))};
    }
    ++ops_with_effect;
  }

  void stale_misuse() {
    if (graveyard_.empty()) return;
    const PageHandle old = graveyard_[static_cast<std::size_t>(
        pick(0, static_cast<int>(graveyard_.size()) - 1))];
    if (pool_.is_live(old)) return;  // still referenced by a sharer: not stale
    const PagePoolCounts before = pool_.counts();
    const StatusCode expected = pool_.tag(old.id) != old.tag ? StatusCode::stale_handle
                                                             : StatusCode::failed_precondition;
    CHECK(pool_.release(old).code() == expected);
    CHECK(pool_.share(old).code() == expected);
    CHECK(pool_.prepare_append(old).status().code() == expected);
    const PageHandle twice[] = {old, old};
    CHECK(pool_.release(std::span<const PageHandle>(twice)).code() == expected);
    const PagePoolCounts after = pool_.counts();
    REQUIRE(after.free == before.free);
    REQUIRE(after.used == before.used);
    REQUIRE(after.cached == before.cached);
    ++stale_checks_;
  }

  void check() {
    const Status pool_audit = pool_.check_invariants();
    const Status cache_audit = cache_->check_invariants();
    INFO(pool_audit.to_string() << " / " << cache_audit.to_string());
    REQUIRE(pool_audit.ok());
    REQUIRE(cache_audit.ok());
    std::int32_t used = 0;
    for (PageId page = 0; page < pool_.num_pages(); ++page) {
      const auto refs = model_refs_.count(page) ? model_refs_[page] : 0;
      REQUIRE(pool_.ref_count(page) == refs);
      if (refs > 0) ++used;
      REQUIRE(pool_.tag(page) >= last_tags_[page]);  // tags only grow
      last_tags_[page] = pool_.tag(page);
      if (!cache_->is_indexed(page)) indexed_.erase(page);
    }
    REQUIRE(pool_.counts().used == used);
    for (const Request& request : requests_) {  // every held handle is live: no page owned twice
      REQUIRE(request.pages.size() == (request.tokens.size() + page_size_ - 1) / page_size_);
      for (const PageHandle page : request.pages) REQUIRE(pool_.is_live(page));
    }
  }

  std::int32_t page_size_;
  std::mt19937_64 rng_;
  PagePool pool_;
  std::unique_ptr<PrefixCache> cache_;
  std::vector<PageTag> last_tags_;
  std::map<PageId, std::int32_t> model_refs_;
  std::map<PageId, IndexedContent> indexed_;
  std::vector<Request> requests_;
  std::vector<PageHandle> graveyard_;
  std::vector<std::vector<TokenId>> templates_;

 public:
  std::int64_t stale_checks_ = 0;
};

}  // namespace

TEST_CASE("property: random operation sequences agree with the model", "[kv][property]") {
  struct Config {
    std::int32_t pages, page_size;
    PageTag max_tag;
    int hash_bits;
  };
  const Config configs[] = {
      {24, 2, 0xFFFFFFFFu, 64},  // tight pool: constant eviction
      {64, 4, 0xFFFFFFFFu, 4},   // colliding hashes
      {16, 2, 0, 64},            // small tag range (set below): pages retire during the run
  };
  const long ops = property_ops();
  std::uint64_t salt = 100;
  for (const Config& config : configs) {
    INFO("pages " << config.pages << " page_size " << config.page_size << " max_tag "
                  << config.max_tag << " hash_bits " << config.hash_bits);
    const bool retiring = config.max_tag == 0;
    // Scaled so that pages run out of tags around the middle of the run.
    const PageTag max_tag = retiring ? static_cast<PageTag>(std::max(8L, ops / 150)) : config.max_tag;
    Harness harness(config.pages, config.page_size, max_tag, config.hash_bits, ++salt);
    for (long i = 0; i < ops; ++i) harness.step();
    CHECK(harness.ops_with_effect > (retiring ? ops / 10 : ops / 4));
    CHECK(harness.stale_checks_ > 0);
    if (retiring) CHECK(harness.retired_pages() > 0);
  }
}
