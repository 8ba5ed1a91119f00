// An engine-like randomized loop over the whole KV stack, with bugs injected on purpose.
//
// A scheduler admits requests (with prefix hits), prefills, decodes, forks (copy-on-write on the
// next append), preempts and resumes, finishes requests into the prefix cache (and aborts some
// without caching), lets the cache evict, and now and then re-creates the pool. Every step runs
// the GPU tag check (with write ownership), a copy-on-write copy kernel, an append kernel and a
// read kernel on the device (the emulator here). Beside the healthy requests, each step injects
// buggy rows: stale tables kept from finished, cached, preempted, forked and copied-on-write
// requests, tables of an earlier pool, ids out of range, last_page_len > page_size, the guard
// page inside a range; and on the host, double releases, releases by a non-holder and (with
// the completion thread) the same request posted twice. Preemption keeps the KV off the device
// now and then (swap-out into host slots, or an export buffer, under the request's identity);
// resume swaps it in (imports it) with the library's record headers, and half the restores
// read a slot holding another request's record, or another request's export buffer of the
// same shape. A step whose sync is skipped is checked on the host or, as a captured graph's
// replay would be, on the device only.
//
// A shadow model of every page slot, kept from the healthy writes only, decides corruption
// independently of tags: after every step every slot that a live or cached request reads must
// hold what the model says, and every read must return its request's own tokens. Required:
// 0 uncaught stale writes into data another live or cached request reads, 0 uncaught stale
// reads of another request's tokens, 0 false aborts. Default: a few thousand request-steps per
// pool kind; SLIMSERVE_KV_STRESS_STEPS=<n> sets the steps per configuration (each step is
// about 20 request-steps: 50000 steps per configuration give over 1M request-steps per pool
// kind).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_access.hpp"
#include "slimserve/kv/page_fill.cuh"
#include "slimserve/kv/page_movement.hpp"
#include "slimserve/kv/prefix_cache.hpp"
#include "slimserve/kv/request_pages.hpp"
#include "slimserve/kv/shared_page_pool.hpp"
#include "slimserve/kv/tag_check.hpp"
#include "slimserve/runtime/launch.hpp"
#include "support/device_buffers.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {

constexpr std::int32_t page_size = 4;
constexpr std::int32_t num_pages = 80;
constexpr std::int32_t max_requests = 14;
constexpr std::int32_t max_rows = 32;
constexpr std::int64_t max_entries = max_rows * 16;
constexpr std::int32_t max_tokens = 40;  // a request finishes at this length
constexpr std::uint32_t aborted_marker = 0xDEADDEADu;

SLIMSERVE_HOST_DEVICE constexpr std::uint32_t fold(std::uint32_t digest, std::uint32_t value,
                                                   std::int64_t position) {
  return (digest ^ value) * 16777619u + static_cast<std::uint32_t>(position);
}

// Request b writes its last append_indptr[b+1] - append_indptr[b] tokens, unless aborted, and
// records each page's fill on the device as append_kv does (device-held lengths).
__global__ void toy_append_kernel(PageTableView table, const RequestStatus* statuses,
                                  const std::int32_t* append_indptr, const std::uint32_t* values,
                                  std::uint32_t* kv,  // kv: [num_pages, page_size]
                                  PageFillWord* fills) {
  const int b = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (b >= table.batch_size || !may_touch_pages(statuses, b)) return;
  const std::int64_t tokens = request_length(table, b);
  const std::int32_t appended = append_indptr[b + 1] - append_indptr[b];
  for (std::int32_t i = 0; i < appended; ++i) {
    const std::int64_t t = tokens - appended + i;
    const std::int64_t entry = table.indptr[b] + t / table.page_size;
    const PageId page = table.indices[entry];
    kv[static_cast<std::int64_t>(page) * table.page_size + t % table.page_size] =
        values[append_indptr[b] + i];
    record_page_fill(fills, page, table.expected_tags[entry],
                     static_cast<std::int32_t>(t % table.page_size) + 1);
  }
}

// A digest of every token of request b; aborted requests read nothing and get the marker.
__global__ void toy_read_kernel(PageTableView table, const RequestStatus* statuses,
                                const std::uint32_t* kv, std::uint32_t* out) {
  const int b = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (b >= table.batch_size) return;
  if (!may_touch_pages(statuses, b)) {
    out[b] = aborted_marker;
    return;
  }
  std::uint32_t digest = 0;
  const std::int64_t length = request_length(table, b);
  for (std::int64_t t = 0; t < length; ++t) {
    const PageId page = table.indices[table.indptr[b] + t / table.page_size];
    digest = fold(digest, kv[static_cast<std::int64_t>(page) * table.page_size + t % table.page_size], t);
  }
  out[b] = digest;
}

// Copy-on-write of one word per token under the same gate as kv::copy_pages.
__global__ void toy_copy_kernel(const PageCopy* copies, std::int32_t count,
                                const DevicePageTag* page_tags, std::int32_t pages,
                                std::uint32_t* kv, RequestStatus* statuses, PageFillWord* fills) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= count) return;
  const PageCopy c = copies[i];
  RequestState state = page_access_verdict(page_tags, pages, c.src, c.src_tag, c.writer, PageAccess::read);
  if (state == RequestState::ok) {
    state = page_access_verdict(page_tags, pages, c.dst, c.dst_tag, c.writer, PageAccess::write);
  }
  statuses[i] = RequestStatus{state, state == RequestState::ok ? -1 : 0};
  if (state != RequestState::ok) return;
  for (std::int32_t t = 0; t < c.tokens; ++t) {
    kv[static_cast<std::int64_t>(c.dst) * page_size + t] = kv[static_cast<std::int64_t>(c.src) * page_size + t];
  }
  record_page_fill(fills, c.dst, c.dst_tag, c.tokens);
}

// Records that leave the cache, with the library's header (page_movement.hpp): one slot or
// export record is a KvRecordHeader and the page's page_size words.
constexpr std::int64_t toy_slot_bytes = kv_record_header_bytes + page_size * 4;
constexpr std::int32_t host_slots = 96;
constexpr std::int32_t export_buffers = 8;
constexpr std::int32_t max_request_pages = (max_tokens + page_size - 1) / page_size + 1;

// Swap-out or export of moves[i].page into record moves[i].host_slot of `records` under the
// library's access rule: each record gets its header (identity, index, fill, checksum), as
// swap_pages and export_request write them.
__global__ void toy_save_kernel(const PageSwap* moves, std::int32_t count, const RecordIdentity identity,
                                const std::int32_t* indices, const DevicePageTag* page_tags, std::int32_t pages,
                                const std::uint32_t* kv, const PageFillWord* fills,
                                unsigned char* records, RequestStatus* statuses) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= count) return;
  const PageSwap m = moves[i];
  const RequestState state = page_access_verdict(page_tags, pages, m.page, m.tag, m.writer, PageAccess::read);
  statuses[i] = RequestStatus{state, state == RequestState::ok ? -1 : 0};
  if (state != RequestState::ok) return;
  unsigned char* slot = records + m.host_slot * toy_slot_bytes;
  auto* words = reinterpret_cast<std::uint32_t*>(slot + kv_record_header_bytes);
  unsigned long long sum = 0;
  for (std::int32_t t = 0; t < page_size; ++t) {
    words[t] = kv[static_cast<std::int64_t>(m.page) * page_size + t];
    sum += record_word_term(4 * t, words[t]);
  }
  KvRecordHeader header;
  header.identity = identity;
  header.index = indices[i];  // swap: the slot; export: the page's index in the request
  header.tokens = written_slots(fills[m.page], m.tag);
  header.checksum = record_checksum(sum, identity, header.index, header.tokens);
  *reinterpret_cast<KvRecordHeader*>(slot) = header;
}

// Swap-in or import of records[moves[i].host_slot] into moves[i].page: the header is verified
// (the expected identity, the record's index, a fill the page can hold, the checksum) before
// the page's access verdict and before any word lands, as swap_pages / import_request do.
// verify = false measures what the classes do without it.
__global__ void toy_restore_kernel(const PageSwap* moves, std::int32_t count, const RecordIdentity expected,
                                   const std::int32_t* expected_index, const DevicePageTag* page_tags,
                                   std::int32_t pages, std::uint32_t* kv, PageFillWord* fills,
                                   const unsigned char* records, RequestStatus* statuses, bool verify) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= count) return;
  const PageSwap m = moves[i];
  const unsigned char* slot = records + m.host_slot * toy_slot_bytes;
  const KvRecordHeader header = *reinterpret_cast<const KvRecordHeader*>(slot);
  const auto* words = reinterpret_cast<const std::uint32_t*>(slot + kv_record_header_bytes);
  unsigned long long sum = 0;
  for (std::int32_t t = 0; t < page_size; ++t) sum += record_word_term(4 * t, words[t]);
  RequestState state = RequestState::ok;
  if (verify && !record_header_matches(header, expected, expected_index[i], -1, page_size, sum)) {
    state = RequestState::record_mismatch;
  }
  if (state == RequestState::ok) {
    state = page_access_verdict(page_tags, pages, m.page, m.tag, m.writer, PageAccess::write);
  }
  statuses[i] = RequestStatus{state, state == RequestState::ok ? -1 : 0};
  if (state != RequestState::ok) return;
  for (std::int32_t t = 0; t < page_size; ++t) kv[static_cast<std::int64_t>(m.page) * page_size + t] = words[t];
  const std::int32_t tokens = header.tokens < 0 ? 0 : (header.tokens > page_size ? page_size : header.tokens);
  record_page_fill(fills, m.page, m.tag, tokens);
}

using slimserve_test::device_buffer;

std::uint32_t token_value(std::uint32_t previous, TokenId token) {
  std::uint64_t x = (static_cast<std::uint64_t>(previous) << 32) ^ static_cast<std::uint32_t>(token);
  x *= 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return static_cast<std::uint32_t>(x) | 1u;
}

// A live request as the scheduler keeps it.
struct Live {
  RequestRef ref;
  std::vector<TokenId> tokens;
  std::vector<std::uint32_t> values;  // the KV word of every position (a rolling hash)
  CacheKeyExtras extras;
  std::int64_t prefill_from = -1;     // >= 0: the next step writes tokens [prefill_from, size)
  // Preempted with its KV kept off the device (swap slots, or an export buffer).
  enum class Offload { none, swap, exported } offload = Offload::none;
  std::vector<std::int32_t> records;  // the slot of each page (swap), or {buffer} (export)
  RecordIdentity record_identity;
  std::vector<std::vector<std::uint32_t>> saved;  // what each page held (from the model)
};

// A page table kept by a buggy engine, replayed later.
enum class Origin { finished_cached, finished_freed, preempted, copied_on_write, fork_child, live };
constexpr std::array<const char*, 6> origin_names{"finished into cache", "finished (freed)",
                                                 "preempted",           "copy-on-write source",
                                                 "fork child",          "live request"};
struct Snapshot {
  Origin origin;
  int generation;  // the pool it came from
  WriterId writer;
  std::int32_t slot;
  std::vector<PageHandle> pages;
  std::int64_t tokens;                // the table covers these tokens
  std::vector<std::uint32_t> values;  // what the stale request believes they hold
  bool write;                         // replays its last step's write (of position tokens-1)
};

struct ClassCount {
  std::uint64_t injected = 0, caught = 0, harmless = 0, harmful_write = 0, harmful_read = 0;
};

struct Totals {
  std::uint64_t steps = 0, request_steps = 0, healthy_rows = 0, false_aborts = 0,
                wrong_healthy_reads = 0, unexplained_corruption = 0, copies = 0,
                copy_false_aborts = 0, recreations = 0, offloads = 0, offload_false_aborts = 0,
                restores = 0, restore_false_aborts = 0, restored_pages = 0;
  std::map<std::string, ClassCount> classes;
  void add(const std::string& name, bool caught, bool harmful_write, bool harmful_read) {
    ClassCount& c = classes[name];
    ++c.injected;
    if (caught) {
      ++c.caught;
    } else if (harmful_write) {
      ++c.harmful_write;
    } else if (harmful_read) {
      ++c.harmful_read;
    } else {
      ++c.harmless;
    }
  }
};

// Hands finished requests to a completion thread, which posts them to the SharedPagePool (and,
// injected, sometimes posts one twice).
class CompletionThread {
 public:
  struct Item {
    SharedPagePool* shared;
    RequestRef ref;
    std::vector<TokenId> tokens;
    CacheKeyExtras extras;
    bool post_twice;
  };
  CompletionThread() : thread_([this] { run(); }) {}
  ~CompletionThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    ready_.notify_all();
    thread_.join();
  }
  void push(Item item) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(item));
      ++pushed_;
    }
    ready_.notify_all();
  }
  void flush() {  // until everything pushed has been posted
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return posted_ == pushed_; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Item item = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      item.shared->post_finish(item.ref, item.tokens, item.extras);
      if (item.post_twice) item.shared->post_finish(item.ref, item.tokens, item.extras);
      lock.lock();
      ++posted_;
      done_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_, done_;
  std::deque<Item> queue_;
  std::uint64_t pushed_ = 0, posted_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

class Engine {
 public:
  Engine(bool threaded, PageTag max_tag, std::uint64_t salt)
      : threaded_(threaded),
        max_tag_(max_tag),
        rng_(slimserve_test::make_rng(salt)),
        tags_(std::move(DeviceTagArray::create(num_pages)).value()),
        kv_(device_buffer<std::uint32_t>(static_cast<std::size_t>(num_pages) * page_size)),
        model_(static_cast<std::size_t>(num_pages) * page_size),
        indptr_(device_buffer<std::int32_t>(max_rows + 1)),
        num_entries_(device_buffer<std::int32_t>(1)),
        last_(device_buffer<std::int32_t>(max_rows)),
        append_indptr_(device_buffer<std::int32_t>(max_rows + 1)),
        indices_(device_buffer<PageId>(max_entries)),
        expected_(device_buffer<PageTag>(max_entries)),
        writers_(device_buffer<WriterId>(max_rows)),
        values_(device_buffer<std::uint32_t>(max_entries * page_size)),
        statuses_(device_buffer<RequestStatus>(max_rows)),
        digests_(device_buffer<std::uint32_t>(max_rows)),
        copies_(device_buffer<PageCopy>(max_rows)),
        copy_statuses_(device_buffer<RequestStatus>(max_rows)),
        age_(device_buffer<TableAge>(1)),
        slots_(device_buffer<unsigned char>(static_cast<std::size_t>(host_slots * toy_slot_bytes))),
        exports_(device_buffer<unsigned char>(static_cast<std::size_t>(export_buffers * max_request_pages * toy_slot_bytes))),
        moves_(device_buffer<PageSwap>(max_request_pages)),
        move_index_(device_buffer<std::int32_t>(max_request_pages)),
        move_statuses_(device_buffer<RequestStatus>(max_request_pages)) {
    {  // records that were never written hold random bytes
      std::vector<unsigned char> poison(static_cast<std::size_t>(export_buffers * max_request_pages * toy_slot_bytes));
      for (auto& byte : poison) byte = static_cast<unsigned char>(rng_());
      REQUIRE(exports_.upload(poison).ok());
      poison.resize(static_cast<std::size_t>(host_slots * toy_slot_bytes));
      REQUIRE(slots_.upload(poison).ok());
    }
    free_records();
    for (std::uint32_t& word : model_) word = static_cast<std::uint32_t>(rng_()) | 1u;
    REQUIRE(kv_.upload(model_).ok());
    for (auto& prompt : system_prompts_) {
      prompt.resize(static_cast<std::size_t>(5 + rng_() % 14));
      for (TokenId& token : prompt) token = static_cast<TokenId>(1 + rng_() % 40);
    }
    if (threaded_) completion_ = std::make_unique<CompletionThread>();
    create_pool();
  }
  ~Engine() {
    if (completion_) completion_->flush();
  }

  void run(std::int64_t steps) {
    for (std::int64_t s = 0; s < steps; ++s) step();
  }
  const Totals& totals() const { return totals_; }

 private:
  // --- Pool lifetime ---------------------------------------------------------------------
  void create_pool() {
    pool_ = std::make_unique<PagePool>(
        std::move(PagePool::create(PagePoolOptions{num_pages, max_tag_})).value());
    cache_ = std::move(PrefixCache::create(*pool_, PrefixCacheOptions{page_size, rng_()})).value();
    sets_ = std::move(RequestPageSets::create(*pool_, cache_.get(),
                                              RequestPageSetsOptions{max_requests, page_size}))
                .value();
    shared_ = std::make_unique<SharedPagePool>(*pool_, cache_.get(), sets_.get());
    ++generation_;
  }
  void recreate_pool() {
    if (completion_) completion_->flush();
    (void)shared_->drain_releases();
    live_.clear();
    preempted_.clear();
    free_records();  // the records stay in the slots and buffers: stale ones, of an earlier pool
    finished_refs_.clear();
    refused_before_ += sets_->counts().refused;
    shared_.reset();
    sets_.reset();
    cache_.reset();
    pool_.reset();  // the old pool publishes its tags: the new one starts above them
    create_pool();
    ++totals_.recreations;
  }

  // Every RequestPageSets / pool call of the scheduler goes through here (under the shared
  // pool's lock in the threaded configuration).
  template <class Fn>
  decltype(auto) locked(Fn&& fn) {
    if (threaded_) return shared_->with_lock([&](PagePool&, PrefixCache*) { return fn(); });
    return fn();
  }

  // --- Snapshots ----------------------------------------------------------------------------
  void remember(Origin origin, const Live& r, std::span<const PageHandle> pages, std::int64_t tokens,
                bool write) {
    // The table covers exactly `tokens` (a request still prefilling holds more pages).
    const auto covered = static_cast<std::size_t>((tokens + page_size - 1) / page_size);
    Snapshot snap{origin, generation_, r.ref.writer, r.ref.slot,
                  std::vector<PageHandle>(pages.begin(), pages.begin() + static_cast<std::ptrdiff_t>(covered)), tokens,
                  std::vector<std::uint32_t>(r.values.begin(), r.values.begin() + tokens), write};
    if (snapshots_.size() < 48) {
      snapshots_.push_back(std::move(snap));
    } else {
      snapshots_[rng_() % snapshots_.size()] = std::move(snap);
    }
  }
  std::vector<PageHandle> pages_of(const Live& r) {
    return locked([&] {
      auto span = sets_->pages(r.ref);
      return std::vector<PageHandle>(span.begin(), span.end());
    });
  }

  // --- Host events --------------------------------------------------------------------------
  Live make_prompt() {
    Live r;
    r.extras = CacheKeyExtras{rng_() % 2, 0};
    if (rng_() % 10 < 7) {
      const auto& prompt = system_prompts_[rng_() % system_prompts_.size()];
      r.tokens.assign(prompt.begin(), prompt.end());
    }
    const std::size_t suffix = 1 + rng_() % 6;
    for (std::size_t i = 0; i < suffix; ++i) r.tokens.push_back(static_cast<TokenId>(1 + rng_() % 40));
    fill_values(r);
    return r;
  }
  static void fill_values(Live& r) {
    std::uint32_t previous = static_cast<std::uint32_t>(r.extras.cache_salt) + 7u;
    r.values.resize(r.tokens.size());
    for (std::size_t t = 0; t < r.tokens.size(); ++t) {
      previous = token_value(previous, r.tokens[t]);
      r.values[t] = previous;
    }
  }
  void admit() {
    Live r = make_prompt();
    PagePlan plan;
    Result<RequestRef> ref = locked([&] { return sets_->admit(r.tokens, r.extras, &plan); });
    if (!ref.ok()) {
      REQUIRE(ref.status().code() == StatusCode::resource_exhausted);
      return;
    }
    r.ref = *ref;
    r.prefill_from = plan.cached_tokens;
    live_.push_back(std::move(r));
  }
  void resume() {
    Live r = std::move(preempted_.back());
    preempted_.pop_back();
    PagePlan plan;
    Result<RequestRef> ref = locked([&] { return sets_->resume(r.ref, r.tokens, r.extras, &plan); });
    if (!ref.ok()) {
      REQUIRE(ref.status().code() == StatusCode::resource_exhausted);
      preempted_.push_back(std::move(r));
      return;
    }
    r.ref = *ref;
    r.prefill_from = plan.cached_tokens;
    if (r.offload != Live::Offload::none && !restore(r, plan.cached_tokens)) {
      preempted_.push_back(std::move(r));  // recomputed later
      return;
    }
    live_.push_back(std::move(r));
  }
  void fork(std::size_t at) {
    if (live_[at].prefill_from >= 0) return;  // not computed yet
    Result<RequestRef> child = locked([&] { return sets_->fork(live_[at].ref); });
    if (!child.ok()) return;
    Live copy = live_[at];
    copy.ref = *child;
    remember(Origin::fork_child, copy, pages_of(copy), static_cast<std::int64_t>(copy.tokens.size()),
             rng_() % 2 == 0);
    live_.push_back(std::move(copy));
  }
  void preempt(std::size_t at) {
    Live r = std::move(live_[at]);
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(at));
    const std::int64_t computed = r.prefill_from >= 0 ? r.prefill_from : static_cast<std::int64_t>(r.tokens.size());
    if (computed > 0) remember(Origin::preempted, r, pages_of(r), computed, rng_() % 2 == 0);
    if (r.prefill_from < 0) offload(r);  // swap-out or export when there is room
    REQUIRE(locked([&] { return sets_->preempt(r.ref); }).ok());
    r.prefill_from = -1;
    preempted_.push_back(std::move(r));
  }
  void finish(std::size_t at) {
    Live r = std::move(live_[at]);
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(at));
    const bool into_cache = r.prefill_from < 0 && rng_() % 4 != 0;  // some are aborted
    const auto pages = pages_of(r);
    const std::int64_t computed = r.prefill_from >= 0 ? r.prefill_from : static_cast<std::int64_t>(r.tokens.size());
    if (into_cache && computed >= page_size) {
      // A stale step of this request writing its last full page (now in the cache).
      const std::int64_t full = computed / page_size * page_size;
      remember(Origin::finished_cached, r, std::span(pages).first(static_cast<std::size_t>(full / page_size)),
               full, true);
    } else if (computed > 0) {
      remember(Origin::finished_freed, r, pages, computed, rng_() % 2 == 0);
    }
    std::vector<TokenId> tokens = into_cache ? r.tokens : std::vector<TokenId>{};
    if (threaded_) {
      const bool post_twice = rng_() % 16 == 0;  // injected: the completion path posts it twice
      expected_refusals_ += post_twice ? 1 : 0;
      completion_->push({shared_.get(), r.ref, std::move(tokens), r.extras, post_twice});
    } else {
      REQUIRE(sets_->finish(r.ref, tokens, r.extras).ok());
    }
    finished_refs_.push_back(r.ref);
    if (finished_refs_.size() > 32) finished_refs_.erase(finished_refs_.begin());
  }
  // --- Records that leave the cache --------------------------------------------------------
  void free_records() {
    free_slots_.clear();
    for (std::int32_t slot = 0; slot < host_slots; ++slot) free_slots_.push_back(slot);
    free_exports_.clear();
    for (std::int32_t b = 0; b < export_buffers; ++b) free_exports_.push_back(b);
  }
  // Moves pages[i] to or from records (the toy swap_pages / export / import); the statuses.
  std::vector<RequestStatus> launch_records(bool save, const std::vector<PageSwap>& moves,
                                            const std::vector<std::int32_t>& indices,
                                            const RecordIdentity& identity, bool swap) {
    REQUIRE(moves_.upload(moves).ok());
    REQUIRE(move_index_.upload(indices).ok());
    REQUIRE(move_statuses_.fill_bytes(0x5A).ok());
    const auto count = static_cast<std::int32_t>(moves.size());
    unsigned char* records = swap ? slots_.data() : exports_.data();
    const rt::LaunchConfig config{dim3(1), dim3(max_request_pages), 0, nullptr};
    if (save) {
      REQUIRE(rt::launch(toy_save_kernel, config, static_cast<const PageSwap*>(moves_.data()), count, identity,
                         static_cast<const std::int32_t*>(move_index_.data()), tags_.data(), num_pages,
                         static_cast<const std::uint32_t*>(kv_.data()), static_cast<const PageFillWord*>(tags_.fills()),
                         records, move_statuses_.data())
                  .ok());
    } else {
      REQUIRE(rt::launch(toy_restore_kernel, config, static_cast<const PageSwap*>(moves_.data()), count, identity,
                         static_cast<const std::int32_t*>(move_index_.data()), tags_.data(), num_pages, kv_.data(),
                         tags_.fills(), static_cast<const unsigned char*>(records), move_statuses_.data(),
                         record_checks_)
                  .ok());
    }
    std::vector<RequestStatus> statuses(moves.size());
    REQUIRE(copy_statuses_to_host(move_statuses_.data(), statuses, nullptr).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    return statuses;
  }
  // Preemption that keeps the KV: swap-out into host slots, or export into a buffer, under
  // this request's identity and a fresh sequence number. The tags are synced first and the
  // records written before preempt releases the pages (the per-step order of docs/kv.md).
  void offload(Live& r) {
    const auto pages = pages_of(r);
    const bool swap = rng_() % 2 == 0;
    std::vector<std::int32_t> where;
    if (swap) {
      if (free_slots_.size() < pages.size()) return;
      std::shuffle(free_slots_.begin(), free_slots_.end(), rng_);
      where.assign(free_slots_.end() - static_cast<std::ptrdiff_t>(pages.size()), free_slots_.end());
    } else {
      if (free_exports_.empty()) return;
      std::shuffle(free_exports_.begin(), free_exports_.end(), rng_);
      where = {free_exports_.back()};
    }
    locked([&] { REQUIRE(tags_.sync(*pool_, nullptr).ok()); });
    const RecordIdentity identity{locked([&] { return pool_->tag_base(); }), r.ref.writer, ++sequence_};
    std::vector<PageSwap> moves;
    std::vector<std::int32_t> indices;
    for (std::size_t i = 0; i < pages.size(); ++i) {
      const auto at = static_cast<std::int32_t>(i);
      moves.push_back(PageSwap{pages[i].id, pages[i].tag, r.ref.writer,
                               swap ? where[i] : where[0] * max_request_pages + at});
      indices.push_back(swap ? where[i] : at);
    }
    const auto statuses = launch_records(true, moves, indices, identity, swap);
    ++totals_.offloads;
    if (!std::all_of(statuses.begin(), statuses.end(), [](const RequestStatus& st) { return request_ok(st); })) {
      ++totals_.offload_false_aborts;
      return;
    }
    r.offload = swap ? Live::Offload::swap : Live::Offload::exported;
    r.records = where;
    r.record_identity = identity;
    r.saved.clear();
    for (const PageHandle& page : pages) {
      const auto at = model_.begin() + static_cast<std::ptrdiff_t>(page.id) * page_size;
      r.saved.emplace_back(at, at + page_size);
    }
    if (swap) {
      free_slots_.resize(free_slots_.size() - pages.size());
      for (const std::int32_t slot : where) slot_writer_[static_cast<std::size_t>(slot)] = r.ref.writer;
    } else {
      free_exports_.pop_back();
      export_owner_[static_cast<std::size_t>(where[0])] = {r.ref.writer, static_cast<std::int32_t>(pages.size())};
    }
  }
  // Resume of an offloaded request: its records are swapped in (imported) into the pages
  // [cached, size) the resume gave it, under its new identity, expecting the old one. 1 in 2
  // restores is injected: one page's swap-in reads a host slot holding another request's
  // record, or the import reads another request's export buffer of the same shape. A refused
  // restore (or one that failed) gives the pages back for recomputation: false.
  bool restore(Live& r, std::int64_t cached) {
    const auto pages = pages_of(r);
    const bool swap = r.offload == Live::Offload::swap;
    std::vector<std::int32_t> slots = swap ? r.records : std::vector<std::int32_t>{};
    std::int32_t buffer = swap ? -1 : r.records[0];
    if (swap) {
      free_slots_.insert(free_slots_.end(), r.records.begin(), r.records.end());
    } else {
      free_exports_.push_back(buffer);
    }
    r.offload = Live::Offload::none;
    REQUIRE(r.saved.size() == pages.size());
    REQUIRE((!swap || slots.size() == pages.size()));
    const auto first = static_cast<std::size_t>(cached / page_size);
    if (first >= pages.size()) return true;  // everything hit the cache
    std::string injected;
    if (rng_() % 2 == 0) {
      if (swap) {
        std::vector<std::int32_t> others;
        for (std::int32_t slot = 0; slot < host_slots; ++slot) {
          const WriterId w = slot_writer_[static_cast<std::size_t>(slot)];
          if (w != no_writer && w != r.record_identity.writer) others.push_back(slot);
        }
        if (!others.empty()) {
          slots[first + rng_() % (pages.size() - first)] = others[rng_() % others.size()];
          injected = "swap-in from a host slot holding another request's record";
        }
      } else {
        std::vector<std::int32_t> others;
        for (std::int32_t b = 0; b < export_buffers; ++b) {
          const auto& [w, n] = export_owner_[static_cast<std::size_t>(b)];
          if (b != buffer && w != no_writer && w != r.record_identity.writer &&
              n == static_cast<std::int32_t>(pages.size())) {
            others.push_back(b);
          }
        }
        if (!others.empty()) {
          buffer = others[rng_() % others.size()];
          injected = "import of another request's export buffer of the same shape";
        }
      }
    }
    locked([&] { REQUIRE(tags_.sync(*pool_, nullptr).ok()); });  // the new pages' tags and owner
    std::vector<PageSwap> moves;
    std::vector<std::int32_t> indices;
    for (std::size_t i = first; i < pages.size(); ++i) {
      const auto at = static_cast<std::int32_t>(i);
      moves.push_back(PageSwap{pages[i].id, pages[i].tag, r.ref.writer, swap ? slots[i] : buffer * max_request_pages + at});
      indices.push_back(swap ? slots[i] : at);
    }
    const auto statuses = launch_records(false, moves, indices, r.record_identity, swap);
    std::vector<std::uint32_t> kv(model_.size());
    REQUIRE(kv_.download(kv).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    bool all_ok = true, harmful = false;
    for (std::size_t m = 0; m < moves.size(); ++m) {
      const std::size_t i = first + m;
      if (!request_ok(statuses[m])) {
        all_ok = false;
        continue;
      }
      ++totals_.restored_pages;
      const auto filled = std::min<std::int64_t>(page_size, static_cast<std::int64_t>(r.tokens.size()) - static_cast<std::int64_t>(i) * page_size);
      for (std::int32_t t = 0; t < page_size; ++t) {
        const std::size_t at = static_cast<std::size_t>(pages[i].id) * page_size + static_cast<std::size_t>(t);
        const std::uint32_t want = r.saved[i][static_cast<std::size_t>(t)];
        if (kv[at] != want && t < filled) {
          if (injected.empty()) {
            ++totals_.unexplained_corruption;
          } else {
            harmful = true;  // the request now holds another request's tokens
          }
        }
        model_[at] = kv[at];
      }
    }
    if (injected.empty()) {
      ++totals_.restores;
      if (!all_ok) ++totals_.restore_false_aborts;
    } else {
      totals_.add(injected, !all_ok, harmful, false);
    }
    r.saved.clear();
    if (all_ok) {
      r.prefill_from = -1;  // nothing to recompute
      return true;
    }
    // Pages already restored hold their slots: give them all back and recompute later.
    REQUIRE(locked([&] { return sets_->preempt(r.ref); }).ok());
    return false;
  }

  // Host-side misuse: a second finish of a finished request, a finish by a non-holder.
  void misuse() {
    if (!finished_refs_.empty() && !threaded_) {
      const RequestRef again = finished_refs_[rng_() % finished_refs_.size()];
      const bool refused = !sets_->finish(again).ok();
      ++expected_refusals_;
      totals_.add("double release (host)", refused, !refused, false);
    }
    if (!live_.empty()) {
      RequestRef wrong = live_[rng_() % live_.size()].ref;
      wrong.writer += 1 + static_cast<WriterId>(rng_() % 1000);
      const bool refused = !locked([&] { return sets_->finish(wrong); }).ok();
      ++expected_refusals_;
      totals_.add("release by a non-holder (host)", refused, !refused, false);
    }
  }

  // --- One step -------------------------------------------------------------------------------
  struct Row {
    std::vector<PageHandle> pages;  // the table's entries (may be forged)
    std::int64_t tokens = 0;
    std::int32_t last_page_len_override = -1;
    std::vector<std::uint32_t> appended;  // values of the last tokens, written this step
    WriterId writer = no_writer;
    std::uint32_t expected_digest = 0;
    bool healthy = false;
    bool check_digest = true;
    std::string label;  // injected rows
    bool uncaught_is_harmful_read = false;  // it reads slots or entries that are not its own
    std::int32_t overrun_entries = 0;       // indptr runs this far past the table's entries
    // Where an injected write lands (for harm classification).
    PageId write_page = -1;
    std::int32_t write_slot = 0;
    std::uint32_t write_value = 0;
  };

  static std::uint32_t digest_of(std::span<const std::uint32_t> values) {
    std::uint32_t digest = 0;
    for (std::size_t t = 0; t < values.size(); ++t) digest = fold(digest, values[t], static_cast<std::int64_t>(t));
    return digest;
  }

  std::string classify(const Snapshot& snap) {
    if (snap.generation != generation_) return "earlier pool's table";
    bool tag_changed = false, near_max = false;
    bool other_writer = false;
    bool still_held = false;
    locked([&] {
      still_held = sets_->is_active(RequestRef{snap.slot, snap.writer});
      for (const PageHandle& page : snap.pages) {
        tag_changed |= pool_->tag(page.id) != page.tag;
        near_max |= pool_->max_tag() - page.tag < 3 || pool_->tag(page.id) >= pool_->max_tag() - 2;
        other_writer |= pool_->writer(page.id) != no_writer && pool_->writer(page.id) != snap.writer;
      }
    });
    const std::string origin = origin_names[static_cast<std::size_t>(snap.origin)];
    if (near_max && max_tag_ < 1000) return "tags near max_tag";
    if (tag_changed) {
      return snap.origin == Origin::finished_cached ? "after eviction + reuse"
                                                    : "after free + reallocation (" + origin + ")";
    }
    if (other_writer) return "page now writable by another (" + origin + ")";
    if (still_held) return "request still holds its pages (" + origin + ")";
    switch (snap.origin) {
      case Origin::finished_cached: return "stale write into a cached page";
      case Origin::copied_on_write: return "copy-on-write source after the copy";
      default: return "same generation (" + origin + ")";
    }
  }

  Row replay(const Snapshot& snap) {
    Row row;
    row.pages = snap.pages;
    row.tokens = snap.tokens;
    row.writer = snap.writer;
    row.expected_digest = digest_of(snap.values);
    row.label = classify(snap);
    if (snap.write) {
      const std::int64_t t = snap.tokens - 1;
      row.appended = {snap.values[static_cast<std::size_t>(t)]};
      row.write_page = snap.pages[static_cast<std::size_t>(t / page_size)].id;
      row.write_slot = static_cast<std::int32_t>(t % page_size);
      row.write_value = snap.values[static_cast<std::size_t>(t)];
      row.label += " write";
    } else {
      row.label += " read";
    }
    return row;
  }

  Row forged(int kind) {
    Row row;
    const Live& r = live_[rng_() % live_.size()];
    row.pages = pages_of(r);
    row.tokens = static_cast<std::int64_t>(r.tokens.size());
    row.writer = r.ref.writer;
    row.check_digest = false;
    const std::size_t at = rng_() % row.pages.size();
    switch (kind) {
      case 0:
        row.pages[at].id = rng_() % 2 == 0 ? num_pages + static_cast<PageId>(rng_() % 100) : -1 - static_cast<PageId>(rng_() % 5);
        row.label = "page id out of range";
        break;
      case 1:
        row.last_page_len_override = page_size + 1 + static_cast<std::int32_t>(rng_() % 3);
        row.label = "last_page_len > page_size";
        break;
      default:
        row.pages[at] = guard_page;
        row.label = "guard page inside the range";
        break;
    }
    return row;
  }

  // Bugs in the lengths of this step's own rows (device-held lengths and bounded rows catch
  // them): a table one token longer than the request (it reads a slot past its own, the page's
  // previous owner's token), one token shorter with this step's append (it overwrites the
  // request's own last token: the -1 replay), and an indptr running past the table's entries
  // into what an earlier, larger table left in the buffer.
  void inject_length_bugs(std::vector<Row>& rows) {
    std::vector<std::size_t> decoding;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (rows[i].healthy && rows[i].appended.size() == 1 && rows[i].tokens >= 2) decoding.push_back(i);
    }
    if (decoding.empty()) return;
    if (rows.size() < max_rows && rng_() % 3 == 0) {
      const Row& h = rows[decoding[rng_() % decoding.size()]];
      if (h.tokens % page_size != 0) {
        Row row;
        row.pages = h.pages;
        row.tokens = h.tokens + 1;
        row.writer = h.writer;
        row.check_digest = false;
        row.uncaught_is_harmful_read = true;
        row.label = "table length +1 (a slot past the request) read";
        rows.push_back(std::move(row));
      }
    }
    if (rows.size() < max_rows && rng_() % 3 == 0) {
      const Row& h = rows[decoding[rng_() % decoding.size()]];
      Row row;
      row.tokens = h.tokens - 1;
      row.pages.assign(h.pages.begin(), h.pages.begin() + static_cast<std::ptrdiff_t>((row.tokens + page_size - 1) / page_size));
      row.writer = h.writer;
      row.check_digest = false;
      const std::int64_t t = row.tokens - 1;  // a position that holds the request's own token
      row.write_page = row.pages[static_cast<std::size_t>(t / page_size)].id;
      row.write_slot = static_cast<std::int32_t>(t % page_size);
      row.write_value = static_cast<std::uint32_t>(rng_()) | 1u;
      row.appended = {row.write_value};
      row.label = "table length -1 (append over the request's own token) write";
      rows.push_back(std::move(row));
    }
    if (rows.size() < max_rows && rng_() % 3 == 0) {
      std::int64_t entries = 0;
      for (const Row& row : rows) entries += static_cast<std::int64_t>(row.pages.size());
      const Row& h = rows[decoding[rng_() % decoding.size()]];
      entries += static_cast<std::int64_t>(h.pages.size());
      if (entries < entries_high_water_) {
        Row row;
        row.pages = h.pages;
        row.tokens = h.tokens;
        row.writer = h.writer;
        row.check_digest = false;
        row.uncaught_is_harmful_read = true;
        row.overrun_entries = 1 + static_cast<std::int32_t>(rng_() % std::min<std::int64_t>(4, entries_high_water_ - entries));
        row.label = "indptr past the row into leftover entries read";
        rows.push_back(std::move(row));
      }
    }
  }

  void step() {
    ++totals_.steps;
    if (threaded_) (void)shared_->drain_releases();  // refusals are counted by the pool
    // Host events.
    if (rng_() % 997 == 0 && generation_ < 40) recreate_pool();
    const int admits = static_cast<int>(rng_() % 3);
    for (int i = 0; i < admits; ++i) admit();
    if (!preempted_.empty() && rng_() % 3 == 0) resume();
    if (!live_.empty() && rng_() % 9 == 0) fork(rng_() % live_.size());
    if (!live_.empty() && rng_() % 17 == 0) preempt(rng_() % live_.size());
    for (std::size_t i = live_.size(); i-- > 0;) {
      if ((live_[i].prefill_from < 0 && rng_() % 14 == 0) ||
          static_cast<std::int32_t>(live_[i].tokens.size()) >= max_tokens) {
        finish(i);
      }
    }
    if (rng_() % 5 == 0) misuse();
    if (!live_.empty() && rng_() % 4 == 0) {
      const Live& r = live_[rng_() % live_.size()];
      if (r.prefill_from < 0) remember(Origin::live, r, pages_of(r), static_cast<std::int64_t>(r.tokens.size()), false);
    }

    // Healthy rows: prefill what is not computed, or decode one token (copy-on-write first).
    std::vector<Row> rows;
    std::vector<PageCopy> copies;
    for (std::size_t i = 0; i < live_.size() && rows.size() < max_rows - 4; ++i) {
      Live& r = live_[i];
      Row row;
      row.healthy = true;
      row.writer = r.ref.writer;
      if (r.prefill_from >= 0) {
        row.appended.assign(r.values.begin() + r.prefill_from, r.values.end());
        r.prefill_from = -1;
      } else {
        const auto before = pages_of(r);
        Result<PagePlan> plan = locked([&] { return sets_->append(r.ref, 1); });
        if (!plan.ok()) {
          REQUIRE(plan.status().code() == StatusCode::resource_exhausted);
          row.appended.clear();  // no room this step: read only
        } else {
          r.tokens.push_back(static_cast<TokenId>(1 + rng_() % 40));
          fill_values(r);
          row.appended = {r.values.back()};
          if (plan->needs_copy) {
            copies.push_back(PageCopy{plan->copy_from.id, plan->copy_from.tag, plan->copy_to.id,
                                      plan->copy_to.tag, r.ref.writer, plan->copy_tokens});
            // The buggy engine keeps the old table and appends through it.
            Snapshot old{Origin::copied_on_write, generation_, r.ref.writer, r.ref.slot, before,
                         static_cast<std::int64_t>(r.tokens.size()), r.values, true};
            snapshots_.push_back(std::move(old));
            if (snapshots_.size() > 64) snapshots_.erase(snapshots_.begin());
          }
        }
      }
      row.pages = pages_of(r);
      row.tokens = static_cast<std::int64_t>(r.tokens.size());
      row.expected_digest = digest_of(r.values);
      rows.push_back(std::move(row));
    }
    // Injected rows.
    const int injected = static_cast<int>(rng_() % 5);
    std::vector<std::size_t> replayed;  // one row per snapshot: two rows of one request writing
                                        // the same slot in one launch would race
    for (int i = 0; i < injected && rows.size() < max_rows; ++i) {
      if (!snapshots_.empty() && rng_() % 4 != 0) {
        const std::size_t at = rng_() % snapshots_.size();
        const Snapshot& snap = snapshots_[at];
        if (snap.tokens <= 0 || std::find(replayed.begin(), replayed.end(), at) != replayed.end()) continue;
        replayed.push_back(at);
        rows.push_back(replay(snap));
      } else if (!live_.empty()) {
        rows.push_back(forged(static_cast<int>(rng_() % 3)));
      }
    }
    inject_length_bugs(rows);
    std::shuffle(rows.begin(), rows.end(), rng_);
    // The indptr overrun runs off the end of the table: its row goes last.
    std::stable_partition(rows.begin(), rows.end(), [](const Row& row) { return row.overrun_entries == 0; });
    run_device(rows, copies);
  }

  void run_device(std::vector<Row>& rows, const std::vector<PageCopy>& copies) {
    const auto batch = static_cast<std::int32_t>(rows.size());
    std::vector<std::int32_t> indptr{0}, last, append_indptr{0};
    std::vector<PageId> ids;
    std::vector<PageTag> tags;
    std::vector<WriterId> writers;
    std::vector<std::uint32_t> values;
    for (const Row& row : rows) {
      for (const PageHandle& page : row.pages) {
        ids.push_back(page.id);
        tags.push_back(page.tag);
      }
      indptr.push_back(static_cast<std::int32_t>(ids.size()) + row.overrun_entries);
      const auto count = static_cast<std::int64_t>(row.pages.size());
      last.push_back(row.last_page_len_override >= 0
                         ? row.last_page_len_override
                         : static_cast<std::int32_t>(count == 0 ? 0 : row.tokens - (count - 1) * page_size));
      values.insert(values.end(), row.appended.begin(), row.appended.end());
      append_indptr.push_back(static_cast<std::int32_t>(values.size()));
      writers.push_back(row.writer);
    }
    REQUIRE(static_cast<std::int64_t>(ids.size()) <= max_entries);
    entries_high_water_ = std::max<std::int64_t>(entries_high_water_, static_cast<std::int64_t>(ids.size()));
    const std::int32_t built = static_cast<std::int32_t>(ids.size());
    REQUIRE(num_entries_.upload(std::span<const std::int32_t>(&built, 1)).ok());
    const TableAge built_at = locked([&] { return table_age(*pool_); });
    // Injected: the engine forgets the step's sync. The device tags are then the previous
    // step's, and stale replays of pages changed since would pass; the table's age refuses
    // the whole step on the host before anything is launched, and the engine syncs and
    // checks again.
    const bool skip_sync = length_checks_ && rng_() % 40 == 0;
    if (!skip_sync) locked([&] { REQUIRE(tags_.sync(*pool_, nullptr).ok()); });
    REQUIRE(indptr_.upload(indptr).ok());
    REQUIRE(last_.upload(last).ok());
    REQUIRE(append_indptr_.upload(append_indptr).ok());
    if (!ids.empty()) {
      REQUIRE(indices_.upload(ids).ok());
      REQUIRE(expected_.upload(tags).ok());
    }
    REQUIRE(writers_.upload(writers).ok());
    if (!values.empty()) REQUIRE(values_.upload(values).ok());
    REQUIRE(statuses_.fill_bytes(0x5A).ok());
    REQUIRE(digests_.fill_bytes(0x5A).ok());
    PageTableView table{indptr_.data(), indices_.data(), last_.data(), expected_.data(),
                        batch, page_size, num_entries_.data(), max_entries};
    if (!length_checks_) {  // measuring what the length classes do without their checks
      table.num_entries = nullptr;
      table.entry_capacity = 0;
    }
    TagCheckArguments check{table, &tags_, statuses_.data(), nullptr};
    check.writers = writers_.data();
    check.append_indptr = append_indptr_.data();
    check.check_fill = length_checks_;
    if (length_checks_) {
      check.built_at = built_at;
      // The table carries its age to the device too (the check compares it with the age the
      // last sync uploaded there, for replays that skip the host).
      REQUIRE(age_.upload(std::span<const TableAge>(&built_at, 1)).ok());
      check.table.built_at = age_.data();
    }
    if (skip_sync) {
      const bool changed = locked([&] { return !pool_->dirty_pages().empty(); });
      if (rng_() % 2 == 0) {
        const Status refused = check_page_tags(check, nullptr);
        // Refused exactly when the pool changed since the last sync (and then nothing launched).
        const bool caught = refused.code() == StatusCode::failed_precondition;
        CHECK(caught == changed);
        if (changed) totals_.add("tag array not synced for a step (refused on the host)", caught, false, !caught);
      } else {
        // A captured graph replayed: no host code runs, so only the device compares the
        // table's age with the tags'. Every request is refused exactly when the pool changed.
        TagCheckArguments replay = check;
        replay.built_at = TableAge{};
        REQUIRE(check_page_tags(replay, nullptr).ok());
        std::vector<RequestStatus> got(rows.size());
        REQUIRE(copy_statuses_to_host(statuses_.data(), got, nullptr).ok());
        REQUIRE(rt::stream_synchronize(nullptr).ok());
        const bool all_refused = std::all_of(got.begin(), got.end(), [](const RequestStatus& st) {
          return st.state == RequestState::tags_not_synced;
        });
        const bool any_refused = std::any_of(got.begin(), got.end(), [](const RequestStatus& st) {
          return st.state == RequestState::tags_not_synced;
        });
        CHECK((changed ? all_refused : !any_refused));
        if (changed) {
          totals_.add("tag array not synced for a step (graph replay: refused on the device)",
                      all_refused, false, !all_refused);
        }
      }
      locked([&] { REQUIRE(tags_.sync(*pool_, nullptr).ok()); });
    }
    // Copy-on-write copies first (gated by their own verdicts): the check then sees the
    // copied pages' fills. Then the check, the appends, the reads (one stream: in order).
    if (!copies.empty()) {
      REQUIRE(copies_.upload(copies).ok());
      REQUIRE(rt::launch(toy_copy_kernel, rt::LaunchConfig{dim3(1), dim3(32), 0, nullptr},
                         static_cast<const PageCopy*>(copies_.data()),
                         static_cast<std::int32_t>(copies.size()), tags_.data(), num_pages,
                         kv_.data(), copy_statuses_.data(), tags_.fills())
                  .ok());
    }
    locked([&] { sets_->release_copy_sources(); });  // the copies are enqueued
    REQUIRE(check_page_tags(check, nullptr).ok());
    const rt::LaunchConfig rows_config{dim3(1), dim3(max_rows), 0, nullptr};
    REQUIRE(rt::launch(toy_append_kernel, rows_config, table,
                       static_cast<const RequestStatus*>(statuses_.data()),
                       static_cast<const std::int32_t*>(append_indptr_.data()),
                       static_cast<const std::uint32_t*>(values_.data()), kv_.data(), tags_.fills())
                .ok());
    REQUIRE(rt::launch(toy_read_kernel, rows_config, table,
                       static_cast<const RequestStatus*>(statuses_.data()),
                       static_cast<const std::uint32_t*>(kv_.data()), digests_.data())
                .ok());
    std::vector<RequestStatus> statuses(rows.size());
    std::vector<RequestStatus> copy_statuses(copies.size());
    std::vector<std::uint32_t> digests(rows.size());
    std::vector<std::uint32_t> kv(model_.size());
    REQUIRE(copy_statuses_to_host(statuses_.data(), statuses, nullptr).ok());
    if (!copies.empty()) REQUIRE(copy_statuses_to_host(copy_statuses_.data(), copy_statuses, nullptr).ok());
    REQUIRE(digests_.download(digests).ok());
    REQUIRE(kv_.download(kv).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());

    // The model: healthy copies and writes only.
    for (std::size_t i = 0; i < copies.size(); ++i) {
      ++totals_.copies;
      if (!request_ok(copy_statuses[i])) {
        ++totals_.copy_false_aborts;
        continue;
      }
      for (std::int32_t t = 0; t < copies[i].tokens; ++t) {
        model_[static_cast<std::size_t>(copies[i].dst) * page_size + t] =
            model_[static_cast<std::size_t>(copies[i].src) * page_size + t];
      }
    }
    // Slots a live or cached request reads: filled slots of held pages, all slots of cached ones.
    std::vector<std::int32_t> cared(static_cast<std::size_t>(num_pages), 0);
    locked([&] {
      for (PageId page = 1; page < num_pages; ++page) {
        if (pool_->is_cache_registered(page)) cared[static_cast<std::size_t>(page)] = page_size;
      }
    });
    for (std::size_t b = 0; b < rows.size(); ++b) {
      const Row& row = rows[b];
      if (!row.healthy) continue;
      ++totals_.healthy_rows;
      if (!request_ok(statuses[b])) {
        ++totals_.false_aborts;
        UNSCOPED_INFO("false abort: " << to_string(statuses[b].state) << " slot " << statuses[b].failed_slot);
        continue;
      }
      const auto appended = static_cast<std::int64_t>(row.appended.size());
      for (std::int64_t i = 0; i < appended; ++i) {
        const std::int64_t t = row.tokens - appended + i;
        model_[static_cast<std::size_t>(row.pages[static_cast<std::size_t>(t / page_size)].id) * page_size + t % page_size] =
            row.appended[static_cast<std::size_t>(i)];
      }
      if (digests[b] != row.expected_digest) ++totals_.wrong_healthy_reads;
    }
    for (const Live& r : live_) {
      const auto pages = pages_of(r);
      for (std::size_t i = 0; i < pages.size(); ++i) {
        const auto filled = static_cast<std::int32_t>(
            std::min<std::int64_t>(page_size, static_cast<std::int64_t>(r.tokens.size()) - static_cast<std::int64_t>(i) * page_size));
        auto& c = cared[static_cast<std::size_t>(pages[i].id)];
        if (r.prefill_from < 0) c = std::max(c, filled);
      }
    }
    // Injected rows: caught, or harmless, or harmful.
    for (std::size_t b = 0; b < rows.size(); ++b) {
      const Row& row = rows[b];
      if (row.healthy) continue;
      ++totals_.request_steps;
      const bool caught = !request_ok(statuses[b]);
      if (caught) CHECK(digests[b] == aborted_marker);
      bool harmful_write = false;
      if (!caught && row.write_page >= 0) {
        const std::size_t at = static_cast<std::size_t>(row.write_page) * page_size + static_cast<std::size_t>(row.write_slot);
        harmful_write = row.write_slot < cared[static_cast<std::size_t>(row.write_page)] && row.write_value != model_[at];
      }
      const bool harmful_read = !caught && (row.uncaught_is_harmful_read ||
                                            (row.check_digest && digests[b] != row.expected_digest));
      totals_.add(row.label, caught, harmful_write, harmful_read);
    }
    totals_.request_steps += totals_.healthy_rows - counted_healthy_;
    counted_healthy_ = totals_.healthy_rows;
    // Every slot a live or cached request reads holds what the model says.
    for (PageId page = 1; page < num_pages; ++page) {
      for (std::int32_t slot = 0; slot < cared[static_cast<std::size_t>(page)]; ++slot) {
        const std::size_t at = static_cast<std::size_t>(page) * page_size + static_cast<std::size_t>(slot);
        if (kv[at] != model_[at]) {
          ++totals_.unexplained_corruption;
          model_[at] = kv[at];  // count each corruption once
        }
      }
    }
    // The guard page is never written.
    for (std::int32_t slot = 0; slot < page_size; ++slot) {
      if (kv[static_cast<std::size_t>(slot)] != model_[static_cast<std::size_t>(slot)]) ++totals_.unexplained_corruption;
    }
    if (totals_.steps % 64 == 0) {
      locked([&] {
        REQUIRE(pool_->check_invariants().ok());
        REQUIRE(sets_->check_invariants().ok());
        REQUIRE(cache_->check_invariants().ok());
      });
    }
  }

  bool threaded_;
  PageTag max_tag_;
  std::mt19937_64 rng_;
  DeviceTagArray tags_;
  rt::DeviceBuffer<std::uint32_t> kv_;
  std::vector<std::uint32_t> model_;
  rt::DeviceBuffer<std::int32_t> indptr_, num_entries_, last_, append_indptr_;
  std::int64_t entries_high_water_ = 0;  // entries any earlier table left in the buffers
  // SLIMSERVE_KV_STRESS_NO_LENGTH_CHECKS=1 turns off device-held lengths and bounded rows, to
  // measure the harm of the length classes without them (the run then fails, as it should).
  bool length_checks_ = std::getenv("SLIMSERVE_KV_STRESS_NO_LENGTH_CHECKS") == nullptr;
  rt::DeviceBuffer<PageId> indices_;
  rt::DeviceBuffer<PageTag> expected_;
  rt::DeviceBuffer<WriterId> writers_;
  rt::DeviceBuffer<std::uint32_t> values_;
  rt::DeviceBuffer<RequestStatus> statuses_;
  rt::DeviceBuffer<std::uint32_t> digests_;
  rt::DeviceBuffer<PageCopy> copies_;
  rt::DeviceBuffer<RequestStatus> copy_statuses_;
  rt::DeviceBuffer<TableAge> age_;  // the table's age, uploaded with it (device-side check)
  rt::DeviceBuffer<unsigned char> slots_;    // [host_slots, toy_slot_bytes]: swap slots
  rt::DeviceBuffer<unsigned char> exports_;  // [export_buffers, max_request_pages, toy_slot_bytes]
  rt::DeviceBuffer<PageSwap> moves_;
  rt::DeviceBuffer<std::int32_t> move_index_;
  rt::DeviceBuffer<RequestStatus> move_statuses_;
  std::vector<std::int32_t> free_slots_, free_exports_;
  std::vector<WriterId> slot_writer_ = std::vector<WriterId>(host_slots, no_writer);  // whose record a slot holds
  std::vector<std::pair<WriterId, std::int32_t>> export_owner_ =
      std::vector<std::pair<WriterId, std::int32_t>>(export_buffers, {no_writer, 0});  // exporter, pages
  std::uint32_t sequence_ = 0;
  // SLIMSERVE_KV_STRESS_NO_RECORD_CHECKS=1: swap-in and import without the header check, to
  // measure what the record classes do without it (the run then fails, as it should).
  bool record_checks_ = std::getenv("SLIMSERVE_KV_STRESS_NO_RECORD_CHECKS") == nullptr;
  std::array<std::vector<TokenId>, 4> system_prompts_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<PrefixCache> cache_;
  std::unique_ptr<RequestPageSets> sets_;
  std::unique_ptr<SharedPagePool> shared_;
  std::unique_ptr<CompletionThread> completion_;
  int generation_ = 0;
  std::vector<Live> live_, preempted_;
  std::vector<RequestRef> finished_refs_;
  std::vector<Snapshot> snapshots_;
  std::uint64_t refused_before_ = 0;
  std::uint64_t expected_refusals_ = 0;
  std::uint64_t counted_healthy_ = 0;
  Totals totals_;

 public:
  /// Refusals the page sets counted (double releases, releases by non-holders, double posts
  /// through the completion thread), and how many the test injected.
  std::uint64_t refused_total() {
    if (completion_) completion_->flush();
    if (threaded_) (void)shared_->drain_releases();
    return refused_before_ + sets_->counts().refused;
  }
  std::uint64_t expected_refusals() const { return expected_refusals_; }
};

std::int64_t steps_per_configuration() {
  if (const char* steps = std::getenv("SLIMSERVE_KV_STRESS_STEPS")) return std::atoll(steps);
  return 400;
}

void report(const char* name, const Totals& t, std::uint64_t refused) {
  std::printf("\n== %s: %llu steps, %llu request-steps (%llu healthy rows), %llu pool "
              "re-creations, %llu copy-on-write copies\n",
              name, static_cast<unsigned long long>(t.steps),
              static_cast<unsigned long long>(t.request_steps),
              static_cast<unsigned long long>(t.healthy_rows),
              static_cast<unsigned long long>(t.recreations),
              static_cast<unsigned long long>(t.copies));
  std::printf("   false aborts %llu (copies %llu), wrong healthy reads %llu, unexplained "
              "corruption %llu, host refusals counted %llu\n",
              static_cast<unsigned long long>(t.false_aborts),
              static_cast<unsigned long long>(t.copy_false_aborts),
              static_cast<unsigned long long>(t.wrong_healthy_reads),
              static_cast<unsigned long long>(t.unexplained_corruption),
              static_cast<unsigned long long>(refused));
  std::printf("   offloads (swap-out / export) %llu (false aborts %llu), restores %llu (false aborts "
              "%llu), restored pages %llu\n",
              static_cast<unsigned long long>(t.offloads),
              static_cast<unsigned long long>(t.offload_false_aborts),
              static_cast<unsigned long long>(t.restores),
              static_cast<unsigned long long>(t.restore_false_aborts),
              static_cast<unsigned long long>(t.restored_pages));
  std::printf("   %-62s %9s %9s %9s %9s %9s\n", "class", "injected", "caught", "harmless",
              "bad write", "bad read");
  for (const auto& [label, c] : t.classes) {
    std::printf("   %-62s %9llu %9llu %9llu %9llu %9llu\n", label.c_str(),
                static_cast<unsigned long long>(c.injected), static_cast<unsigned long long>(c.caught),
                static_cast<unsigned long long>(c.harmless),
                static_cast<unsigned long long>(c.harmful_write),
                static_cast<unsigned long long>(c.harmful_read));
  }
}

void require_clean(const Totals& t) {
  CHECK(t.false_aborts == 0);
  CHECK(t.copy_false_aborts == 0);
  CHECK(t.offload_false_aborts == 0);
  CHECK(t.restore_false_aborts == 0);
  CHECK(t.wrong_healthy_reads == 0);
  CHECK(t.unexplained_corruption == 0);
  for (const auto& [label, c] : t.classes) {
    INFO(label);
    CHECK(c.harmful_write == 0);
    CHECK(c.harmful_read == 0);
  }
}

}  // namespace

TEST_CASE("engine stress: single-threaded pool, injected bugs of every class", "[kv][stress]") {
  const std::int64_t steps = steps_per_configuration();
  for (const PageTag max_tag : {PageTag{0xFFFFFFFFu}, PageTag{24}}) {
    Engine engine(false, max_tag, 901 + max_tag % 7);
    engine.run(steps);
    const std::uint64_t refused = engine.refused_total();
    report(max_tag == 24 ? "single-threaded pool, max_tag 24" : "single-threaded pool",
           engine.totals(), refused);
    CHECK(refused == engine.expected_refusals());
    require_clean(engine.totals());
    CHECK(engine.totals().classes.size() >= 8);
  }
}

TEST_CASE("engine stress: shared pool with a completion thread", "[kv][stress]") {
  const std::int64_t steps = steps_per_configuration();
  Engine engine(true, 0xFFFFFFFFu, 977);
  engine.run(steps);
  const std::uint64_t refused = engine.refused_total();
  report("shared pool + completion thread", engine.totals(), refused);
  CHECK(refused == engine.expected_refusals());
  require_clean(engine.totals());
}
