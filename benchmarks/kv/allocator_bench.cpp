// Host-side costs of the page allocator: allocate+free (one page, 64-page batches), prefix
// lookup per page, and the page-table build for a 256 x 8K-token decode batch.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/prefix_cache.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {

PagePool make_pool(std::int32_t pages) {
  return std::move(PagePool::create(PagePoolOptions{pages})).value();
}

// One page allocated and freed per iteration (the pool keeps its dirty list bounded: a page
// is listed once until the device sync clears it).
void BM_AllocFreeOnePage(benchmark::State& state) {
  PagePool pool = make_pool(1 << 16);
  for (auto _ : state) {
    Result<PageHandle> page = pool.allocate();
    benchmark::DoNotOptimize(page);
    (void)pool.release(*page);
  }
  state.SetItemsProcessed(state.iterations());  // pages: one allocate + one free each
  state.counters["alloc+free ops/s"] =
      benchmark::Counter(2.0 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AllocFreeOnePage);

void BM_AllocFreeBatch(benchmark::State& state) {
  const auto batch = static_cast<std::size_t>(state.range(0));
  PagePool pool = make_pool(1 << 16);
  std::vector<PageHandle> pages(batch);
  for (auto _ : state) {
    (void)pool.allocate(pages);
    benchmark::DoNotOptimize(pages.data());
    (void)pool.release(std::span<const PageHandle>(pages));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(batch));
  state.counters["alloc+free ops/s"] = benchmark::Counter(
      2.0 * static_cast<double>(state.iterations() * batch), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AllocFreeBatch)->Arg(64);

// Prefix lookup of a 64-page (page_size 16) prompt that is fully cached; per page.
void BM_PrefixLookup(benchmark::State& state) {
  constexpr std::int32_t page_size = 16;
  constexpr std::size_t pages_per_prompt = 64;
  PagePool pool = make_pool(1 << 16);
  auto cache = std::move(PrefixCache::create(pool, PrefixCacheOptions{page_size, 42})).value();
  std::mt19937 rng(7);
  std::vector<std::vector<TokenId>> prompts(64);
  for (auto& prompt : prompts) {  // 64 prompts x 64 pages cached and unreferenced
    prompt.resize(pages_per_prompt * page_size);
    for (TokenId& token : prompt) token = static_cast<TokenId>(rng() % 32000);
    std::vector<PageHandle> pages(pages_per_prompt);
    (void)pool.allocate(pages);
    (void)cache->insert(prompt, {}, pages);
    (void)pool.release(std::span<const PageHandle>(pages));
  }
  std::vector<PageHandle> hits(pages_per_prompt);
  std::size_t next = 0;
  for (auto _ : state) {
    const auto& prompt = prompts[next++ % prompts.size()];
    Result<std::int32_t> matched = cache->match_prefix(prompt, {}, hits);
    benchmark::DoNotOptimize(matched);
    (void)pool.release(std::span<const PageHandle>(hits.data(), static_cast<std::size_t>(*matched)));
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(pages_per_prompt));
}
BENCHMARK(BM_PrefixLookup);

// The decode batch of the issue: 256 requests x 8K tokens, page_size 16 (512 pages each),
// shuffled page ids, into preallocated host buffers.
struct DecodeBatch {
  static constexpr std::int32_t requests = 256;
  static constexpr std::int32_t page_size = 16;
  static constexpr std::int32_t tokens = 8192;
  static constexpr std::int32_t pages_per_request = tokens / page_size;
  std::vector<std::vector<PageHandle>> pages;
  std::vector<RequestPages> batch;
  DecodeBatch() {
    std::vector<PageId> ids(requests * pages_per_request);
    std::iota(ids.begin(), ids.end(), 1);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(3));
    pages.resize(requests);
    for (std::int32_t r = 0; r < requests; ++r) {
      for (std::int32_t p = 0; p < pages_per_request; ++p) {
        pages[r].push_back({ids[r * pages_per_request + p], 1u + static_cast<PageTag>(p % 7)});
      }
      batch.push_back({pages[r], tokens - (r % page_size)});  // ragged last pages
    }
  }
  static constexpr std::int32_t num_pages = requests * pages_per_request + 1;
};

void BM_PageTableBuildCsr(benchmark::State& state) {
  DecodeBatch decode;
  const std::size_t entries = DecodeBatch::requests * DecodeBatch::pages_per_request;
  std::vector<std::int32_t> indptr(DecodeBatch::requests + 1), last(DecodeBatch::requests);
  std::vector<PageId> indices(entries);
  std::vector<PageTag> tags(entries);
  const PageTableHostBuffers buffers{indptr.data(), indices.data(), last.data(), tags.data(),
                                     DecodeBatch::requests, static_cast<std::int64_t>(entries)};
  for (auto _ : state) {
    Result<PageTableView> view = build_page_table(
        decode.batch, PageTableShape{DecodeBatch::page_size, DecodeBatch::num_pages}, buffers);
    benchmark::DoNotOptimize(view);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(entries));
}
BENCHMARK(BM_PageTableBuildCsr)->Unit(benchmark::kMicrosecond);

void BM_PageTableBuildBlockTable(benchmark::State& state) {
  DecodeBatch decode;
  const std::size_t entries = DecodeBatch::requests * DecodeBatch::pages_per_request;
  std::vector<PageId> ids(entries);
  std::vector<PageTag> tags(entries);
  std::vector<std::int32_t> lens(DecodeBatch::requests);
  const BlockTableHostBuffers buffers{ids.data(), tags.data(), lens.data(), DecodeBatch::requests,
                                      DecodeBatch::pages_per_request};
  for (auto _ : state) {
    Result<BlockTableView> view = build_block_table(
        decode.batch, PageTableShape{DecodeBatch::page_size, DecodeBatch::num_pages}, buffers);
    benchmark::DoNotOptimize(view);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(entries));
}
BENCHMARK(BM_PageTableBuildBlockTable)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
