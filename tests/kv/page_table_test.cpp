// Page-table builder: CSR and 2-D forms, every field checked, every invalid field rejected
// without writing, and the device upload.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {
constexpr std::int32_t page_size = 16;
constexpr std::int32_t num_pages = 4096;
constexpr std::int32_t poison = -77;

struct CsrStorage {
  std::vector<std::int32_t> indptr, last_page_len;
  std::vector<PageId> indices;
  std::vector<PageTag> tags;
  CsrStorage(std::int32_t batch, std::int64_t entries)
      : indptr(batch + 1, poison), last_page_len(batch, poison), indices(entries, poison),
        tags(entries, 0xDEADBEEFu) {}
  PageTableHostBuffers buffers() {
    return {indptr.data(), indices.data(), last_page_len.data(), tags.data(),
            static_cast<std::int32_t>(last_page_len.size()),
            static_cast<std::int64_t>(indices.size())};
  }
  bool untouched() const {
    return std::all_of(indptr.begin(), indptr.end(), [](auto v) { return v == poison; }) &&
           std::all_of(indices.begin(), indices.end(), [](auto v) { return v == poison; }) &&
           std::all_of(last_page_len.begin(), last_page_len.end(),
                       [](auto v) { return v == poison; });
  }
};

// Ragged lengths: 0, 1, page_size-1, page_size, page_size+1 and long, shuffled page ids.
std::vector<std::vector<PageHandle>> make_requests(std::mt19937_64& rng,
                                                   std::vector<std::int64_t>& tokens) {
  tokens = {0, 1, page_size - 1, page_size, page_size + 1, 37 * page_size + 5, 3 * page_size};
  std::vector<PageId> ids(num_pages - 1);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<PageId>(i + 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<PageHandle>> pages(tokens.size());
  std::size_t next = 0;
  std::uniform_int_distribution<PageTag> tag(1, 1u << 30);
  for (std::size_t b = 0; b < tokens.size(); ++b) {
    const std::int64_t count = (tokens[b] + page_size - 1) / page_size;
    for (std::int64_t i = 0; i < count; ++i) pages[b].push_back({ids[next++], tag(rng)});
  }
  return pages;
}

std::vector<RequestPages> as_requests(const std::vector<std::vector<PageHandle>>& pages,
                                      const std::vector<std::int64_t>& tokens) {
  std::vector<RequestPages> requests;
  for (std::size_t b = 0; b < pages.size(); ++b) requests.push_back({pages[b], tokens[b]});
  return requests;
}
}  // namespace

TEST_CASE("page table: CSR form holds every id, tag and length", "[kv][table]") {
  auto rng = slimserve_test::make_rng(1);
  std::vector<std::int64_t> tokens;
  const auto pages = make_requests(rng, tokens);
  const auto requests = as_requests(pages, tokens);
  CsrStorage storage(16, 1024);
  Result<PageTableView> view = build_page_table(requests, {page_size, num_pages}, storage.buffers());
  REQUIRE(view.ok());
  REQUIRE(view->batch_size == static_cast<std::int32_t>(requests.size()));
  CHECK(view->indptr[0] == 0);
  for (std::size_t b = 0; b < requests.size(); ++b) {
    const auto begin = view->indptr[b];
    REQUIRE(view->indptr[b + 1] - begin == static_cast<std::int32_t>(pages[b].size()));
    for (std::size_t i = 0; i < pages[b].size(); ++i) {
      CHECK(view->indices[begin + i] == pages[b][i].id);
      CHECK(view->expected_tags[begin + i] == pages[b][i].tag);
    }
    CHECK(request_length(*view, static_cast<int>(b)) == tokens[b]);
    if (!pages[b].empty()) {
      CHECK(view->last_page_len[b] >= 1);
      CHECK(view->last_page_len[b] <= page_size);
    }
  }
  CHECK(validate_page_table(*view, num_pages).ok());
}

TEST_CASE("page table: 2-D form pads rows with the guard page", "[kv][table]") {
  auto rng = slimserve_test::make_rng(2);
  std::vector<std::int64_t> tokens;
  const auto pages = make_requests(rng, tokens);
  const auto requests = as_requests(pages, tokens);
  const std::int32_t width = 40;
  std::vector<PageId> ids(8 * width, poison);
  std::vector<PageTag> tags(8 * width, 5);
  std::vector<std::int32_t> lens(8, poison);
  Result<BlockTableView> view = build_block_table(
      requests, {page_size, num_pages}, {ids.data(), tags.data(), lens.data(), 8, width});
  REQUIRE(view.ok());
  for (std::size_t b = 0; b < requests.size(); ++b) {
    CHECK(view->seq_lens[b] == tokens[b]);
    for (std::int32_t slot = 0; slot < width; ++slot) {
      const PageHandle expect = slot < static_cast<std::int32_t>(pages[b].size())
                                    ? pages[b][slot]
                                    : guard_page;
      CHECK(ids[b * width + slot] == expect.id);
      CHECK(tags[b * width + slot] == expect.tag);
    }
  }
  CHECK(validate_block_table(*view, num_pages).ok());
  // A row too narrow for the longest request: rejected, nothing written.
  std::vector<PageId> narrow(8 * 4, poison);
  std::vector<PageTag> narrow_tags(8 * 4, 5);
  std::vector<std::int32_t> narrow_lens(8, poison);
  const auto too_narrow = build_block_table(
      requests, {page_size, num_pages},
      {narrow.data(), narrow_tags.data(), narrow_lens.data(), 8, 4});
  CHECK(too_narrow.status().code() == StatusCode::resource_exhausted);
  CHECK(std::all_of(narrow.begin(), narrow.end(), [](auto v) { return v == poison; }));
}

TEST_CASE("page table: each invalid input is rejected and nothing is written", "[kv][table]") {
  const std::vector<PageHandle> two{{3, 1}, {9, 4}};
  const std::vector<PageHandle> out_of_range{{3, 1}, {num_pages, 4}};
  const std::vector<PageHandle> negative{{-1, 1}};
  const std::vector<PageHandle> never_owned{{3, 1}, {9, never_owned_tag}};
  const std::vector<PageHandle> bad_guard{{guard_page_id, 7}};
  struct Case {
    const char* what;
    std::vector<RequestPages> requests;
    PageTableShape shape;
    std::int32_t max_batch;
    std::int64_t max_entries;
    StatusCode code;
  };
  const std::vector<Case> cases{
      {"last page empty", {{two, 16}}, {page_size, num_pages}, 4, 64, StatusCode::invalid_argument},
      {"last page overfull", {{two, 33}}, {page_size, num_pages}, 4, 64, StatusCode::invalid_argument},
      {"tokens without pages", {{{}, 3}}, {page_size, num_pages}, 4, 64, StatusCode::invalid_argument},
      {"id out of range", {{out_of_range, 20}}, {page_size, num_pages}, 4, 64, StatusCode::out_of_range},
      {"negative id", {{negative, 1}}, {page_size, num_pages}, 4, 64, StatusCode::out_of_range},
      {"never-owned tag", {{never_owned, 20}}, {page_size, num_pages}, 4, 64, StatusCode::invalid_argument},
      {"guard page with a tag", {{bad_guard, 1}}, {page_size, num_pages}, 4, 64, StatusCode::invalid_argument},
      {"batch over capacity", {{two, 20}, {two, 20}}, {page_size, num_pages}, 1, 64, StatusCode::resource_exhausted},
      {"entries over capacity", {{two, 20}, {two, 20}}, {page_size, num_pages}, 4, 3, StatusCode::resource_exhausted},
      {"page_size 0", {{two, 20}}, {0, num_pages}, 4, 64, StatusCode::invalid_argument},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    CsrStorage storage(4, 64);
    PageTableHostBuffers buffers = storage.buffers();
    buffers.max_batch = c.max_batch;
    buffers.max_entries = c.max_entries;
    const Result<PageTableView> view = build_page_table(c.requests, c.shape, buffers);
    CHECK(view.status().code() == c.code);
    CHECK_FALSE(view.status().message().empty());
    CHECK(storage.untouched());
  }
}

TEST_CASE("page table: validate_page_table rejects every bad field", "[kv][table]") {
  std::vector<std::int32_t> indptr{0, 2, 3};
  std::vector<PageId> indices{5, 6, 7};
  std::vector<std::int32_t> last{16, 1};
  std::vector<PageTag> tags{1, 2, 3};
  PageTableView table{indptr.data(), indices.data(), last.data(), tags.data(), 2, page_size};
  REQUIRE(validate_page_table(table, num_pages).ok());
  auto expect = [&](StatusCode code, auto&& mutate) {
    auto saved = std::tuple{indptr, indices, last, tags};
    mutate();
    CHECK(validate_page_table(table, num_pages, 3).code() == code);
    std::tie(indptr, indices, last, tags) = saved;
    REQUIRE(validate_page_table(table, num_pages, 3).ok());
  };
  expect(StatusCode::invalid_argument, [&] { indptr[0] = 1; });
  expect(StatusCode::invalid_argument, [&] { indptr[1] = 4; });  // then decreases
  expect(StatusCode::out_of_range, [&] { indptr[2] = 4; });       // more entries than arrays
  expect(StatusCode::invalid_argument, [&] { last[0] = 0; });
  expect(StatusCode::invalid_argument, [&] { last[1] = page_size + 1; });
  expect(StatusCode::out_of_range, [&] { indices[2] = num_pages; });
  expect(StatusCode::out_of_range, [&] { indices[0] = -5; });
  expect(StatusCode::invalid_argument, [&] { tags[1] = never_owned_tag; });
  expect(StatusCode::invalid_argument, [&] { indices[1] = guard_page_id; });  // guard, tag 2
  CHECK(validate_page_table(PageTableView{indptr.data(), indices.data(), last.data(), tags.data(),
                                          2, 0},
                            num_pages)
            .code() == StatusCode::invalid_argument);

  std::vector<PageId> block{5, 6, 7, 0};
  std::vector<PageTag> block_tags{1, 2, 3, 0};
  std::vector<std::int32_t> lens{32, 1};
  BlockTableView block_table{block.data(), block_tags.data(), lens.data(), 2, 2, page_size};
  REQUIRE(validate_block_table(block_table, num_pages).ok());
  lens[1] = 33;
  CHECK(validate_block_table(block_table, num_pages).code() == StatusCode::invalid_argument);
  lens[1] = 1;
  block_tags[2] = never_owned_tag;
  CHECK(validate_block_table(block_table, num_pages).code() == StatusCode::invalid_argument);
  block_tags[2] = 3;
  lens[1] = -1;
  CHECK(validate_block_table(block_table, num_pages).code() == StatusCode::invalid_argument);
  lens[1] = 1;
  block[2] = num_pages + 3;
  CHECK(validate_block_table(block_table, num_pages).code() == StatusCode::out_of_range);
}

TEST_CASE("page table: upload copies the validated table to device buffers", "[kv][table]") {
  auto rng = slimserve_test::make_rng(3);
  std::vector<std::int64_t> tokens;
  const auto pages = make_requests(rng, tokens);
  const auto requests = as_requests(pages, tokens);
  CsrStorage storage(16, 1024);
  Result<PageTableView> host = build_page_table(requests, {page_size, num_pages}, storage.buffers());
  REQUIRE(host.ok());
  auto indptr = rt::DeviceBuffer<std::int32_t>::create(17);
  auto indices = rt::DeviceBuffer<PageId>::create(1024);
  auto last = rt::DeviceBuffer<std::int32_t>::create(16);
  auto tags = rt::DeviceBuffer<PageTag>::create(1024);
  REQUIRE((indptr.ok() && indices.ok() && last.ok() && tags.ok()));
  const PageTableDeviceBuffers device{indptr->data(), indices->data(), last->data(),
                                      tags->data(), 16, 1024};
  Result<PageTableView> view = upload_page_table(*host, num_pages, device, nullptr);
  REQUIRE(view.ok());
  CHECK(view->indices == indices->data());
  const std::size_t entries = static_cast<std::size_t>(host->indptr[host->batch_size]);
  std::vector<std::int32_t> back_indptr(requests.size() + 1);
  std::vector<PageId> back_indices(entries);
  std::vector<PageTag> back_tags(entries);
  REQUIRE(indptr->download(back_indptr).ok());
  REQUIRE(indices->download(back_indices).ok());
  REQUIRE(tags->download(back_tags).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  CHECK(std::equal(back_indptr.begin(), back_indptr.end(), storage.indptr.begin()));
  CHECK(std::equal(back_indices.begin(), back_indices.end(), storage.indices.begin()));
  CHECK(std::equal(back_tags.begin(), back_tags.end(), storage.tags.begin()));
  // Too small device buffers: rejected before any copy.
  const PageTableDeviceBuffers small{indptr->data(), indices->data(), last->data(), tags->data(),
                                     16, 4};
  CHECK(upload_page_table(*host, num_pages, small, nullptr).status().code() ==
        StatusCode::resource_exhausted);
}

TEST_CASE("page table: PageTableStorage pairs pinned host and device buffers", "[kv][table]") {
  CHECK(PageTableStorage::create(0, 8).status().code() == StatusCode::invalid_argument);
  CHECK(PageTableStorage::create(4, 0).status().code() == StatusCode::invalid_argument);
  auto rng = slimserve_test::make_rng(4);
  std::vector<std::int64_t> tokens;
  const auto pages = make_requests(rng, tokens);
  const auto requests = as_requests(pages, tokens);
  Result<PageTableStorage> storage = PageTableStorage::create(8, 64);
  REQUIRE(storage.ok());
  Result<PageTableView> host = build_page_table(requests, {page_size, num_pages}, storage->host());
  REQUIRE(host.ok());
  Result<PageTableView> device = upload_page_table(*host, num_pages, storage->device(), nullptr);
  REQUIRE(device.ok());
  const auto entries = static_cast<std::size_t>(host->indptr[host->batch_size]);
  std::vector<PageId> back(entries);
  REQUIRE(rt::copy_async(back.data(), device->indices, entries * sizeof(PageId),
                         rt::CopyDirection::device_to_host, nullptr)
              .ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  for (std::size_t j = 0; j < entries; ++j) CHECK(back[j] == host->indices[j]);
  // A batch beyond the storage's capacity is refused before anything is written.
  Result<PageTableStorage> small = PageTableStorage::create(2, 64);
  REQUIRE(small.ok());
  CHECK(build_page_table(requests, {page_size, num_pages}, small->host()).status().code() ==
        StatusCode::resource_exhausted);
}

TEST_CASE("page table: BlockTableStorage pairs pinned host and device 2-D buffers", "[kv][table]") {
  CHECK(BlockTableStorage::create(0, 8).status().code() == StatusCode::invalid_argument);
  CHECK(BlockTableStorage::create(4, 0).status().code() == StatusCode::invalid_argument);
  auto rng = slimserve_test::make_rng(5);
  std::vector<std::int64_t> tokens;
  const auto pages = make_requests(rng, tokens);
  const auto requests = as_requests(pages, tokens);
  std::int32_t width = 0;
  for (const auto& p : pages) width = std::max(width, static_cast<std::int32_t>(p.size()));
  const std::int32_t batch = static_cast<std::int32_t>(requests.size());
  Result<BlockTableStorage> storage = BlockTableStorage::create(batch + 1, width + 3);
  REQUIRE(storage.ok());
  CHECK(storage->host().max_batch == batch + 1);
  CHECK(storage->device().max_pages_per_request == width + 3);
  Result<BlockTableView> host = build_block_table(requests, {page_size, num_pages}, storage->host());
  REQUIRE(host.ok());
  Result<BlockTableView> device = upload_block_table(*host, num_pages, storage->device(), nullptr);
  REQUIRE(device.ok());
  CHECK(device->batch_size == batch);
  CHECK(device->max_pages_per_request == width + 3);
  const auto entries = static_cast<std::size_t>(batch) * static_cast<std::size_t>(width + 3);
  std::vector<PageId> ids(entries, poison);
  std::vector<PageTag> tags(entries, 0xDEADBEEFu);
  std::vector<std::int32_t> lens(static_cast<std::size_t>(batch), poison);
  using rt::CopyDirection;
  REQUIRE(rt::copy_async(ids.data(), device->block_table, entries * sizeof(PageId), CopyDirection::device_to_host, nullptr).ok());
  REQUIRE(rt::copy_async(tags.data(), device->expected_tags, entries * sizeof(PageTag), CopyDirection::device_to_host, nullptr).ok());
  REQUIRE(rt::copy_async(lens.data(), device->seq_lens, lens.size() * sizeof(std::int32_t), CopyDirection::device_to_host, nullptr).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  for (std::size_t b = 0; b < requests.size(); ++b) {
    CHECK(lens[b] == tokens[b]);
    for (std::int32_t slot = 0; slot < width + 3; ++slot) {
      const PageHandle expect = slot < static_cast<std::int32_t>(pages[b].size()) ? pages[b][static_cast<std::size_t>(slot)] : guard_page;
      const auto at = b * static_cast<std::size_t>(width + 3) + static_cast<std::size_t>(slot);
      CHECK(ids[at] == expect.id);
      CHECK(tags[at] == expect.tag);
    }
  }
  // Rows of another width: refused, and the message says what must match.
  Result<BlockTableStorage> other = BlockTableStorage::create(batch, width + 4);
  REQUIRE(other.ok());
  const auto mismatch = upload_block_table(*host, num_pages, other->device(), nullptr);
  CHECK(mismatch.status().code() == StatusCode::resource_exhausted);
  CHECK_THAT(mismatch.status().to_string(), Catch::Contains("same width"));
  // A batch beyond the storage's capacity is refused by the builder before anything is written.
  Result<BlockTableStorage> small = BlockTableStorage::create(1, width + 3);
  REQUIRE(small.ok());
  CHECK(build_block_table(requests, {page_size, num_pages}, small->host()).status().code() ==
        StatusCode::resource_exhausted);
}
