// KV demo: a page is freed and handed to another request; the old owner's stale handle is
// caught by the GPU tag check (here on the CPU emulator) before any kernel touches the page.
// Then a finished request's pages go to the prefix cache and a new request reads them: a replay
// of the finished request's last step, which still carries matching tags, tries to write into
// the cached page and is aborted, because cached pages are read-only (write ownership).
#include <fmt/core.h>

#include <vector>

#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/prefix_cache.hpp"
#include "slimserve/kv/request_pages.hpp"
#include "slimserve/kv/tag_check.hpp"

namespace {

namespace kv = slimserve::kv;
namespace rt = slimserve::rt;

int fail(const slimserve::Status& status) {
  fmt::print("kv demo: {}\n", status.to_string());
  return 1;
}

// R finishes into the prefix cache; S hits R's first page. A stale replay of R's step that
// wrote token 15 (the last slot of that page) runs next to S's decode step.
int demo_stale_write_into_cached_page() {
  constexpr std::int32_t num_pages = 32;
  constexpr std::int32_t page_size = 16;
  auto pool = kv::PagePool::create({num_pages});
  if (!pool.ok()) return fail(pool.status());
  auto cache = kv::PrefixCache::create(*pool, {page_size, 11});
  auto device_tags = kv::DeviceTagArray::create(num_pages);
  if (!cache.ok()) return fail(cache.status());
  if (!device_tags.ok()) return fail(device_tags.status());
  auto sets = kv::RequestPageSets::create(*pool, cache->get(), {8, page_size});
  if (!sets.ok()) return fail(sets.status());

  std::vector<kv::TokenId> prompt(20);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<kv::TokenId>(100 + i);
  auto r = (*sets)->admit(prompt, {});
  if (!r.ok()) return fail(r.status());
  const auto r_span = (*sets)->pages(*r);
  const std::vector<kv::PageHandle> r_pages(r_span.begin(), r_span.end());  // kept by the bug
  if (auto status = (*sets)->finish(*r, prompt, {}); !status.ok()) return fail(status);
  auto s = (*sets)->admit(prompt, {});  // same prompt: page 0 is a prefix hit
  if (!s.ok()) return fail(s.status());
  if (auto plan = (*sets)->append(*s, 1); !plan.ok()) return fail(plan.status());
  const auto s_span = (*sets)->pages(*s);
  const std::vector<kv::PageHandle> s_pages(s_span.begin(), s_span.end());
  fmt::print("kv demo: R finished; its page {} (tag {}) is in the prefix cache and S reads it\n",
             r_pages[0].id, r_pages[0].tag);

  // Row 0: S appends its 21st token. Row 1: the stale replay of R writing token 15.
  const std::vector<kv::PageHandle> r_first(r_pages.begin(), r_pages.begin() + 1);
  const std::vector<kv::RequestPages> batch{{s_pages, 21}, {r_first, 16}};
  const std::vector<kv::WriterId> writers{s->writer, r->writer};
  const std::vector<std::int32_t> append_indptr{0, 1, 2};  // each row writes its last token
  std::vector<std::int32_t> indptr(3), last(2);
  std::vector<kv::PageId> ids(8);
  std::vector<kv::PageTag> tags(8);
  auto host_table = kv::build_page_table(
      batch, {page_size, num_pages}, {indptr.data(), ids.data(), last.data(), tags.data(), 2, 8});
  if (!host_table.ok()) return fail(host_table.status());  // the tags match: the host passes it

  auto d_indptr = rt::DeviceBuffer<std::int32_t>::create(3);
  auto d_last = rt::DeviceBuffer<std::int32_t>::create(2);
  auto d_ids = rt::DeviceBuffer<kv::PageId>::create(8);
  auto d_tags = rt::DeviceBuffer<kv::PageTag>::create(8);
  auto d_writers = rt::DeviceBuffer<kv::WriterId>::create(2);
  auto d_append = rt::DeviceBuffer<std::int32_t>::create(3);
  auto d_status = rt::DeviceBuffer<kv::RequestStatus>::create(2);
  if (!d_indptr.ok() || !d_last.ok() || !d_ids.ok() || !d_tags.ok() || !d_writers.ok() ||
      !d_append.ok() || !d_status.ok()) {
    return fail(d_status.ok() ? d_indptr.status() : d_status.status());
  }
  cudaStream_t stream = nullptr;
  if (auto status = device_tags->sync(*pool, stream); !status.ok()) return fail(status);
  auto table = kv::upload_page_table(
      *host_table, num_pages,
      {d_indptr->data(), d_ids->data(), d_last->data(), d_tags->data(), 2, 8}, stream);
  if (!table.ok()) return fail(table.status());
  if (auto status = d_writers->upload(writers, stream); !status.ok()) return fail(status);
  if (auto status = d_append->upload(append_indptr, stream); !status.ok()) return fail(status);
  kv::TagCheckArguments check{*table, &*device_tags, d_status->data(), nullptr};
  check.writers = d_writers->data();
  check.append_indptr = d_append->data();
  if (auto status = kv::check_page_tags(check, stream); !status.ok()) return fail(status);
  std::vector<kv::RequestStatus> verdicts(2);
  if (auto status = kv::copy_statuses_to_host(d_status->data(), verdicts, stream); !status.ok()) {
    return fail(status);
  }
  if (auto status = rt::stream_synchronize(stream); !status.ok()) return fail(status);
  fmt::print("kv demo: S's step -> {}; R's stale write into the cached page -> {} (slot {})\n",
             kv::to_string(verdicts[0].state), kv::to_string(verdicts[1].state),
             verdicts[1].failed_slot);
  const bool caught = kv::request_ok(verdicts[0]) &&
                      verdicts[1].state == kv::RequestState::write_denied;
  fmt::print("kv demo: stale write into a cached page {}\n", caught ? "aborted" : "NOT aborted");
  return caught ? 0 : 1;
}

}  // namespace

int demo_kv() {
  constexpr std::int32_t num_pages = 64;
  constexpr std::int32_t page_size = 16;
  auto pool = kv::PagePool::create({num_pages});
  auto device_tags = kv::DeviceTagArray::create(num_pages);
  if (!pool.ok()) return fail(pool.status());
  if (!device_tags.ok()) return fail(device_tags.status());

  // Request A holds 3 pages; it finishes and one of its pages goes to request B.
  std::vector<kv::PageHandle> a(3);
  if (auto status = pool->allocate(a); !status.ok()) return fail(status);
  if (auto status = pool->release(std::span<const kv::PageHandle>(a)); !status.ok()) {
    return fail(status);
  }
  auto b_page = pool->allocate();
  if (!b_page.ok()) return fail(b_page.status());
  fmt::print("kv demo: page {} freed by A (tag {}), now owned by B (tag {})\n", b_page->id,
             a[2].tag, b_page->tag);
  // Calling release with A's old handle is refused on the host...
  fmt::print("kv demo: host release of A's old handle -> {}\n",
             pool->release(a[2]).to_string());

  // ...and a buggy scheduler that still puts A in the batch is caught on the device.
  const std::vector<kv::PageHandle> b{*b_page};
  const std::vector<kv::RequestPages> batch{{b, 5}, {a, 40}};
  std::vector<std::int32_t> indptr(3), last(2);
  std::vector<kv::PageId> ids(8);
  std::vector<kv::PageTag> tags(8);
  auto host_table = kv::build_page_table(
      batch, {page_size, num_pages}, {indptr.data(), ids.data(), last.data(), tags.data(), 2, 8});
  if (!host_table.ok()) return fail(host_table.status());

  auto d_indptr = rt::DeviceBuffer<std::int32_t>::create(3);
  auto d_last = rt::DeviceBuffer<std::int32_t>::create(2);
  auto d_ids = rt::DeviceBuffer<kv::PageId>::create(8);
  auto d_tags = rt::DeviceBuffer<kv::PageTag>::create(8);
  auto d_status = rt::DeviceBuffer<kv::RequestStatus>::create(2);
  if (!d_indptr.ok() || !d_last.ok() || !d_ids.ok() || !d_tags.ok() || !d_status.ok()) {
    return fail(d_status.ok() ? d_indptr.status() : d_status.status());
  }
  cudaStream_t stream = nullptr;
  if (auto status = device_tags->sync(*pool, stream); !status.ok()) return fail(status);
  auto table = kv::upload_page_table(
      *host_table, num_pages,
      {d_indptr->data(), d_ids->data(), d_last->data(), d_tags->data(), 2, 8}, stream);
  if (!table.ok()) return fail(table.status());
  if (auto status = kv::check_page_tags({*table, &*device_tags, d_status->data(), nullptr}, stream);
      !status.ok()) {
    return fail(status);
  }
  std::vector<kv::RequestStatus> verdicts(2);
  if (auto status = kv::copy_statuses_to_host(d_status->data(), verdicts, stream); !status.ok()) {
    return fail(status);
  }
  if (auto status = rt::stream_synchronize(stream); !status.ok()) return fail(status);
  std::vector<kv::AbortedRequest> aborted;
  kv::collect_aborted(verdicts, aborted);
  for (const kv::AbortedRequest& request : aborted) {
    fmt::print("kv demo: GPU tag check aborted request {} ({} at page slot {}): it reads and "
               "writes no page\n",
               request.request == 0 ? "B" : "A", kv::to_string(request.status.state),
               request.status.failed_slot);
  }
  const bool caught = aborted.size() == 1 && aborted[0].request == 1 &&
                      aborted[0].status.state == kv::RequestState::stale_tag &&
                      aborted[0].status.failed_slot == 2;
  fmt::print("kv demo: stale page {}\n", caught ? "caught" : "NOT caught");
  if (!caught) return 1;
  return demo_stale_write_into_cached_page();
}
