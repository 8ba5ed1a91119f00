// libFuzzer target over the public host API of the page allocator: the input drives a pool, a
// prefix cache and the page-table builder/validator; after every operation the full audits
// must pass and every reported error must have left the state consistent.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/prefix_cache.hpp"

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
  while (!in.empty()) {
    const std::uint8_t op = in.byte() % 9;
    const PagePoolCounts before = pool.counts();
    switch (op) {
      case 0: {  // bulk allocate
        std::vector<PageHandle> out(in.byte() % 8);
        const Status status = pool.allocate(out);
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
          Result<AppendTarget> target = pool.prepare_append(held[in.byte() % held.size()]);
          if (target.ok() && target->needs_copy) held.push_back(target->page);
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
          for (int j = 0; j < indptr[2]; ++j) require(ids[j] >= 0 && ids[j] < num_pages);
        }
        break;
      }
    }
    audit(pool, *cache);
    if (held.size() > 64) held.erase(held.begin(), held.begin() + 32);
  }
  return 0;
}
