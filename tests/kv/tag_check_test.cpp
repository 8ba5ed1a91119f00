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
#include "support/device_buffers.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {

constexpr std::int32_t page_size = 16;

using slimserve_test::device_buffer;

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

TEST_CASE("tag check: the guard page inside a request's pages, tag-0 forgeries and bad shapes fail", "[kv][tagcheck]") {
  PagePool pool = std::move(PagePool::create(PagePoolOptions{64})).value();
  DeviceTagArray device_tags = std::move(DeviceTagArray::create(64)).value();
  const PageHandle a = *pool.allocate();
  // Hand-built tables (as an engine might): the guard page inside a request's range (padding
  // only belongs past its last page), tag-0 forgery, bad last_page_len.
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
  CHECK(statuses[0].state == RequestState::guard_page);     // real page, then page 0 in range
  CHECK(statuses[0].failed_slot == 1);
  CHECK(statuses[1].state == RequestState::stale_tag);      // tag 0 on a never-owned page
  CHECK(statuses[2].state == RequestState::bad_page_table); // last_page_len 17 > 16
  CHECK(statuses[3].state == RequestState::bad_page_table); // no pages but last_page_len 4
  CHECK(aborted == 4);
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
        if (rng() % 2 == 0) REQUIRE(pool.grant_write(held.back(), pool.new_writer()).ok());
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
    std::vector<DevicePageTag> on_device(num_pages);
    REQUIRE(rt::copy_async(on_device.data(), device_tags.data(), num_pages * sizeof(DevicePageTag),
                           rt::CopyDirection::device_to_host, nullptr)
                .ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    for (PageId page = 0; page < num_pages; ++page) {
      INFO("round " << round << " page " << page);
      REQUIRE(on_device[page].tag == pool.tag(page));
      REQUIRE(on_device[page].writer == pool.writer(page));
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

TEST_CASE("tag check: write ownership gates appends and reads of another request's writable pages", "[kv][tagcheck]") {
  PagePool pool = std::move(PagePool::create(PagePoolOptions{64})).value();
  DeviceTagArray device_tags = std::move(DeviceTagArray::create(64)).value();
  const WriterId r = pool.new_writer();
  const WriterId s = pool.new_writer();
  std::vector<PageHandle> rp(2);
  std::vector<PageHandle> sp(1);
  REQUIRE(pool.allocate(rp, r).ok());
  REQUIRE(pool.allocate(sp, s).ok());
  const PageHandle shared = *pool.allocate();
  REQUIRE(pool.share(shared).ok());  // two holders: read-only
  struct Row {
    std::vector<PageHandle> pages;
    std::int32_t tokens;
    std::int32_t appended;
    WriterId me;
    RequestState want;
    std::int32_t slot;
  };
  const std::vector<Row> rows{
      {rp, 20, 1, r, RequestState::ok, -1},                            // own pages, append
      {rp, 20, 0, s, RequestState::read_denied, 0},                    // reads R's writable page
      {{shared}, 5, 1, r, RequestState::write_denied, 0},              // append into a shared page
      {{shared}, 5, 0, r, RequestState::ok, -1},                       // reading it is fine
      {{shared, rp[1]}, 20, 4, r, RequestState::ok, -1},               // tokens 16..19: slot 1
      {{shared, rp[1]}, 20, 5, r, RequestState::write_denied, 0},      // token 15 is in slot 0
      {rp, 20, 0, no_writer, RequestState::read_denied, 0},            // nobody reads R's page
      {{shared, sp[0]}, 20, 0, r, RequestState::read_denied, 1},       // S's page in R's table
      {rp, 20, 21, r, RequestState::bad_page_table, 0},                // appends more than it has
  };
  const auto batch = static_cast<std::int32_t>(rows.size());
  std::vector<std::int32_t> indptr{0};
  std::vector<std::int32_t> last;
  std::vector<std::int32_t> append_indptr{0};
  std::vector<PageId> ids;
  std::vector<PageTag> tags;
  std::vector<WriterId> writers;
  for (const Row& row : rows) {
    for (const PageHandle& page : row.pages) {
      ids.push_back(page.id);
      tags.push_back(page.tag);
    }
    indptr.push_back(static_cast<std::int32_t>(ids.size()));
    last.push_back(row.tokens - (static_cast<std::int32_t>(row.pages.size()) - 1) * page_size);
    append_indptr.push_back(append_indptr.back() + row.appended);
    writers.push_back(row.me);
  }
  DeviceTable table(batch, static_cast<std::int64_t>(ids.size()));
  auto d_append = device_buffer<std::int32_t>(append_indptr.size());
  auto d_writers = device_buffer<WriterId>(writers.size());
  REQUIRE(device_tags.sync(pool, nullptr).ok());
  REQUIRE(table.indptr.upload(indptr).ok());
  REQUIRE(table.indices.upload(ids).ok());
  REQUIRE(table.tags.upload(tags).ok());
  REQUIRE(table.last_page_len.upload(last).ok());
  REQUIRE(d_append.upload(append_indptr).ok());
  REQUIRE(d_writers.upload(writers).ok());
  REQUIRE(table.statuses.fill_bytes(0x5A).ok());
  const PageTableView view{table.indptr.data(), table.indices.data(), table.last_page_len.data(),
                           table.tags.data(), batch, page_size};
  TagCheckArguments arguments{view, &device_tags, table.statuses.data(), table.aborted.data()};
  arguments.writers = d_writers.data();
  arguments.append_indptr = d_append.data();
  REQUIRE(check_page_tags(arguments, nullptr).ok());
  std::vector<RequestStatus> statuses(rows.size());
  std::int32_t aborted = -1;
  REQUIRE(copy_statuses_to_host(table.statuses.data(), statuses, nullptr).ok());
  REQUIRE(table.aborted.download(std::span<std::int32_t>(&aborted, 1)).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  std::int32_t expected_aborted = 0;
  for (std::size_t b = 0; b < rows.size(); ++b) {
    INFO("row " << b << ": " << to_string(statuses[b].state));
    CHECK(statuses[b].state == rows[b].want);
    CHECK(statuses[b].failed_slot == rows[b].slot);
    expected_aborted += rows[b].want == RequestState::ok ? 0 : 1;
  }
  CHECK(aborted == expected_aborted);

  // The 2-D form applies the same rules: row 2 (append into the shared page) fails there too.
  auto block_ids = device_buffer<PageId>(4);
  auto block_tags = device_buffer<PageTag>(4);
  auto seq_lens = device_buffer<std::int32_t>(2);
  REQUIRE(block_ids.upload(std::vector<PageId>{rp[0].id, rp[1].id, shared.id, guard_page_id}).ok());
  REQUIRE(block_tags.upload(std::vector<PageTag>{rp[0].tag, rp[1].tag, shared.tag, guard_page_tag}).ok());
  REQUIRE(seq_lens.upload(std::vector<std::int32_t>{20, 5}).ok());
  REQUIRE(d_append.upload(std::vector<std::int32_t>{0, 1, 2}).ok());
  REQUIRE(d_writers.upload(std::vector<WriterId>{r, r}).ok());
  BlockTagCheckArguments block{BlockTableView{block_ids.data(), block_tags.data(), seq_lens.data(), 2, 2, page_size},
                               &device_tags, table.statuses.data(), nullptr};
  block.writers = d_writers.data();
  block.append_indptr = d_append.data();
  REQUIRE(check_page_tags(block, nullptr).ok());
  std::vector<RequestStatus> block_statuses(2);
  REQUIRE(copy_statuses_to_host(table.statuses.data(), block_statuses, nullptr).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  CHECK(block_statuses[0].state == RequestState::ok);
  CHECK(block_statuses[1].state == RequestState::write_denied);
}

TEST_CASE("tag check: a row whose indptr leaves the entries built for it is refused", "[kv][tagcheck]") {
  auto rng = slimserve_test::make_rng(35);
  constexpr std::int32_t num_pages = 128;
  PagePool pool = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  DeviceTagArray device_tags = std::move(DeviceTagArray::create(num_pages)).value();
  PageTableStorage storage = std::move(PageTableStorage::create(8, 64)).value();
  // Step 1: a wide batch of read-only pages (other requests'), leaving its entries in the
  // buffers. Step 2: a smaller batch; its last row's end is then corrupted on the device to
  // run into step 1's leftovers, whose tags still match and whose pages are read-only:
  // without bounds the row passes and reads other requests' pages.
  std::vector<std::vector<PageHandle>> wide(6);
  std::vector<RequestPages> step1;
  for (auto& pages : wide) {
    pages.resize(static_cast<std::size_t>(3 + rng() % 6));
    REQUIRE(pool.allocate(pages).ok());
    step1.push_back({pages, static_cast<std::int64_t>(pages.size()) * page_size});
  }
  Result<PageTableView> host1 = build_page_table(step1, {page_size, num_pages}, storage.host());
  REQUIRE(host1.ok());
  REQUIRE(device_tags.sync(pool, nullptr).ok());
  REQUIRE(upload_page_table(*host1, num_pages, storage.device(), nullptr).ok());
  std::vector<RequestPages> step2{step1[0], step1[1]};
  step2[1].num_tokens -= page_size - 1 - static_cast<std::int64_t>(rng() % (page_size - 1));
  Result<PageTableView> host2 = build_page_table(step2, {page_size, num_pages}, storage.host());
  REQUIRE(host2.ok());
  const std::int32_t built = host2->indptr[2];
  REQUIRE(*storage.host().num_entries == built);
  Result<PageTableView> device2 = upload_page_table(*host2, num_pages, storage.device(), nullptr);
  REQUIRE(device2.ok());
  CHECK(device2->entry_capacity == 64);
  REQUIRE(device2->num_entries == storage.device().num_entries);
  auto statuses = device_buffer<RequestStatus>(2);
  auto run = [&] {
    REQUIRE(statuses.fill_bytes(0x5A).ok());
    REQUIRE(check_page_tags(TagCheckArguments{*device2, &device_tags, statuses.data(), nullptr}, nullptr).ok());
    std::vector<RequestStatus> got(2);
    REQUIRE(copy_statuses_to_host(statuses.data(), got, nullptr).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    return got;
  };
  std::vector<RequestStatus> got = run();
  CHECK(got[0].state == RequestState::ok);
  CHECK(got[1].state == RequestState::ok);
  const auto poke = [&](std::int32_t at, std::int32_t value) {
    REQUIRE(rt::copy_async(storage.device().indptr + at, &value, sizeof value,
                           rt::CopyDirection::host_to_device, nullptr)
                .ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
  };
  // Past the built entries into the leftovers (still inside the buffer).
  const std::int32_t into_leftovers = built + 1 + static_cast<std::int32_t>(rng() % 4);
  REQUIRE(into_leftovers <= host1->indptr[6]);
  poke(2, into_leftovers);
  got = run();
  CHECK(got[0].state == RequestState::ok);
  CHECK(got[1].state == RequestState::bad_page_table);
  // Past the buffer itself: refused before a single entry is read.
  poke(2, 64 + 5);
  got = run();
  CHECK(got[1].state == RequestState::bad_page_table);
  // A negative start.
  poke(2, built);
  poke(1, -2);
  got = run();
  CHECK(got[0].state == RequestState::bad_page_table);
  CHECK(got[1].state == RequestState::bad_page_table);
  // On the host, a table whose indptr disagrees with its own count is refused too.
  storage.host().indptr[2] = into_leftovers;
  CHECK(validate_page_table(*host2, num_pages).code() == StatusCode::out_of_range);
  storage.host().indptr[2] = built;
  CHECK(validate_page_table(*host2, num_pages).ok());
}

TEST_CASE("tag check: a table built after changes that were never synced is refused", "[kv][tagcheck]") {
  constexpr std::int32_t num_pages = 64;
  PagePool pool = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  DeviceTagArray device_tags = std::move(DeviceTagArray::create(num_pages)).value();
  PageTableStorage storage = std::move(PageTableStorage::create(4, 32)).value();
  auto statuses = device_buffer<RequestStatus>(2);
  std::vector<PageHandle> a(3), b(2);
  REQUIRE(pool.allocate(a).ok());
  REQUIRE(pool.allocate(b).ok());
  const auto check = [&](const std::vector<RequestPages>& requests, bool sync_first) {
    Result<PageTableView> host = build_page_table(requests, {page_size, num_pages}, storage.host());
    REQUIRE(host.ok());
    const TableAge built_at = table_age(pool);
    CHECK(built_at.epoch == pool.change_epoch());
    if (sync_first) REQUIRE(device_tags.sync(pool, nullptr).ok());
    Result<PageTableView> device = upload_page_table(*host, num_pages, storage.device(), nullptr);
    REQUIRE(device.ok());
    REQUIRE(statuses.fill_bytes(0x5A).ok());
    TagCheckArguments arguments{*device, &device_tags, statuses.data(), nullptr};
    arguments.built_at = built_at;
    return check_page_tags(arguments, nullptr);
  };
  const std::vector<RequestPages> batch{{a, 3 * page_size}, {b, page_size + 3}};
  // Never synced: refused on the host, nothing launched.
  Status never = check(batch, false);
  INFO(never.to_string());
  CHECK(never.code() == StatusCode::failed_precondition);
  CHECK(check(batch, true).ok());
  // The pool changes after the sync (b's last page freed and reused by another request):
  // a table built now is refused until the next sync. Without the epoch, the device would
  // still hold b's old tag and a replay of b's table would pass.
  REQUIRE(pool.release(b[1]).ok());
  const PageHandle reused = *pool.allocate();
  REQUIRE(reused.id == b[1].id);
  Status stale = check(batch, false);
  INFO(stale.to_string());
  CHECK(stale.code() == StatusCode::failed_precondition);
  CHECK(stale.to_string().find("epoch") != std::string::npos);
  // Built first, synced after (the documented order): accepted, and the device catches b.
  REQUIRE(check(batch, true).ok());
  std::vector<RequestStatus> got(2);
  REQUIRE(copy_statuses_to_host(statuses.data(), got, nullptr).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  CHECK(got[0].state == RequestState::ok);
  CHECK(got[1].state == RequestState::stale_tag);
  // A table of another pool against tags synced from this one: refused.
  PagePool other = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  std::vector<PageHandle> c(1);
  REQUIRE(other.allocate(c).ok());
  Result<PageTableView> foreign = build_page_table(std::vector<RequestPages>{{c, 4}}, {page_size, num_pages}, storage.host());
  REQUIRE(foreign.ok());
  Result<PageTableView> foreign_device = upload_page_table(*foreign, num_pages, storage.device(), nullptr);
  REQUIRE(foreign_device.ok());
  TagCheckArguments foreign_check{*foreign_device, &device_tags, statuses.data(), nullptr};
  foreign_check.built_at = table_age(other);
  CHECK(check_page_tags(foreign_check, nullptr).code() == StatusCode::failed_precondition);
  // Without an age the check runs as before (engines that do not record it).
  foreign_check.built_at = {};
  CHECK(check_page_tags(foreign_check, nullptr).ok());
}

TEST_CASE("tag check: a replayed check after a skipped sync is refused on the device", "[kv][tagcheck]") {
  constexpr std::int32_t num_pages = 64;
  PagePool pool = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  DeviceTagArray device_tags = std::move(DeviceTagArray::create(num_pages)).value();
  PageTableStorage storage = std::move(PageTableStorage::create(4, 32)).value();
  auto statuses = device_buffer<RequestStatus>(2);
  auto aborted = device_buffer<std::int32_t>(1);
  std::vector<PageHandle> a(3), b(2);
  REQUIRE(pool.allocate(a).ok());
  REQUIRE(pool.allocate(b).ok());
  const std::vector<RequestPages> batch{{a, 3 * page_size}, {b, page_size + 3}};
  // Builds the table with its age and runs the check as a captured graph's replay would: no
  // host-side age (arguments.built_at empty), only the words on the device.
  const auto replay = [&](PagePool& from, const std::vector<RequestPages>& requests, DeviceTagArray& tags) {
    Result<PageTableView> host = build_page_table(requests, {page_size, num_pages}, storage.host());
    REQUIRE(host.ok());
    *storage.host().built_at = table_age(from);
    Result<PageTableView> device = upload_page_table(*host, num_pages, storage.device(), nullptr);
    REQUIRE(device.ok());
    REQUIRE(device->built_at != nullptr);
    REQUIRE(statuses.fill_bytes(0x5A).ok());
    REQUIRE(aborted.fill_bytes(0x5A).ok());
    REQUIRE(check_page_tags(TagCheckArguments{*device, &tags, statuses.data(), aborted.data()}, nullptr).ok());
    std::vector<RequestStatus> got(requests.size());
    std::int32_t count = -1;
    REQUIRE(copy_statuses_to_host(statuses.data(), got, nullptr).ok());
    REQUIRE(aborted.download(std::span<std::int32_t>(&count, 1), nullptr).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    return std::pair{got, count};
  };
  // Never synced: the device word says epoch 0, every recorded age is newer.
  {
    const auto [got, count] = replay(pool, batch, device_tags);
    CHECK(got[0].state == RequestState::tags_not_synced);
    CHECK(got[1].state == RequestState::tags_not_synced);
    CHECK(count == 2);
  }
  REQUIRE(device_tags.sync(pool, nullptr).ok());
  {
    TableAge on_device{};
    REQUIRE(rt::copy_async(&on_device, device_tags.synced_age(), sizeof on_device,
                           rt::CopyDirection::device_to_host, nullptr).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    CHECK(on_device.epoch == pool.change_epoch());
    CHECK(on_device.pool == pool.tag_base());
    const auto [got, count] = replay(pool, batch, device_tags);
    CHECK(got[0].state == RequestState::ok);
    CHECK(got[1].state == RequestState::ok);
    CHECK(count == 0);
  }
  // b's last page is freed and reused by another request; the engine builds the next table but
  // skips the sync. The device tags still hold b's old tag, so without the age a stale replay
  // of b would pass: both requests are refused, and nothing may touch their pages.
  REQUIRE(pool.release(b[1]).ok());
  const PageHandle reused = *pool.allocate();
  REQUIRE(reused.id == b[1].id);
  {
    const auto [got, count] = replay(pool, batch, device_tags);
    CHECK(got[0].state == RequestState::tags_not_synced);
    CHECK(got[0].failed_slot == 0);
    CHECK(got[1].state == RequestState::tags_not_synced);
    CHECK(count == 2);
  }
  // After the sync the same replay passes the age check and b is caught by its tag.
  REQUIRE(device_tags.sync(pool, nullptr).ok());
  {
    const auto [got, count] = replay(pool, batch, device_tags);
    CHECK(got[0].state == RequestState::ok);
    CHECK(got[1].state == RequestState::stale_tag);
    CHECK(count == 1);
  }
  // A table of another pool against tags synced from this one (a re-created pool whose tags
  // were never synced): refused on the device.
  PagePool other = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  std::vector<PageHandle> c(1);
  REQUIRE(other.allocate(c).ok());
  {
    const auto [got, count] = replay(other, std::vector<RequestPages>{{c, 4}}, device_tags);
    CHECK(got[0].state == RequestState::tags_not_synced);
    CHECK(count == 1);
  }
  // Without a recorded age (epoch 0) the check runs as before.
  {
    Result<PageTableView> host = build_page_table(batch, {page_size, num_pages}, storage.host());
    REQUIRE(host.ok());
    *storage.host().built_at = TableAge{};
    REQUIRE(pool.release(a[0]).ok());  // unsynced change, but no age to compare
    Result<PageTableView> device = upload_page_table(*host, num_pages, storage.device(), nullptr);
    REQUIRE(device.ok());
    REQUIRE(statuses.fill_bytes(0x5A).ok());
    REQUIRE(check_page_tags(TagCheckArguments{*device, &device_tags, statuses.data(), nullptr}, nullptr).ok());
    std::vector<RequestStatus> got(2);
    REQUIRE(copy_statuses_to_host(statuses.data(), got, nullptr).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    CHECK(got[0].state == RequestState::ok);
    CHECK(got[1].state == RequestState::stale_tag);
  }
}

TEST_CASE("tag check: the 2-D form's age word refuses a replay after a skipped sync too", "[kv][tagcheck]") {
  constexpr std::int32_t num_pages = 64;
  PagePool pool = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  DeviceTagArray device_tags = std::move(DeviceTagArray::create(num_pages)).value();
  BlockTableStorage storage = std::move(BlockTableStorage::create(4, 5)).value();
  auto statuses = device_buffer<RequestStatus>(2);
  auto aborted = device_buffer<std::int32_t>(1);
  std::vector<PageHandle> a(3), b(2);
  REQUIRE(pool.allocate(a).ok());
  REQUIRE(pool.allocate(b).ok());
  const std::vector<RequestPages> batch{{a, 3 * page_size - 1}, {b, page_size + 1}};
  // As a captured graph's replay: the age only in the device word beside the view.
  const auto replay = [&](PagePool& from, const std::vector<RequestPages>& requests,
                          bool with_age) {
    Result<BlockTableView> host = build_block_table(requests, {page_size, num_pages}, storage.host());
    REQUIRE(host.ok());
    *storage.host().built_at = table_age(from);
    Result<BlockTableView> device =
        upload_block_table(*host, num_pages, storage.device(), nullptr, storage.host().built_at);
    REQUIRE(device.ok());
    REQUIRE(statuses.fill_bytes(0x5A).ok());
    REQUIRE(aborted.fill_bytes(0x5A).ok());
    BlockTagCheckArguments check{*device, &device_tags, statuses.data(), aborted.data()};
    if (with_age) check.device_built_at = storage.device().built_at;
    REQUIRE(check_page_tags(check, nullptr).ok());
    std::vector<RequestStatus> got(requests.size());
    std::int32_t count = -1;
    REQUIRE(copy_statuses_to_host(statuses.data(), got, nullptr).ok());
    REQUIRE(aborted.download(std::span<std::int32_t>(&count, 1), nullptr).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    TableAge uploaded{};
    REQUIRE(rt::copy_async(&uploaded, storage.device().built_at, sizeof uploaded,
                           rt::CopyDirection::device_to_host, nullptr).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    CHECK(uploaded.epoch == from.change_epoch());  // upload_block_table copied the word
    CHECK(uploaded.pool == from.tag_base());
    return std::pair{got, count};
  };
  {  // never synced
    const auto [got, count] = replay(pool, batch, true);
    CHECK(got[0].state == RequestState::tags_not_synced);
    CHECK(got[1].state == RequestState::tags_not_synced);
    CHECK(count == 2);
  }
  REQUIRE(device_tags.sync(pool, nullptr).ok());
  {
    const auto [got, count] = replay(pool, batch, true);
    CHECK(got[0].state == RequestState::ok);
    CHECK(got[1].state == RequestState::ok);
    CHECK(count == 0);
  }
  // b's last page freed and reused, the sync skipped: the old tags would pass b's replay.
  REQUIRE(pool.release(b[1]).ok());
  const PageHandle reused = *pool.allocate();
  REQUIRE(reused.id == b[1].id);
  {
    const auto [got, count] = replay(pool, batch, true);
    CHECK(got[0].state == RequestState::tags_not_synced);
    CHECK(got[1].state == RequestState::tags_not_synced);
    CHECK(count == 2);
  }
  {  // without the word on the device the check runs as before (and misses it)
    const auto [got, count] = replay(pool, batch, false);
    CHECK(got[0].state == RequestState::ok);
    CHECK(got[1].state == RequestState::ok);
    CHECK(count == 0);
  }
  REQUIRE(device_tags.sync(pool, nullptr).ok());
  {
    const auto [got, count] = replay(pool, batch, true);
    CHECK(got[0].state == RequestState::ok);
    CHECK(got[1].state == RequestState::stale_tag);
    CHECK(got[1].failed_slot == 1);
    CHECK(count == 1);
  }
  PagePool other = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  std::vector<PageHandle> c(1);
  REQUIRE(other.allocate(c).ok());
  {  // another pool's table against these tags
    const auto [got, count] = replay(other, std::vector<RequestPages>{{c, 4}}, true);
    CHECK(got[0].state == RequestState::tags_not_synced);
    CHECK(count == 1);
  }
}
