// Device-held lengths: the append, copy and import kernels record each page's fill on the
// device, and the tag check (check_fill) refuses a row that claims more tokens than its pages
// hold in their current generation (+1: another owner's token) and an append that does not
// start at the next unwritten slot (-1 or a replay: it would overwrite a written token).
// Real kernels on the emulator (and a GPU in the _gpu twin); fills are only ever written by
// them.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "slimserve/attention/append.hpp"
#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_movement.hpp"
#include "slimserve/kv/page_pool.hpp"
#include "slimserve/kv/tag_check.hpp"
#include "support/device_buffers.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {

constexpr std::int32_t num_pages = 32;
constexpr std::int32_t page_size = 16;
constexpr std::int32_t heads = 1;
constexpr std::int32_t head_dim = 64;

using slimserve_test::device_buffer;
using slimserve_test::upload;

/// A BF16 cache, a pool and its device tags: enough for real appends, copies and imports.
struct World {
  PagePool pool = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  DeviceTagArray tags = std::move(DeviceTagArray::create(num_pages)).value();
  rt::DeviceBuffer<std::uint16_t> k = device_buffer<std::uint16_t>(num_pages * page_size * heads * head_dim);
  rt::DeviceBuffer<std::uint16_t> v = device_buffer<std::uint16_t>(num_pages * page_size * heads * head_dim);
  std::mt19937_64 rng = slimserve_test::make_rng(91);
  attention::PagedKVCacheView cache() {
    attention::PagedKVCacheView view;
    view.k_pages = k.data();
    view.v_pages = v.data();
    view.num_pages = num_pages;
    view.page_size = page_size;
    view.num_kv_heads = heads;
    view.head_dim = head_dim;
    return view;
  }
  World() {
    REQUIRE(k.fill_bytes(0x3C).ok());
    REQUIRE(v.fill_bytes(0x3C).ok());
  }
};

/// One request's row: its pages, the tokens the table claims, and how many it appends.
struct Row {
  std::vector<PageHandle> pages;
  std::int64_t tokens = 0;
  std::int32_t appended = 0;
  WriterId writer = no_writer;
};

/// Builds, uploads and checks one step's table with check_fill; when `append` is set, runs
/// append_kv with the fills for the rows the check let through. Returns the statuses.
std::vector<RequestStatus> step(World& w, const std::vector<Row>& rows, bool append) {
  std::vector<RequestPages> requests;
  std::vector<std::int32_t> append_indptr{0};
  std::vector<WriterId> writers;
  for (const Row& r : rows) {
    requests.push_back({r.pages, r.tokens});
    append_indptr.push_back(append_indptr.back() + r.appended);
    writers.push_back(r.writer);
  }
  PageTableStorage storage = std::move(PageTableStorage::create(8, 64)).value();
  Result<PageTableView> host = build_page_table(requests, {page_size, num_pages}, storage.host());
  REQUIRE(host.ok());
  REQUIRE(w.tags.sync(w.pool, nullptr).ok());
  Result<PageTableView> table = upload_page_table(*host, num_pages, storage.device(), nullptr);
  REQUIRE(table.ok());
  auto d_append = upload(append_indptr);
  auto d_writers = upload(writers);
  auto statuses = device_buffer<RequestStatus>(rows.size());
  REQUIRE(statuses.fill_bytes(0x5A).ok());
  TagCheckArguments check{*table, &w.tags, statuses.data(), nullptr, d_writers.data(), d_append.data()};
  check.check_fill = true;
  REQUIRE(check_page_tags(check, nullptr).ok());
  const std::int32_t new_tokens = append_indptr.back();
  if (append && new_tokens > 0) {
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(new_tokens) * heads * head_dim);
    for (auto& b : bits) b = static_cast<std::uint16_t>(0x3F00 | (w.rng() & 0xFF));  // ~[0.5, 1)
    auto k_new = upload(bits);
    auto v_new = upload(bits);
    attention::AppendArguments a;
    a.cache = w.cache();
    a.table = *table;
    a.request_status = statuses.data();
    a.k_new = k_new.data();
    a.v_new = v_new.data();
    a.num_tokens = new_tokens;
    a.append_indptr = d_append.data();
    a.page_fills = w.tags.fills();
    REQUIRE(attention::append_kv(a, nullptr).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
  }
  std::vector<RequestStatus> got(rows.size());
  REQUIRE(copy_statuses_to_host(statuses.data(), got, nullptr).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  return got;
}

std::vector<PageFillWord> fills(World& w) {
  std::vector<PageFillWord> host(num_pages);
  REQUIRE(rt::copy_async(host.data(), w.tags.fills(), host.size() * sizeof(PageFillWord),
                         rt::CopyDirection::device_to_host, nullptr)
              .ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  return host;
}

Row admit(World& w, std::int64_t tokens) {
  Row r;
  r.writer = w.pool.new_writer();
  r.pages.resize(static_cast<std::size_t>((tokens + page_size - 1) / page_size));
  REQUIRE(w.pool.allocate(r.pages, r.writer).ok());
  r.tokens = tokens;
  r.appended = static_cast<std::int32_t>(tokens);  // prefill writes them all
  return r;
}

RequestState state_of(World& w, const Row& row, bool append = false) {
  return step(w, {row}, append)[0].state;
}

}  // namespace

TEST_CASE("device-held lengths: appends record fills; +1 and -1 rows are refused", "[kv][lengths]") {
  World w;
  // Prefill 20 tokens (16 + 4): the check passes (fresh pages, nothing written yet), the
  // append records both pages' fills under their tags.
  Row a = admit(w, 20);
  REQUIRE(state_of(w, a, true) == RequestState::ok);
  std::vector<PageFillWord> f = fills(w);
  CHECK(f[static_cast<std::size_t>(a.pages[0].id)] == pack_page_fill(a.pages[0].tag, 16));
  CHECK(f[static_cast<std::size_t>(a.pages[1].id)] == pack_page_fill(a.pages[1].tag, 4));
  // Decode: 21 tokens, the last one appended at the next unwritten slot.
  Row decode = a;
  decode.tokens = 21;
  decode.appended = 1;
  REQUIRE(state_of(w, decode, true) == RequestState::ok);
  CHECK(fills(w)[static_cast<std::size_t>(a.pages[1].id)] == pack_page_fill(a.pages[1].tag, 5));
  a = decode;
  // Reads of what was written pass, shorter reads too (the request's own tokens).
  Row read = a;
  read.appended = 0;
  CHECK(state_of(w, read) == RequestState::ok);
  read.tokens = 18;
  CHECK(state_of(w, read) == RequestState::ok);
  // +1: one slot past the request, read or appended after.
  read.tokens = 22;
  RequestStatus s = step(w, {read}, false)[0];
  CHECK(s.state == RequestState::unwritten_slots);
  CHECK(s.failed_slot == 1);
  Row plus_one = a;
  plus_one.tokens = 23;
  plus_one.appended = 1;  // appends at 22, but 21 was never written
  CHECK(state_of(w, plus_one, true) == RequestState::unwritten_slots);
  // -1 and replays: the append position is a written slot (the request's own earlier token).
  Row minus_one = a;
  minus_one.tokens = 21;
  minus_one.appended = 1;  // appends at 20, which holds a token
  CHECK(state_of(w, minus_one, true) == RequestState::append_not_next);
  Row replay = a;
  replay.tokens = 19;
  replay.appended = 2;
  CHECK(state_of(w, replay, true) == RequestState::append_not_next);
  // Nothing the refused rows did moved a fill.
  CHECK(fills(w)[static_cast<std::size_t>(a.pages[1].id)] == pack_page_fill(a.pages[1].tag, 5));
  // A batch: the healthy row passes beside the refused ones.
  Row healthy = a;
  healthy.tokens = 22;
  healthy.appended = 1;
  std::vector<RequestStatus> batch = step(w, {minus_one, healthy, read}, true);
  CHECK(batch[0].state == RequestState::append_not_next);
  CHECK(batch[1].state == RequestState::ok);
  CHECK(batch[2].state == RequestState::unwritten_slots);  // the check runs before the append
  CHECK(state_of(w, read) == RequestState::ok);  // now 22 tokens are written
}

TEST_CASE("device-held lengths: a page with a new owner holds nothing written", "[kv][lengths]") {
  World w;
  Row a = admit(w, 28);
  REQUIRE(state_of(w, a, true) == RequestState::ok);
  // The last page is freed and handed to another request (new tag): a table claiming the
  // previous owner's tokens in it is refused until the new owner writes them.
  const PageHandle old_last = a.pages[1];
  REQUIRE(w.pool.release(old_last).ok());
  Row b;
  b.writer = w.pool.new_writer();
  b.pages.resize(1);
  REQUIRE(w.pool.allocate(b.pages, b.writer).ok());
  REQUIRE(b.pages[0].id == old_last.id);
  b.tokens = 12;
  CHECK(state_of(w, b) == RequestState::unwritten_slots);
  b.appended = 12;
  CHECK(state_of(w, b, true) == RequestState::ok);
  b.appended = 0;
  CHECK(state_of(w, b) == RequestState::ok);
}

TEST_CASE("device-held lengths: copy-on-write and import record the pages they write", "[kv][lengths]") {
  World w;
  Row parent = admit(w, 21);
  REQUIRE(state_of(w, parent, true) == RequestState::ok);
  // Copy-on-write of the shared last page (5 tokens) into a fresh page of the child.
  Row child = parent;
  child.writer = w.pool.new_writer();
  REQUIRE(w.pool.share(parent.pages[0]).ok());  // shared: read-only for both
  REQUIRE(w.pool.share(parent.pages[1]).ok());
  Result<PageHandle> copy_to = w.pool.allocate();
  REQUIRE(copy_to.ok());
  REQUIRE(w.pool.grant_write(*copy_to, child.writer).ok());
  child.pages[1] = *copy_to;
  REQUIRE(w.tags.sync(w.pool, nullptr).ok());
  const std::vector<PageCopy> copies{{parent.pages[1].id, parent.pages[1].tag, copy_to->id, copy_to->tag, child.writer, 5}};
  REQUIRE(check_page_copies(copies, w.cache()).ok());
  auto d_copies = upload(copies);
  auto copy_status = device_buffer<RequestStatus>(1);
  // Before the copy the child's page holds nothing: its table is refused.
  Row child_read = child;
  child_read.appended = 0;
  CHECK(state_of(w, child_read) == RequestState::unwritten_slots);
  REQUIRE(copy_pages(CopyPagesArguments{w.cache(), &w.tags, d_copies.data(), 1, copy_status.data()}, nullptr).ok());
  CHECK(fills(w)[static_cast<std::size_t>(copy_to->id)] == pack_page_fill(copy_to->tag, 5));
  CHECK(state_of(w, child_read) == RequestState::ok);
  child.tokens = 22;
  child.appended = 1;
  CHECK(state_of(w, child, true) == RequestState::ok);

  // Export the parent's two pages, import them into fresh pages of a new request: the import
  // records 16 and 5 slots, so the importer decodes at slot 21.
  const std::vector<PageId> ids{parent.pages[0].id, parent.pages[1].id};
  const std::vector<PageTag> tag_list{parent.pages[0].tag, parent.pages[1].tag};
  auto d_ids = upload(ids);
  auto d_tags = upload(tag_list);
  const std::int64_t bytes = export_buffer_bytes(w.cache(), 2);
  auto buffer = device_buffer<unsigned char>(static_cast<std::size_t>(bytes));
  auto status = device_buffer<RequestStatus>(1);
  REQUIRE(export_request(ExportRequestArguments{w.cache(), &w.tags, RequestPagesView{d_ids.data(), d_tags.data(), 2, 21, parent.writer},
                                                buffer.data(), bytes, status.data(), {}},
                         nullptr)
              .ok());
  Row imported;
  imported.writer = w.pool.new_writer();
  imported.pages.resize(2);
  REQUIRE(w.pool.allocate(imported.pages, imported.writer).ok());
  imported.tokens = 21;
  REQUIRE(w.tags.sync(w.pool, nullptr).ok());
  const std::vector<PageId> in_ids{imported.pages[0].id, imported.pages[1].id};
  const std::vector<PageTag> in_tags{imported.pages[0].tag, imported.pages[1].tag};
  auto d_in_ids = upload(in_ids);
  auto d_in_tags = upload(in_tags);
  CHECK(state_of(w, imported) == RequestState::unwritten_slots);
  // The export named the parent (its default identity: this pool, the exporter, sequence 0).
  REQUIRE(import_request(ImportRequestArguments{w.cache(), &w.tags, RequestPagesView{d_in_ids.data(), d_in_tags.data(), 2, 21, imported.writer},
                                                buffer.data(), bytes, describe_export(w.cache(), 2, 21), status.data(),
                                                RecordIdentity{w.tags.synced_pool(), parent.writer, 0}},
                         nullptr)
              .ok());
  {
    std::vector<PageFillWord> f = fills(w);
    CHECK(f[static_cast<std::size_t>(imported.pages[0].id)] == pack_page_fill(imported.pages[0].tag, 16));
    CHECK(f[static_cast<std::size_t>(imported.pages[1].id)] == pack_page_fill(imported.pages[1].tag, 5));
  }
  CHECK(state_of(w, imported) == RequestState::ok);
  imported.tokens = 22;
  imported.appended = 1;
  CHECK(state_of(w, imported, true) == RequestState::ok);
  imported.tokens = 22;
  imported.appended = 1;  // the same step replayed
  CHECK(state_of(w, imported, true) == RequestState::append_not_next);
}
