// The example of docs/kv.md: how an engine wires the page pool, the prefix cache, the page
// table and the GPU tag check into one scheduler step. Compiled and run as a test so the doc
// cannot rot.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/prefix_cache.hpp"
#include "slimserve/kv/tag_check.hpp"

namespace kv = slimserve::kv;
namespace rt = slimserve::rt;
using slimserve::Status;

// [docs-example-begin]
struct Sequence {
  std::vector<kv::TokenId> tokens;
  std::vector<kv::PageHandle> pages;  // what the scheduler owns: (page id, tag) pairs
};

struct KvEngine {
  static constexpr std::int32_t page_size = 16;
  static constexpr std::int32_t num_pages = 1024;  // page 0 is the guard page
  static constexpr std::int32_t max_batch = 64;
  static constexpr std::int32_t max_entries = 4096;

  kv::PagePool pool = std::move(kv::PagePool::create({num_pages})).value();
  std::unique_ptr<kv::PrefixCache> cache =
      std::move(kv::PrefixCache::create(pool, {page_size, /*hash_seed=*/0x5eed})).value();
  kv::DeviceTagArray device_tags = std::move(kv::DeviceTagArray::create(num_pages)).value();

  // Pinned host staging and device arrays of the page table, sized for the largest batch.
  kv::PageTableStorage table_storage =
      std::move(kv::PageTableStorage::create(max_batch, max_entries)).value();
  rt::DeviceBuffer<kv::RequestStatus> d_status =
      rt::DeviceBuffer<kv::RequestStatus>::create(max_batch).value();

  // Admission: reuse cached prefix pages, allocate the rest all-or-nothing.
  Status admit(Sequence& seq, const kv::CacheKeyExtras& tenant) {
    std::vector<kv::PageHandle> pages((seq.tokens.size() + page_size - 1) / page_size);
    const std::span<const kv::TokenId> lookup(seq.tokens.data(), seq.tokens.size() - 1);
    auto hits = cache->match_prefix(lookup, tenant, pages);
    if (!hits.ok()) return hits.status();
    Status fresh = pool.allocate(std::span(pages).subspan(static_cast<std::size_t>(*hits)));
    if (!fresh.ok()) {  // not enough pages: give the hits back, try again later
      (void)pool.release(std::span<const kv::PageHandle>(pages.data(), *hits));
      return fresh;
    }
    seq.pages = std::move(pages);
    return {};
  }

  // One decode step: build + upload the table, sync tags, run the check before attention.
  Status step(const std::vector<Sequence*>& batch, cudaStream_t stream,
              std::vector<kv::RequestStatus>& verdicts) {
    std::vector<kv::RequestPages> requests;
    for (const Sequence* seq : batch) {
      requests.push_back({seq->pages, static_cast<std::int64_t>(seq->tokens.size())});
    }
    auto host_table = kv::build_page_table(requests, {page_size, num_pages}, table_storage.host());
    if (!host_table.ok()) return host_table.status();
    SLIMSERVE_RETURN_IF_ERROR(device_tags.sync(pool, stream));  // only the changed tags
    auto table = kv::upload_page_table(*host_table, num_pages, table_storage.device(), stream);
    if (!table.ok()) return table.status();
    SLIMSERVE_RETURN_IF_ERROR(
        kv::check_page_tags({*table, &device_tags, d_status.data(), nullptr}, stream));
    // ... append + attention kernels here, each given d_status.data(): aborted requests are
    // skipped on the device and their outputs marked ...
    verdicts.resize(batch.size());
    SLIMSERVE_RETURN_IF_ERROR(kv::copy_statuses_to_host(d_status.data(), verdicts, stream));
    return rt::stream_synchronize(stream);
  }

  // Completion: index the full pages for reuse, then drop this sequence's references.
  Status finish(Sequence& seq, const kv::CacheKeyExtras& tenant) {
    auto indexed = cache->insert(seq.tokens, tenant, seq.pages);
    if (!indexed.ok()) return indexed.status();
    std::vector<kv::PageHandle> tail_first(seq.pages.rbegin(), seq.pages.rend());
    return pool.release(std::span<const kv::PageHandle>(tail_first));  // leaves evicted first
  }
};
// [docs-example-end]

TEST_CASE("docs example: a scheduler step with prefix reuse and a caught stale request",
          "[kv][docs]") {
  KvEngine engine;
  const kv::CacheKeyExtras tenant{/*cache_salt=*/42, /*adapter_id=*/0};
  Sequence first{std::vector<kv::TokenId>(40), {}};
  for (std::size_t i = 0; i < first.tokens.size(); ++i) first.tokens[i] = static_cast<kv::TokenId>(i * 7 + 1);
  REQUIRE(engine.admit(first, tenant).ok());
  REQUIRE(engine.finish(first, tenant).ok());  // 2 full pages cached

  Sequence second{first.tokens, {}};
  REQUIRE(engine.admit(second, tenant).ok());
  CHECK(second.pages[0] == first.pages[0]);  // a prefix hit: same page, same tag
  CHECK(engine.cache->stats().hit_pages == 2);

  // `second` got first's private last page back from the free list, under a new tag. An engine
  // bug that still schedules `first` (its handles are old) is caught on the device.
  CHECK(second.pages[2].id == first.pages[2].id);
  CHECK(second.pages[2].tag != first.pages[2].tag);
  Sequence zombie = first;
  Sequence third{std::vector<kv::TokenId>(20, 9), {}};
  REQUIRE(engine.admit(third, tenant).ok());
  std::vector<kv::RequestStatus> verdicts;
  REQUIRE(engine.step({&second, &third, &zombie}, nullptr, verdicts).ok());
  CHECK(kv::request_ok(verdicts[0]));
  CHECK(kv::request_ok(verdicts[1]));
  CHECK(verdicts[2].state == kv::RequestState::stale_tag);
  CHECK(verdicts[2].failed_slot == 2);
}
