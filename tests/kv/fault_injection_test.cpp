// Fault injection: the engine deliberately keeps stale page handles (free then reuse, preempt
// then resume, evict then hit through a connector) and puts them in a batch next to healthy
// requests. The GPU tag check must abort exactly the requests holding a stale handle (at the
// first stale slot), and toy append/read kernels that honour the statuses must leave every
// other page byte for byte as the host model says.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <vector>

#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/prefix_cache.hpp"
#include "slimserve/kv/tag_check.hpp"
#include "slimserve/runtime/launch.hpp"
#include "support/device_buffers.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {

constexpr std::int32_t page_size = 16;
constexpr std::int32_t num_pages = 96;
constexpr std::int32_t max_batch = 12;
constexpr std::int32_t max_entries = 256;
constexpr std::uint32_t aborted_marker = 0xDEADDEADu;

// Toy KV write: request b appends stamps[b] as its newest token (the last slot of its last
// page), unless the tag check aborted it.
__global__ void toy_append_kernel(PageTableView table, const RequestStatus* statuses,
                                  const std::uint32_t* stamps, std::uint32_t* kv) {
  // kv: [num_pages, page_size]
  const int b = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (b >= table.batch_size) return;
  if (statuses != nullptr && !request_ok(statuses[b])) return;  // touch no page
  const std::int32_t end = table.indptr[b + 1];
  if (end == table.indptr[b]) return;
  const PageId last = table.indices[end - 1];
  kv[static_cast<std::int64_t>(last) * table.page_size + table.last_page_len[b] - 1] = stamps[b];
}

// Toy KV read: xor of every token of the request; aborted requests get the marker instead.
__global__ void toy_read_kernel(PageTableView table, const RequestStatus* statuses,
                                const std::uint32_t* kv, std::uint32_t* out) {
  const int b = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (b >= table.batch_size) return;
  if (statuses != nullptr && !request_ok(statuses[b])) {
    out[b] = aborted_marker;  // mark the output, read nothing
    return;
  }
  std::uint32_t digest = 0;
  const std::int64_t length = request_length(table, b);
  for (std::int64_t t = 0; t < length; ++t) {
    const PageId page = table.indices[table.indptr[b] + t / table.page_size];
    digest ^= kv[static_cast<std::int64_t>(page) * table.page_size + t % table.page_size] +
              static_cast<std::uint32_t>(t) * 0x9E3779B9u;
  }
  out[b] = digest;
}

using slimserve_test::device_buffer;

struct Request {
  std::vector<PageHandle> pages;
  std::int64_t tokens = 0;
};

class World {
 public:
  World()
      : rng_(slimserve_test::make_rng(41)),
        pool_(std::move(PagePool::create(PagePoolOptions{num_pages})).value()),
        cache_(std::move(PrefixCache::create(pool_, PrefixCacheOptions{page_size, 5})).value()),
        tags_(std::move(DeviceTagArray::create(num_pages)).value()),
        kv_model_(static_cast<std::size_t>(num_pages) * page_size),
        kv_(device_buffer<std::uint32_t>(kv_model_.size())),
        indptr_(device_buffer<std::int32_t>(max_batch + 1)),
        last_(device_buffer<std::int32_t>(max_batch)),
        indices_(device_buffer<PageId>(max_entries)),
        expected_(device_buffer<PageTag>(max_entries)),
        statuses_(device_buffer<RequestStatus>(max_batch)),
        aborted_(device_buffer<std::int32_t>(1)),
        stamps_(device_buffer<std::uint32_t>(max_batch)),
        digests_(device_buffer<std::uint32_t>(max_batch)) {
    for (std::uint32_t& word : kv_model_) word = static_cast<std::uint32_t>(rng_()) | 1u;
    REQUIRE(kv_.upload(kv_model_).ok());
  }

  // A new request with `tokens` tokens on freshly allocated pages (their contents: whatever
  // the previous owner left, as on a real GPU). Returns false when the pool is full.
  bool admit(Request& request, std::int64_t tokens) {
    request.tokens = tokens;
    request.pages.resize(static_cast<std::size_t>((tokens + page_size - 1) / page_size));
    return pool_.allocate(request.pages).ok();
  }
  void finish(const Request& request) {
    REQUIRE(pool_.release(std::span<const PageHandle>(request.pages)).ok());
  }
  std::mt19937_64& rng() { return rng_; }
  void sync_tags() { REQUIRE(tags_.sync(pool_, nullptr).ok()); }
  DeviceTagArray::LastSync last_sync() const { return tags_.last_sync(); }
  PrefixCache& cache() { return *cache_; }

  bool is_stale(const Request& request, std::int32_t* first_stale) const {
    for (std::size_t i = 0; i < request.pages.size(); ++i) {
      if (pool_.tag(request.pages[i].id) != request.pages[i].tag) {
        *first_stale = static_cast<std::int32_t>(i);
        return true;
      }
    }
    return false;
  }

  // One scheduler step over `batch`: every request appends one token. Checks the verdicts and
  // the KV contents against the model. Returns (stale requests, caught requests).
  std::pair<int, int> step(std::vector<Request*> batch) {
    std::shuffle(batch.begin(), batch.end(), rng_);
    std::vector<RequestPages> pages;
    std::vector<std::uint32_t> stamps;
    for (Request* request : batch) {
      // Append one token: grow into a new page when the last one is full (healthy requests only
      // allocate; a stale request's host-side state is what the buggy engine kept).
      std::int32_t ignored = 0;
      if (request->tokens % page_size == 0 && !is_stale(*request, &ignored)) {
        Result<PageHandle> page = pool_.allocate();
        REQUIRE(page.ok());
        request->pages.push_back(*page);
      } else if (request->tokens % page_size == 0) {
        return {0, 0};  // keep stale requests within their pages (the test setup avoids this)
      }
      ++request->tokens;
      pages.push_back({request->pages, request->tokens});
      stamps.push_back(static_cast<std::uint32_t>(rng_()) | 1u);
    }
    std::vector<std::int32_t> host_indptr(max_batch + 1), host_last(max_batch);
    std::vector<PageId> host_indices(max_entries);
    std::vector<PageTag> host_tags(max_entries);
    Result<PageTableView> host_table = build_page_table(
        pages, {page_size, num_pages},
        {host_indptr.data(), host_indices.data(), host_last.data(), host_tags.data(), max_batch,
         max_entries});
    REQUIRE(host_table.ok());

    // The device side of the step: tags, table, check, then the page-touching kernels.
    REQUIRE(tags_.sync(pool_, nullptr).ok());
    Result<PageTableView> table = upload_page_table(
        *host_table, num_pages,
        {indptr_.data(), indices_.data(), last_.data(), expected_.data(), max_batch, max_entries},
        nullptr);
    REQUIRE(table.ok());
    REQUIRE(statuses_.fill_bytes(0x5A).ok());
    REQUIRE(digests_.fill_bytes(0x5A).ok());
    REQUIRE(stamps_.upload(stamps).ok());
    REQUIRE(check_page_tags({*table, &tags_, statuses_.data(), aborted_.data()}, nullptr).ok());
    const rt::LaunchConfig one_block{dim3(1), dim3(32), 0, nullptr};
    REQUIRE(rt::launch(toy_append_kernel, one_block, *table,
                       static_cast<const RequestStatus*>(statuses_.data()),
                       static_cast<const std::uint32_t*>(stamps_.data()), kv_.data())
                .ok());
    REQUIRE(rt::launch(toy_read_kernel, one_block, *table,
                       static_cast<const RequestStatus*>(statuses_.data()),
                       static_cast<const std::uint32_t*>(kv_.data()), digests_.data())
                .ok());
    std::vector<RequestStatus> statuses(batch.size());
    std::vector<std::uint32_t> digests(batch.size());
    std::vector<std::uint32_t> kv(kv_model_.size());
    std::int32_t aborted = -1;
    REQUIRE(copy_statuses_to_host(statuses_.data(), statuses, nullptr).ok());
    REQUIRE(digests_.download(digests).ok());
    REQUIRE(kv_.download(kv).ok());
    REQUIRE(aborted_.download(std::span<std::int32_t>(&aborted, 1)).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());

    // The model: healthy requests wrote their stamp and read their own pages; stale ones
    // touched nothing.
    int stale = 0;
    int caught = 0;
    for (std::size_t b = 0; b < batch.size(); ++b) {
      INFO("request " << b);
      std::int32_t first_stale = -1;
      if (is_stale(*batch[b], &first_stale)) {
        ++stale;
        if (!request_ok(statuses[b])) ++caught;
        CHECK(statuses[b].state == RequestState::stale_tag);
        CHECK(statuses[b].failed_slot == first_stale);
        CHECK(digests[b] == aborted_marker);
        continue;
      }
      CHECK(statuses[b].state == RequestState::ok);
      const PageId last_page = batch[b]->pages.back().id;
      const std::int64_t last_slot = (batch[b]->tokens - 1) % page_size;
      kv_model_[static_cast<std::size_t>(last_page * page_size + last_slot)] = stamps[b];
    }
    for (std::size_t b = 0; b < batch.size(); ++b) {  // digests from the model after writes
      std::int32_t ignored = 0;
      if (is_stale(*batch[b], &ignored)) continue;
      std::uint32_t digest = 0;
      for (std::int64_t t = 0; t < batch[b]->tokens; ++t) {
        const PageId page = batch[b]->pages[static_cast<std::size_t>(t / page_size)].id;
        digest ^= kv_model_[static_cast<std::size_t>(page * page_size + t % page_size)] +
                  static_cast<std::uint32_t>(t) * 0x9E3779B9u;
      }
      CHECK(digests[b] == digest);
    }
    CHECK(aborted == stale);
    CHECK(kv == kv_model_);  // byte for byte: no stale write landed anywhere
    return {stale, caught};
  }

 private:
  std::mt19937_64 rng_;
  PagePool pool_;
  std::unique_ptr<PrefixCache> cache_;
  DeviceTagArray tags_;
  std::vector<std::uint32_t> kv_model_;  // [num_pages, page_size], what the device must hold
  rt::DeviceBuffer<std::uint32_t> kv_;
  rt::DeviceBuffer<std::int32_t> indptr_, last_;
  rt::DeviceBuffer<PageId> indices_;
  rt::DeviceBuffer<PageTag> expected_;
  rt::DeviceBuffer<RequestStatus> statuses_;
  rt::DeviceBuffer<std::int32_t> aborted_;
  rt::DeviceBuffer<std::uint32_t> stamps_, digests_;
};

// Tokens that leave room in the last page for the step's append (stale requests must not need
// a new page: a buggy engine would not allocate for them either).
std::int64_t room_to_append(std::mt19937_64& rng) {
  const std::int64_t pages = 1 + static_cast<std::int64_t>(rng() % 4);
  return (pages - 1) * page_size + 1 + static_cast<std::int64_t>(rng() % (page_size - 1));
}

}  // namespace

TEST_CASE("fault injection: every stale read and write is caught, others untouched",
          "[kv][fault]") {
  World world;
  auto& rng = world.rng();
  int stale_total = 0;
  int caught_total = 0;
  for (int round = 0; round < 12; ++round) {
    INFO("round " << round);
    std::vector<Request> healthy;
    std::vector<Request> zombies;
    // 3. Evict then hit: a connector kept handles of cached pages without a reference; the
    // pages are evicted and reused by a new request, then the connector's read comes in.
    Request prompt;
    const std::int64_t prompt_tokens = 2 * page_size;
    REQUIRE(world.admit(prompt, prompt_tokens));
    std::vector<TokenId> tokens(static_cast<std::size_t>(prompt_tokens));
    for (TokenId& token : tokens) token = static_cast<TokenId>(rng() % 1000);
    REQUIRE(world.cache().insert(tokens, {}, prompt.pages).ok());
    world.finish(prompt);  // cached, unreferenced
    Request connector_view = prompt;
    connector_view.tokens = prompt_tokens - 1;  // it "reads" the cached prompt
    std::vector<Request> fillers;  // take free pages, then evict until the prompt is gone
    while (world.cache().is_indexed(prompt.pages[0].id) ||
           world.cache().is_indexed(prompt.pages[1].id)) {
      fillers.emplace_back();
      REQUIRE(world.admit(fillers.back(), 1));
    }
    for (const Request& filler : fillers) world.finish(filler);
    Request evictor;
    REQUIRE(world.admit(evictor, 2 * page_size - 3));
    zombies.push_back(connector_view);
    healthy.push_back(evictor);
    // The evictions touched many tags; send them now, so the step's own sync carries only
    // the few changes below (the scatter path).
    world.sync_tags();

    for (int i = 0; i < 4; ++i) {
      healthy.emplace_back();
      REQUIRE(world.admit(healthy.back(), room_to_append(rng)));
    }

    // 1. Free then reuse (an async scheduler frees a request while its step is in flight).
    Request finished;
    REQUIRE(world.admit(finished, room_to_append(rng)));
    world.finish(finished);
    Request reuser;
    REQUIRE(world.admit(reuser, static_cast<std::int64_t>(finished.pages.size()) * page_size - 1));
    zombies.push_back(finished);
    healthy.push_back(reuser);

    // 2. Preempt then resume with the old page list.
    Request preempted;
    REQUIRE(world.admit(preempted, room_to_append(rng)));
    world.finish(preempted);  // preemption frees its pages
    Request taker;
    REQUIRE(world.admit(taker, static_cast<std::int64_t>(preempted.pages.size()) * page_size - 2));
    zombies.push_back(preempted);  // resumed without reallocation: the bug
    healthy.push_back(taker);

    std::vector<Request*> batch;
    for (Request& request : healthy) batch.push_back(&request);
    for (Request& request : zombies) batch.push_back(&request);
    const auto [stale, caught] = world.step(batch);
    CHECK(world.last_sync() == DeviceTagArray::LastSync::scatter);
    CHECK(stale == 3);
    stale_total += stale;
    caught_total += caught;

    for (Request& request : healthy) world.finish(request);
  }
  CHECK(stale_total == 36);
  CHECK(caught_total == stale_total);  // 100%
}
