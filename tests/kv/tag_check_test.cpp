// The GPU tag check and the device tag array, on the emulator (and a GPU when built as
// kv_tag_check_test_gpu): every failure kind, the first failing slot, guard padding, the abort
// count, scatter versus whole-array sync, and bad arguments.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/tag_check.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {

constexpr std::int32_t page_size = 16;

template <class T>
rt::DeviceBuffer<T> device_buffer(std::size_t count) {
  auto buffer = rt::DeviceBuffer<T>::create(count);
  REQUIRE(buffer.ok());
  return std::move(buffer).value();
}

/// Device-side page table storage for up to `max_batch` requests and `max_entries` pages, and
/// the check's outputs.
struct DeviceTable {
  rt::DeviceBuffer<std::int32_t> indptr, last_page_len;
  rt::DeviceBuffer<PageId> indices;
  rt::DeviceBuffer<PageTag> tags;
  rt::DeviceBuffer<RequestStatus> statuses;
  rt::DeviceBuffer<std::int32_t> aborted;
  std::int32_t max_batch;
  std::int64_t max_entries;
  DeviceTable(std::int32_t batch, std::int64_t entries)
      : indptr(device_buffer<std::int32_t>(batch + 1)),
        last_page_len(device_buffer<std::int32_t>(batch)),
        indices(device_buffer<PageId>(entries)),
        tags(device_buffer<PageTag>(entries)),
        statuses(device_buffer<RequestStatus>(batch)),
        aborted(device_buffer<std::int32_t>(1)),
        max_batch(batch),
        max_entries(entries) {}
  PageTableDeviceBuffers buffers() {
    return {indptr.data(), indices.data(), last_page_len.data(), tags.data(), max_batch,
            max_entries};
  }
};

/// Uploads a host CSR table, runs sync + check, returns the statuses and the abort count.
struct CheckResult {
  std::vector<RequestStatus> statuses;
  std::int32_t aborted = -1;
};
CheckResult run_check(PagePool& pool, DeviceTagArray& device_tags, DeviceTable& table,
                      const PageTableView& host_table) {
  REQUIRE(device_tags.sync(pool, nullptr).ok());
  Result<PageTableView> device_view =
      upload_page_table(host_table, pool.num_pages(), table.buffers(), nullptr);
  REQUIRE(device_view.ok());
  REQUIRE(table.statuses.fill_bytes(0x5A).ok());  // poison: every status must be written
  REQUIRE(table.aborted.fill_bytes(0x5A).ok());
  const Status launched = check_page_tags(
      TagCheckArguments{*device_view, &device_tags, table.statuses.data(), table.aborted.data()},
      nullptr);
  REQUIRE(launched.ok());
  CheckResult result;
  result.statuses.resize(static_cast<std::size_t>(host_table.batch_size));
  REQUIRE(copy_statuses_to_host(table.statuses.data(), result.statuses, nullptr).ok());
  REQUIRE(table.aborted.download(std::span<std::int32_t>(&result.aborted, 1), nullptr).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  return result;
}

struct HostCsr {
  std::vector<std::int32_t> indptr, last_page_len;
  std::vector<PageId> indices;
  std::vector<PageTag> tags;
  HostCsr(std::int32_t batch, std::int64_t entries)
      : indptr(batch + 1), last_page_len(batch), indices(entries), tags(entries) {}
  PageTableHostBuffers buffers() {
    return {indptr.data(), indices.data(), last_page_len.data(), tags.data(),
            static_cast<std::int32_t>(last_page_len.size()), static_cast<std::int64_t>(indices.size())};
  }
};

}  // namespace

TEST_CASE("tag check: stale and out-of-range entries are caught at their first slot", "[kv][tagcheck]") {
  auto rng = slimserve_test::make_rng(31);
  PagePool pool = std::move(PagePool::create(PagePoolOptions{512})).value();
  DeviceTagArray device_tags = std::move(DeviceTagArray::create(512)).value();
  // Ragged requests (0, 1, 15, 16, 17 tokens, and long ones crossing several 32-entry warps).
  const std::vector<std::int64_t> lengths{0, 1, 15, 16, 17, 40 * page_size + 3, 70 * page_size, 5};
  std::vector<std::vector<PageHandle>> pages(lengths.size());
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    pages[b].resize(static_cast<std::size_t>((lengths[b] + page_size - 1) / page_size));
    REQUIRE(pool.allocate(pages[b]).ok());
  }
  // Corrupt: request 5 gets a stale handle at a random slot past the first warp; request 6 a
  // freed-and-reused page at slot 0; request 7 keeps its pages but we free + reallocate one.
  const std::size_t stale_slot = std::uniform_int_distribution<std::size_t>(33, 39)(rng);
  const PageHandle victim = pages[5][stale_slot];
  REQUIRE(pool.release(victim).ok());
  const PageHandle new_owner = *pool.allocate();
  REQUIRE(new_owner.id == victim.id);  // the page moved on; pages[5] still holds the old handle
  const PageHandle reused = pages[6][0];
  REQUIRE(pool.release(reused).ok());
  REQUIRE(pool.allocate().ok());

  std::vector<RequestPages> requests;
  for (std::size_t b = 0; b < lengths.size(); ++b) requests.push_back({pages[b], lengths[b]});
  HostCsr host(16, 1024);
  Result<PageTableView> host_table = build_page_table(requests, {page_size, 512}, host.buffers());
  REQUIRE(host_table.ok());
  DeviceTable table(16, 1024);

  CheckResult result = run_check(pool, device_tags, table, *host_table);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    INFO("request " << b);
    if (b == 5) {
      CHECK(result.statuses[b].state == RequestState::stale_tag);
      CHECK(result.statuses[b].failed_slot == static_cast<std::int32_t>(stale_slot));
    } else if (b == 6) {
      CHECK(result.statuses[b].state == RequestState::stale_tag);
      CHECK(result.statuses[b].failed_slot == 0);
    } else {
      CHECK(result.statuses[b].state == RequestState::ok);
      CHECK(result.statuses[b].failed_slot == -1);
    }
  }
  CHECK(result.aborted == 2);
  std::vector<AbortedRequest> aborted;
  collect_aborted(result.statuses, aborted);
  REQUIRE(aborted.size() == 2);
  CHECK(aborted[0].request == 5);
  CHECK(aborted[1].request == 6);

  // Out of range on the device (only a table that bypassed the host check can carry it): write
  // a bad id straight over request 1's only page in the device indices.
  const PageId bad_id = 600;
  REQUIRE(rt::copy_async(table.indices.data() + host.indptr[1], &bad_id, sizeof(PageId),
                         rt::CopyDirection::host_to_device, nullptr)
              .ok());
  const PageTableView device_view{table.indptr.data(), table.indices.data(),
                                  table.last_page_len.data(), table.tags.data(),
                                  host_table->batch_size, page_size};
  REQUIRE(check_page_tags(TagCheckArguments{device_view, &device_tags, table.statuses.data(),
                                            nullptr},
                          nullptr)
              .ok());
  std::vector<RequestStatus> statuses(lengths.size());
  REQUIRE(copy_statuses_to_host(table.statuses.data(), statuses, nullptr).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  CHECK(statuses[1].state == RequestState::page_out_of_range);
  CHECK(statuses[1].failed_slot == 0);
}

TEST_CASE("tag check: guard padding passes, a guard id with another tag and bad shapes fail", "[kv][tagcheck]") {
  PagePool pool = std::move(PagePool::create(PagePoolOptions{64})).value();
  DeviceTagArray device_tags = std::move(DeviceTagArray::create(64)).value();
  const PageHandle a = *pool.allocate();
  // Hand-built tables (as an engine might): guard-padded, tag-0 forgery, bad last_page_len.
  std::vector<std::int32_t> indptr{0, 3, 4, 5, 5};
  // Page 50 was never allocated: its device tag is 0, so only the "tag 0 is the guard's" rule
  // catches a table that names it with tag 0.
  std::vector<PageId> indices{a.id, guard_page_id, guard_page_id, 50, a.id};
  std::vector<PageTag> tags{a.tag, guard_page_tag, guard_page_tag, never_owned_tag, a.tag};
  std::vector<std::int32_t> last{16, 3, 17, 4};
  DeviceTable table(4, 8);
  REQUIRE(device_tags.sync(pool, nullptr).ok());
  REQUIRE(table.indptr.upload(indptr).ok());
  REQUIRE(table.indices.upload(indices).ok());
  REQUIRE(table.tags.upload(tags).ok());
  REQUIRE(table.last_page_len.upload(last).ok());
  REQUIRE(table.statuses.fill_bytes(0x5A).ok());
  const PageTableView view{table.indptr.data(), table.indices.data(), table.last_page_len.data(),
                           table.tags.data(), 4, page_size};
  REQUIRE(check_page_tags(TagCheckArguments{view, &device_tags, table.statuses.data(),
                                            table.aborted.data()},
                          nullptr)
              .ok());
  std::vector<RequestStatus> statuses(4);
  std::int32_t aborted = -1;
  REQUIRE(copy_statuses_to_host(table.statuses.data(), statuses, nullptr).ok());
  REQUIRE(table.aborted.download(std::span<std::int32_t>(&aborted, 1)).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  CHECK(statuses[0].state == RequestState::ok);             // real page + guard padding
  CHECK(statuses[1].state == RequestState::stale_tag);      // tag 0 on a never-owned page
  CHECK(statuses[2].state == RequestState::bad_page_table); // last_page_len 17 > 16
  CHECK(statuses[3].state == RequestState::bad_page_table); // no pages but last_page_len 4
  CHECK(aborted == 3);
}

TEST_CASE("tag check: the device tag array follows the pool (scatter and whole copies)", "[kv][tagcheck]") {
  auto rng = slimserve_test::make_rng(32);
  constexpr std::int32_t num_pages = 300;
  PagePool pool = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  DeviceTagArray device_tags = std::move(DeviceTagArray::create(num_pages)).value();
  REQUIRE(device_tags.sync(pool, nullptr).ok());  // a new pool: everything dirty
  CHECK(device_tags.last_sync() == DeviceTagArray::LastSync::whole_array);
  std::vector<PageHandle> held;
  for (int round = 0; round < 6; ++round) {
    // Few changes in odd rounds (scatter), many in even rounds (whole array).
    const int changes = round % 2 == 1 ? 7 : 200;
    for (int i = 0; i < changes; ++i) {
      if (!held.empty() && (rng() % 2 == 0 || pool.available_pages() == 0)) {
        const std::size_t at = rng() % held.size();
        REQUIRE(pool.release(held[at]).ok());
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(at));
      } else {
        held.push_back(*pool.allocate());
      }
    }
    const std::size_t dirty = pool.dirty_pages().size();
    REQUIRE(device_tags.sync(pool, nullptr).ok());
    CHECK(pool.dirty_pages().empty());
    if (dirty > 0) {
      CHECK(device_tags.last_sync() == (static_cast<std::int32_t>(dirty) > device_tags.scatter_capacity()
                                            ? DeviceTagArray::LastSync::whole_array
                                            : DeviceTagArray::LastSync::scatter));
    }
    std::vector<PageTag> on_device(num_pages);
    REQUIRE(rt::copy_async(on_device.data(), device_tags.data(), num_pages * sizeof(PageTag),
                           rt::CopyDirection::device_to_host, nullptr)
                .ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    for (PageId page = 0; page < num_pages; ++page) {
      INFO("round " << round << " page " << page);
      REQUIRE(on_device[page] == pool.tag(page));
    }
  }
}

TEST_CASE("tag check: bad arguments are refused before any launch", "[kv][tagcheck]") {
  PagePool pool = std::move(PagePool::create(PagePoolOptions{8})).value();
  DeviceTagArray device_tags = std::move(DeviceTagArray::create(8)).value();
  CHECK(DeviceTagArray::create(1).status().code() == StatusCode::invalid_argument);
  PagePool other = std::move(PagePool::create(PagePoolOptions{9})).value();
  CHECK(device_tags.sync(other, nullptr).code() == StatusCode::invalid_argument);
  DeviceTable table(2, 4);
  PageTableView view{table.indptr.data(), table.indices.data(), table.last_page_len.data(),
                     table.tags.data(), 2, page_size};
  CHECK(check_page_tags(TagCheckArguments{view, nullptr, table.statuses.data(), nullptr}, nullptr)
            .code() == StatusCode::invalid_argument);
  CHECK(check_page_tags(TagCheckArguments{view, &device_tags, nullptr, nullptr}, nullptr).code() ==
        StatusCode::invalid_argument);
  view.page_size = 0;
  CHECK(check_page_tags(TagCheckArguments{view, &device_tags, table.statuses.data(), nullptr},
                        nullptr)
            .code() == StatusCode::invalid_argument);
}

TEST_CASE("tag check: the 2-D block-table form gives the same verdicts", "[kv][tagcheck]") {
  auto rng = slimserve_test::make_rng(33);
  constexpr std::int32_t num_pages = 256;
  constexpr std::int32_t width = 48;  // more than one warp of entries per row
  PagePool pool = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  DeviceTagArray device_tags = std::move(DeviceTagArray::create(num_pages)).value();
  const std::vector<std::int64_t> lengths{0, 1, page_size, page_size + 1, 40 * page_size - 1, 45 * page_size};
  std::vector<std::vector<PageHandle>> pages(lengths.size());
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    pages[b].resize(static_cast<std::size_t>((lengths[b] + page_size - 1) / page_size));
    REQUIRE(pool.allocate(pages[b]).ok());
  }
  const std::size_t stale_slot = std::uniform_int_distribution<std::size_t>(32, 44)(rng);
  REQUIRE(pool.release(pages[5][stale_slot]).ok());
  REQUIRE(pool.allocate().ok());  // the page has a new owner
  std::vector<RequestPages> requests;
  for (std::size_t b = 0; b < lengths.size(); ++b) requests.push_back({pages[b], lengths[b]});
  std::vector<PageId> ids(8 * width);
  std::vector<PageTag> tags(8 * width);
  std::vector<std::int32_t> lens(8);
  Result<BlockTableView> host = build_block_table(requests, {page_size, num_pages},
                                                  {ids.data(), tags.data(), lens.data(), 8, width});
  REQUIRE(host.ok());
  auto d_ids = device_buffer<PageId>(ids.size());
  auto d_tags = device_buffer<PageTag>(tags.size());
  auto d_lens = device_buffer<std::int32_t>(lens.size());
  auto d_status = device_buffer<RequestStatus>(8);
  auto d_aborted = device_buffer<std::int32_t>(1);
  REQUIRE(device_tags.sync(pool, nullptr).ok());
  Result<BlockTableView> table = upload_block_table(
      *host, num_pages, {d_ids.data(), d_tags.data(), d_lens.data(), 8, width}, nullptr);
  REQUIRE(table.ok());
  REQUIRE(d_status.fill_bytes(0x5A).ok());
  REQUIRE(check_page_tags(BlockTagCheckArguments{*table, &device_tags, d_status.data(),
                                                 d_aborted.data()},
                          nullptr)
              .ok());
  std::vector<RequestStatus> statuses(lengths.size());
  std::int32_t aborted = -1;
  REQUIRE(copy_statuses_to_host(d_status.data(), statuses, nullptr).ok());
  REQUIRE(d_aborted.download(std::span<std::int32_t>(&aborted, 1)).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    INFO("request " << b);
    if (b == 5) {
      CHECK(statuses[b].state == RequestState::stale_tag);
      CHECK(statuses[b].failed_slot == static_cast<std::int32_t>(stale_slot));
    } else {
      CHECK(statuses[b].state == RequestState::ok);
      CHECK(statuses[b].failed_slot == -1);
    }
  }
  CHECK(aborted == 1);
  // A seq_len beyond the row (only a table that skipped the host check can carry it).
  const std::int32_t too_long = (width + 1) * page_size;
  REQUIRE(rt::copy_async(d_lens.data() + 2, &too_long, sizeof(too_long),
                         rt::CopyDirection::host_to_device, nullptr)
              .ok());
  REQUIRE(check_page_tags(BlockTagCheckArguments{*table, &device_tags, d_status.data(), nullptr},
                          nullptr)
              .ok());
  REQUIRE(copy_statuses_to_host(d_status.data(), statuses, nullptr).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  CHECK(statuses[2].state == RequestState::bad_page_table);
}
