// libFuzzer target over the public host API of the page allocator: the input drives a pool, a
// prefix cache, write rights, the page-table builder/validator, and (over a second pool)
// RequestPageSets with misuse (stale references, second finishes) and pool re-creation; after
// every operation the full audits must pass and every reported error must have left the state
// consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/prefix_cache.hpp"
#include "slimserve/kv/request_pages.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint32_t u32() {
    std::uint32_t value = 0;
    for (int i = 0; i < 4; ++i) value = (value << 8) | byte();
    return value;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

void require(bool condition) {
  if (!condition) __builtin_trap();
}

void audit(const PagePool& pool, const PrefixCache& cache) {
  require(pool.check_invariants().ok());
  require(cache.check_invariants().ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const std::int32_t num_pages = 2 + in.byte() % 40;
  const std::int32_t page_size = 1 + in.byte() % 4;
  const PageTag max_tag = 1 + in.byte() % 8 == 1 ? 0xFFFFFFFFu : 1u + in.byte() % 16;
  Result<PagePool> made = PagePool::create(PagePoolOptions{num_pages, max_tag});
  require(made.ok());
  PagePool pool = std::move(made).value();
  auto cache = std::move(PrefixCache::create(pool, PrefixCacheOptions{page_size, 7, 1 + in.byte() % 64})).value();

  std::vector<PageHandle> held;   // handles the "engine" believes it owns (may go stale)
  std::vector<TokenId> tokens;
  std::vector<WriterId> writers{pool.new_writer(), pool.new_writer()};

  // Request-level API over its own pool (raw handle misuse on a pool cannot be told apart from
  // a holder's release, so the page sets get a pool nobody else touches).
  auto sets_pool = std::make_unique<PagePool>(std::move(PagePool::create(PagePoolOptions{num_pages, max_tag})).value());
  auto sets_cache = std::move(PrefixCache::create(*sets_pool, PrefixCacheOptions{page_size, 9})).value();
  auto sets = std::move(RequestPageSets::create(*sets_pool, sets_cache.get(), RequestPageSetsOptions{6, page_size})).value();
  std::vector<RequestRef> refs;          // active, preempted or finished: misuse included
  std::vector<std::vector<TokenId>> seqs;  // tokens per ref
  std::vector<PageHandle> old_pool_handles;
  std::uint64_t refused_seen = 0;
  auto audit_sets = [&] {
    require(sets_pool->check_invariants().ok());
    require(sets_cache->check_invariants().ok());
    require(sets->check_invariants().ok());
  };

  while (!in.empty()) {
    const std::uint8_t op = in.byte() % 14;
    const PagePoolCounts before = pool.counts();
    switch (op) {
      case 0: {  // bulk allocate (writable by a request, or not)
        std::vector<PageHandle> out(in.byte() % 8);
        const WriterId writer = in.byte() % 2 == 0 ? no_writer : writers[in.byte() % writers.size()];
        const Status status = pool.allocate(out, writer);
        if (status.ok()) {
          held.insert(held.end(), out.begin(), out.end());
        } else {
          require(status.code() == StatusCode::resource_exhausted);
          require(pool.counts().used == before.used);
        }
        break;
      }
      case 1: {  // release any handle, even a stale or forged one
        PageHandle page = held.empty() ? PageHandle{static_cast<PageId>(in.u32() % 64), in.byte()}
                                       : held[in.byte() % held.size()];
        if (in.byte() % 4 == 0) page.tag += 1;
        const Status status = pool.release(page);
        if (!status.ok()) require(pool.counts().used == before.used);
        break;
      }
      case 2: {  // bulk release of a random selection (duplicates allowed)
        std::vector<PageHandle> batch;
        for (int n = in.byte() % 6; n > 0 && !held.empty(); --n) batch.push_back(held[in.byte() % held.size()]);
        const Status status = pool.release(batch);
        if (!status.ok()) {
          require(pool.counts().used == before.used && pool.counts().free == before.free);
        }
        break;
      }
      case 3:
        if (!held.empty()) (void)pool.share(held[in.byte() % held.size()]);
        break;
      case 4:
        if (!held.empty()) {
          const WriterId writer = writers[in.byte() % writers.size()];
          Result<AppendTarget> target = pool.prepare_append(held[in.byte() % held.size()], writer);
          if (target.ok()) require(pool.writer(target->page.id) == writer);
          if (target.ok() && target->needs_copy) {
            held.push_back(target->page);
            require(pool.writer(target->copy_from.id) == no_writer);
          }
        }
        break;
      case 5: {  // cache the held pages as a sequence
        tokens.resize(held.size() * page_size);
        for (TokenId& token : tokens) token = in.byte() % 3;
        (void)cache->insert(tokens, CacheKeyExtras{in.byte() % 2u, 0}, held);
        break;
      }
      case 6: {  // lookup
        std::vector<TokenId> query(in.byte() % 16);
        for (TokenId& token : query) token = in.byte() % 3;
        std::vector<PageHandle> hits(query.size());
        Result<std::int32_t> matched = cache->match_prefix(query, CacheKeyExtras{in.byte() % 2u, 0}, hits);
        require(matched.ok());
        for (std::int32_t i = 0; i < *matched; ++i) {
          require(pool.is_live(hits[i]));
          held.push_back(hits[i]);
        }
        break;
      }
      case 7: {  // build a page table from the held handles (stale ones included)
        const std::size_t count = held.size() < 8 ? held.size() : 8;
        std::vector<RequestPages> requests{{std::span<const PageHandle>(held.data(), count),
                                            static_cast<std::int64_t>(in.u32() % 64)}};
        std::vector<std::int32_t> indptr(2, -1), last(1, -1);
        std::vector<PageId> ids(8, -1);
        std::vector<PageTag> tags(8, 0);
        Result<PageTableView> view = build_page_table(
            requests, PageTableShape{page_size, num_pages},
            PageTableHostBuffers{indptr.data(), ids.data(), last.data(), tags.data(), 1, 8});
        if (view.ok()) {
          require(validate_page_table(*view, num_pages).ok());
          for (std::size_t j = 0; j < count; ++j) require(ids[j] != guard_page_id);
        } else {
          require(indptr[0] == -1 && ids[0] == -1);  // nothing written
        }
        break;
      }
      case 8: {  // validate arbitrary bytes as a page table
        std::int32_t indptr[3] = {static_cast<std::int32_t>(in.byte() % 3), in.byte() % 4, in.byte() % 5};
        std::int32_t last[2] = {in.byte() % 6, in.byte() % 6};
        PageId ids[4] = {static_cast<PageId>(in.byte()) - 8, in.byte(), in.byte(), in.byte()};
        PageTag tags[4] = {in.byte(), in.byte(), in.byte(), in.byte()};
        const Status status =
            validate_page_table(PageTableView{indptr, ids, last, tags, 2, page_size}, num_pages, 4);
        if (status.ok()) {
          require(indptr[0] == 0 && indptr[1] >= 0 && indptr[2] >= indptr[1]);
          for (int j = 0; j < indptr[2]; ++j) require(ids[j] > 0 && ids[j] < num_pages);
        }
        break;
      }
      case 9: {  // grant or revoke a write right
        if (held.empty()) break;
        const PageHandle page = held[in.byte() % held.size()];
        const WriterId writer = writers[in.byte() % writers.size()];
        if (in.byte() % 2 == 0) {
          const bool sole = pool.is_live(page) && pool.ref_count(page.id) == 1 && !pool.is_cache_registered(page.id);
          const bool mine = pool.is_live(page) && (pool.writer(page.id) == no_writer || pool.writer(page.id) == writer);
          const Status status = pool.grant_write(page, writer);
          require(status.ok() == (sole && mine));
          if (status.ok()) require(pool.writer(page.id) == writer);
        } else if (pool.revoke_write(page).ok()) {
          require(pool.writer(page.id) == no_writer);
        }
        break;
      }
      case 10: {  // request sets: admit, or resume a preempted one
        std::vector<TokenId> seq(1 + in.byte() % 12);
        for (TokenId& token : seq) token = in.byte() % 3;
        Result<RequestRef> ref = sets->admit(seq, CacheKeyExtras{});
        if (ref.ok()) {
          refs.push_back(*ref);
          seqs.push_back(seq);
          for (const PageHandle& page : sets->pages(*ref)) {
            require(sets_pool->writer(page.id) == no_writer || sets_pool->writer(page.id) == ref->writer);
          }
        }
        break;
      }
      case 11: {  // request sets: append / fork / preempt / resume
        if (refs.empty()) break;
        const std::size_t at = in.byte() % refs.size();
        const RequestRef ref = refs[at];
        const bool active = sets->is_active(ref);
        switch (in.byte() % 4) {
          case 0: {
            const std::int32_t grow = in.byte() % 6;
            Result<PagePlan> plan = sets->append(ref, grow);
            require(active || !plan.ok());
            if (plan.ok()) {
              for (std::int32_t t = 0; t < grow; ++t) seqs[at].push_back(in.byte() % 3);
              // The page the append lands in is the request's to write.
              if (grow > 0) require(sets_pool->writer(sets->pages(ref).back().id) == ref.writer);
            }
            if (in.byte() % 2 == 0) sets->release_copy_sources();
            break;
          }
          case 1: {
            Result<RequestRef> child = sets->fork(ref);
            require(active || !child.ok());
            if (child.ok()) {
              refs.push_back(*child);
              seqs.push_back(seqs[at]);
            }
            break;
          }
          case 2:
            require(sets->preempt(ref).ok() == active);
            break;
          default: {
            Result<RequestRef> resumed = sets->resume(ref, seqs[at], CacheKeyExtras{});
            if (resumed.ok()) {
              require(resumed->writer != ref.writer);
              refs[at] = *resumed;
            }
            break;
          }
        }
        break;
      }
      case 12: {  // request sets: finish (into the cache or not), possibly a second time
        if (refs.empty()) break;
        const std::size_t at = in.byte() % refs.size();
        const std::uint64_t refused_before = sets->counts().refused;
        const PagePoolCounts pool_before = sets_pool->counts();
        const bool known = sets->is_active(refs[at]) || sets->tokens(refs[at]) > 0;
        const bool into_cache = in.byte() % 2 == 0;
        const Status status = into_cache ? sets->finish(refs[at], seqs[at], CacheKeyExtras{})
                                         : sets->finish(refs[at]);
        if (!known) {  // a second finish, or of a forgotten incarnation: refused, nothing freed
          require(!status.ok() && sets->counts().refused == refused_before + 1);
          require(sets_pool->counts().used == pool_before.used);
        }
        break;
      }
      default: {  // re-create the request sets' pool: no earlier handle matches the new one
        for (const RequestRef& ref : refs) {
          for (const PageHandle& page : sets->pages(ref)) old_pool_handles.push_back(page);
        }
        sets->release_copy_sources();
        refs.clear();
        seqs.clear();
        sets.reset();
        sets_cache.reset();
        sets_pool.reset();
        sets_pool = std::make_unique<PagePool>(std::move(PagePool::create(PagePoolOptions{num_pages, max_tag})).value());
        sets_cache = std::move(PrefixCache::create(*sets_pool, PrefixCacheOptions{page_size, 9})).value();
        sets = std::move(RequestPageSets::create(*sets_pool, sets_cache.get(), RequestPageSetsOptions{6, page_size})).value();
        break;
      }
    }
    audit(pool, *cache);
    audit_sets();
    // Misuse is refused without side effects; the count only grows (and restarts with a pool).
    require(sets->counts().refused >= refused_seen || refs.empty());
    refused_seen = sets->counts().refused;
    for (const PageHandle& old : old_pool_handles) require(!sets_pool->is_live(old));
    if (old_pool_handles.size() > 64) old_pool_handles.erase(old_pool_handles.begin(), old_pool_handles.begin() + 32);
    if (refs.size() > 24) {
      refs.erase(refs.begin(), refs.begin() + 8);  // forgotten references: never reused
      seqs.erase(seqs.begin(), seqs.begin() + 8);
    }
    if (held.size() > 64) held.erase(held.begin(), held.begin() + 32);
  }
  return 0;
}
