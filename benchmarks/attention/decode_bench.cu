// Decode attention on a GPU: step time and achieved bandwidth (KV bytes read / time) for
// batch 1-256 x context 1K-128K, head_dim 128, 8 KV heads, GQA 8, page sizes 16 and 64, BF16
// vs FP8 e4m3 (per-tensor scales). A device-to-device copy is timed in the same run and every
// decode row reports its bandwidth as a fraction of it ("of_copy_bw").
//   ./attention_decode_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "slimserve/attention/decode.hpp"
#include "slimserve/runtime/memory.hpp"  // rt::device_count

namespace {

using namespace slimserve;
using namespace slimserve::attention;

constexpr int kv_heads = 8, group = 8, head_dim = 128;
constexpr std::int64_t max_cache_bytes = 48LL << 30;  // stay well inside an H200's memory

double g_copy_bandwidth = 0.0;  // bytes/s, measured by BM_DeviceCopy

/// A device copy of a host vector (raw cudaMalloc: the benchmark is GPU-only), or null.
template <class T>
T* device_copy(const std::vector<T>& host) {
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, host.size() * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(ptr);
}

bool check(cudaError_t err, benchmark::State& state) {
  if (err != cudaSuccess) state.SkipWithError(cudaGetErrorString(err));
  return err == cudaSuccess;
}
bool check(const Status& s, benchmark::State& state) {
  if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  return s.ok();
}

/// Read + write bandwidth of a 2 GiB device-to-device copy.
void BM_DeviceCopy(benchmark::State& state) {
  if (rt::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const std::size_t bytes = 2ULL << 30;
  void *src = nullptr, *dst = nullptr;
  if (!check(cudaMalloc(&src, bytes), state) || !check(cudaMalloc(&dst, bytes), state)) return;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  double seconds = 0.0;
  for (auto _ : state) {
    cudaEventRecord(start);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
    seconds += ms / 1e3;
  }
  g_copy_bandwidth = 2.0 * static_cast<double>(bytes) * static_cast<double>(state.iterations()) /
                     std::max(seconds, 1e-9);
  state.counters["bandwidth_GBps"] = benchmark::Counter(2.0 * static_cast<double>(bytes),
                                                        benchmark::Counter::kIsIterationInvariantRate,
                                                        benchmark::Counter::kIs1000);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
}

/// args: batch, context, page_size, dtype (0 = bf16, 1 = fp8_e4m3)
void BM_Decode(benchmark::State& state) {
  if (rt::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const auto batch = static_cast<std::int32_t>(state.range(0));
  const auto context = static_cast<std::int32_t>(state.range(1));
  const auto page_size = static_cast<std::int32_t>(state.range(2));
  const KvDtype dtype = state.range(3) == 0 ? KvDtype::bf16 : KvDtype::fp8_e4m3;
  const std::int64_t pages_per_request = (context + page_size - 1) / page_size;
  const std::int64_t num_pages = pages_per_request * batch;
  const std::int64_t page_bytes = static_cast<std::int64_t>(page_size) * kv_heads * head_dim * element_bytes(dtype);

  // Pages: filled with a finite byte pattern (0x3C: 1.5 in e4m3, ~0.0115 in bf16).
  void *k = nullptr, *v = nullptr;
  if (!check(cudaMalloc(&k, static_cast<std::size_t>(num_pages * page_bytes)), state)) return;
  if (!check(cudaMalloc(&v, static_cast<std::size_t>(num_pages * page_bytes)), state)) return;
  cudaMemset(k, 0x3C, static_cast<std::size_t>(num_pages * page_bytes));
  cudaMemset(v, 0x3C, static_cast<std::size_t>(num_pages * page_bytes));

  // Shuffled page table (pages scattered like a long-running server's).
  std::vector<std::int32_t> indptr(static_cast<std::size_t>(batch) + 1), indices(static_cast<std::size_t>(num_pages)),
      last(static_cast<std::size_t>(batch), context - static_cast<std::int32_t>(pages_per_request - 1) * page_size);
  for (std::int32_t b = 0; b <= batch; ++b) indptr[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(b * pages_per_request);
  std::iota(indices.begin(), indices.end(), 0);
  std::shuffle(indices.begin(), indices.end(), std::mt19937(7));
  std::vector<float> scales{0.02f, 0.01f};
  std::vector<std::uint16_t> q(static_cast<std::size_t>(batch) * kv_heads * group * head_dim, 0x3C00);

  std::int32_t* indptr_d = device_copy(indptr);
  std::int32_t* indices_d = device_copy(indices);
  std::int32_t* last_d = device_copy(last);
  float* scales_d = device_copy(scales);
  std::uint16_t* q_d = device_copy(q);
  std::uint16_t* o_d = device_copy(q);
  if (!indptr_d || !indices_d || !last_d || !scales_d || !q_d || !o_d) {
    state.SkipWithError("allocation failed");
    return;
  }

  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  DecodeProblem problem{batch, kv_heads * group, kv_heads, head_dim, page_size, 1, dtype};
  DecodePlanArguments plan_args{problem, indptr, last};
  plan_args.max_ctas = sms * 4;
  auto bytes = decode_workspace_size(plan_args);
  if (!check(bytes.status(), state)) return;
  void* workspace = nullptr;
  if (!check(cudaMalloc(&workspace, *bytes), state)) return;
  auto plan = plan_decode(plan_args, workspace, *bytes, nullptr);
  if (!check(plan.status(), state)) return;

  DecodeArguments args;
  args.cache.k_pages = k;
  args.cache.v_pages = v;
  args.cache.k_scale = scales_d;
  args.cache.v_scale = scales_d + 1;
  args.cache.num_pages = static_cast<std::int32_t>(num_pages);
  args.cache.page_size = page_size;
  args.cache.num_kv_heads = kv_heads;
  args.cache.head_dim = head_dim;
  args.cache.dtype = dtype;
  args.cache.layout = KvLayout::hnd;
  args.cache.scale_mode = is_fp8(dtype) ? KvScaleMode::per_tensor : KvScaleMode::none;
  args.table = kv::PageTableView{indptr_d, indices_d, last_d, nullptr, batch, page_size};
  args.q = q_d;
  args.o = o_d;
  args.sm_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  if (!check(run_decode(args, *plan, workspace, *bytes, nullptr), state)) return;  // warm-up
  double seconds = 0.0;
  for (auto _ : state) {
    cudaEventRecord(start);
    const Status s = run_decode(args, *plan, workspace, *bytes, nullptr);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    if (!check(s, state)) break;
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
    seconds += ms / 1e3;
  }
  const double kv_bytes = 2.0 * static_cast<double>(batch) * context * kv_heads * head_dim * element_bytes(dtype);
  state.counters["kv_GBps"] = benchmark::Counter(kv_bytes, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  state.counters["splits"] = plan->num_work_items;
  const double achieved = kv_bytes * static_cast<double>(state.iterations()) / std::max(seconds, 1e-9);
  state.counters["of_copy_bw"] = g_copy_bandwidth > 0 ? achieved / g_copy_bandwidth : 0.0;
  state.SetLabel(std::string(to_string(dtype)) + " ps" + std::to_string(page_size));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  for (void* p : {static_cast<void*>(k), v, static_cast<void*>(indptr_d), static_cast<void*>(indices_d),
                  static_cast<void*>(last_d), static_cast<void*>(scales_d), static_cast<void*>(q_d),
                  static_cast<void*>(o_d), workspace}) {
    cudaFree(p);
  }
}

void decode_grid(benchmark::internal::Benchmark* b) {
  for (int dtype : {0, 1})
    for (int page_size : {16, 64})
      for (int batch : {1, 8, 32, 64, 128, 256})
        for (int context : {1024, 4096, 8192, 16384, 32768, 131072}) {
          const std::int64_t bytes = 2LL * batch * context * kv_heads * head_dim * (dtype == 0 ? 2 : 1);
          if (bytes <= max_cache_bytes) b->Args({batch, context, page_size, dtype});
        }
}

}  // namespace

BENCHMARK(BM_DeviceCopy)->UseManualTime()->Iterations(20);
BENCHMARK(BM_Decode)->Apply(decode_grid)->UseManualTime()->ArgNames({"batch", "context", "page", "fp8"});
BENCHMARK_MAIN();
