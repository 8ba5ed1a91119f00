// GPU cost of the tag check for the decode batch of the allocator benchmark: 256 requests x
// 8K tokens, page size 16 (131,072 page-table entries), timed with CUDA events. Needs a GPU.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/tag_check.hpp"

using namespace slimserve;
using namespace slimserve::kv;

namespace {

void BM_TagCheckDecodeBatch(benchmark::State& state) {
  const auto requests = static_cast<std::int32_t>(state.range(0));
  constexpr std::int32_t page_size = 16;
  constexpr std::int32_t pages_per_request = 8192 / page_size;
  const std::int32_t num_pages = requests * pages_per_request + 1;
  if (rt::device_count() == 0) {
    state.SkipWithError("no GPU");
    return;
  }
  PagePool pool = std::move(PagePool::create(PagePoolOptions{num_pages})).value();
  DeviceTagArray tags = std::move(DeviceTagArray::create(num_pages)).value();
  std::vector<std::vector<PageHandle>> pages(static_cast<std::size_t>(requests));
  std::vector<RequestPages> batch;
  for (auto& request : pages) {
    request.resize(pages_per_request);
    (void)pool.allocate(request);
    std::shuffle(request.begin(), request.end(), std::mt19937(5));
    batch.push_back({request, 8192});
  }
  const auto entries = static_cast<std::size_t>(requests) * pages_per_request;
  std::vector<std::int32_t> indptr(requests + 1), last(requests);
  std::vector<PageId> ids(entries);
  std::vector<PageTag> expected(entries);
  auto host = build_page_table(batch, {page_size, num_pages},
                               {indptr.data(), ids.data(), last.data(), expected.data(), requests,
                                static_cast<std::int64_t>(entries)});
  auto d_indptr = std::move(rt::DeviceBuffer<std::int32_t>::create(requests + 1)).value();
  auto d_last = std::move(rt::DeviceBuffer<std::int32_t>::create(requests)).value();
  auto d_ids = std::move(rt::DeviceBuffer<PageId>::create(entries)).value();
  auto d_expected = std::move(rt::DeviceBuffer<PageTag>::create(entries)).value();
  auto d_status = std::move(rt::DeviceBuffer<RequestStatus>::create(requests)).value();
  cudaStream_t stream = nullptr;
  (void)tags.sync(pool, stream);
  auto table = upload_page_table(*host, num_pages,
                                 {d_indptr.data(), d_ids.data(), d_last.data(), d_expected.data(),
                                  requests, static_cast<std::int64_t>(entries)},
                                 stream);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start, stream);
    (void)check_page_tags({*table, &tags, d_status.data(), nullptr}, stream);
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(static_cast<double>(ms) / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  // Bytes read: id + expected tag + device tag per entry, plus indptr/last_page_len.
  state.SetBytesProcessed(state.iterations() *
                          static_cast<std::int64_t>(entries * 12 + requests * 8));
  state.counters["entries"] = static_cast<double>(entries);
}
BENCHMARK(BM_TagCheckDecodeBatch)->Arg(256)->Arg(32)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
