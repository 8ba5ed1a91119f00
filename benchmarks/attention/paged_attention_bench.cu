// Tensor-core paged attention on a GPU, in the shapes the SASS report judges and that
// scripts/attention_vs_sdpa.py times with torch SDPA on the same device:
//   BM_PagedDecode:  batch 64, context 32K (and 4K), 8 KV heads, GQA 8, head_dim 128, page 16;
//                    BF16 vs FP8 e4m3 pages; counters: kv_GBps, of_copy_bw (a device copy
//                    timed in the same run), the FP8 / BF16 time ratio is read off the table.
//   BM_PagedPrefill: one request, 4K tokens, causal, 32 query heads / 8 KV heads, head_dim 128;
//                    BF16 pages, FP8 pages (BF16 queries) after a separate append, and FP8
//                    fused (chunk K/V from the inputs, quantize-and-append in the same launch);
//                    counter: TFLOPs (causal: 2 x 2 x T^2 / 2 x H_qo x D flops).
//   ./paged_attention_bench_gpu --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "slimserve/attention/append.hpp"
#include "slimserve/attention/paged_attention.hpp"
#include "slimserve/runtime/memory.hpp"  // rt::device_count

namespace {

using namespace slimserve;
using namespace slimserve::attention;

constexpr int kv_heads = 8, head_dim = 128, page_size = 16;
double g_copy_bandwidth = 0.0;  // bytes/s, measured by BM_DeviceCopy

bool check(cudaError_t err, benchmark::State& state) {
  if (err != cudaSuccess) state.SkipWithError(cudaGetErrorString(err));
  return err == cudaSuccess;
}
bool check(const Status& s, benchmark::State& state) {
  if (!s.ok()) state.SkipWithError(s.to_string().c_str());
  return s.ok();
}

/// Device buffers freed at scope exit.
struct DeviceArena {
  std::vector<void*> owned;
  void* get(std::size_t bytes, int fill) {
    void* ptr = nullptr;
    if (cudaMalloc(&ptr, std::max<std::size_t>(bytes, 16)) != cudaSuccess) return nullptr;
    cudaMemset(ptr, fill, bytes);
    owned.push_back(ptr);
    return ptr;
  }
  template <class T>
  T* copy(const std::vector<T>& host) {
    auto* ptr = static_cast<T*>(get(host.size() * sizeof(T), 0));
    if (ptr) cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return ptr;
  }
  ~DeviceArena() {
    for (void* p : owned) cudaFree(p);
  }
};

void BM_DeviceCopy(benchmark::State& state) {
  if (rt::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const std::size_t bytes = 2ULL << 30;
  DeviceArena arena;
  void* src = arena.get(bytes, 0);
  void* dst = arena.get(bytes, 0);
  if (src == nullptr || dst == nullptr) {
    state.SkipWithError("allocation failed");
    return;
  }
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
  g_copy_bandwidth = 2.0 * static_cast<double>(bytes) * static_cast<double>(state.iterations()) / std::max(seconds, 1e-9);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

enum class Mode : int { bf16 = 0, fp8 = 1, fp8_fused = 2 };

/// One timed configuration: `batch` requests of `context` tokens whose last `qo_len` are the
/// query tokens, GQA `group`.
void run_case(benchmark::State& state, std::int32_t batch, std::int32_t context, std::int32_t qo_len,
              std::int32_t group, Mode mode) {
  if (rt::device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const KvDtype dtype = mode == Mode::bf16 ? KvDtype::bf16 : KvDtype::fp8_e4m3;
  const std::int64_t pages_per_request = (context + page_size - 1) / page_size;
  const std::int64_t num_pages = pages_per_request * batch;
  const auto page_bytes = static_cast<std::size_t>(page_size) * kv_heads * head_dim * element_bytes(dtype);
  const std::int32_t qo_heads = kv_heads * group;
  const std::size_t q_elems = static_cast<std::size_t>(batch) * qo_len * qo_heads * head_dim;
  const std::size_t kv_new_elems = static_cast<std::size_t>(batch) * qo_len * kv_heads * head_dim;

  DeviceArena arena;
  void* k = arena.get(static_cast<std::size_t>(num_pages) * page_bytes, 0x3C);  // finite pattern
  void* v = arena.get(static_cast<std::size_t>(num_pages) * page_bytes, 0x3C);
  std::vector<std::int32_t> indptr(static_cast<std::size_t>(batch) + 1), qo_indptr(static_cast<std::size_t>(batch) + 1),
      indices(static_cast<std::size_t>(num_pages)),
      last(static_cast<std::size_t>(batch), context - static_cast<std::int32_t>(pages_per_request - 1) * page_size);
  for (std::int32_t b = 0; b <= batch; ++b) {
    indptr[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(b * pages_per_request);
    qo_indptr[static_cast<std::size_t>(b)] = b * qo_len;
  }
  std::iota(indices.begin(), indices.end(), 0);
  std::shuffle(indices.begin(), indices.end(), std::mt19937(7));
  auto* indptr_d = arena.copy(indptr);
  auto* qo_indptr_d = arena.copy(qo_indptr);
  auto* indices_d = arena.copy(indices);
  auto* last_d = arena.copy(last);
  auto* scales_d = arena.copy(std::vector<float>{0.02f, 0.01f});
  auto* q = arena.copy(std::vector<std::uint16_t>(q_elems, 0x3C00));  // bf16 1.0
  auto* o = arena.get(q_elems * 2, 0);
  auto* k_new = arena.copy(std::vector<std::uint16_t>(kv_new_elems, 0x3C00));
  auto* v_new = arena.copy(std::vector<std::uint16_t>(kv_new_elems, 0x3C00));
  if (!k || !v || !indptr_d || !qo_indptr_d || !indices_d || !last_d || !scales_d || !q || !o || !k_new || !v_new) {
    state.SkipWithError("allocation failed");
    return;
  }

  PagedAttentionProblem problem{batch, qo_heads, kv_heads, head_dim, page_size, dtype, ActivationDtype::bf16, true};
  PagedAttentionPlanArguments plan_args{problem, qo_indptr, indptr, last};
  int sms = 0;  // the size query needs the SM count that plan_paged_attention would ask for
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  plan_args.num_sms = sms;
  auto bytes = paged_attention_workspace_size(plan_args);
  if (!check(bytes.status(), state)) return;
  void* workspace = arena.get(*bytes, 0);
  auto plan = plan_paged_attention(plan_args, workspace, *bytes, nullptr);
  if (!check(plan.status(), state)) return;

  PagedAttentionArguments args;
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
  args.qo_indptr = qo_indptr_d;
  args.q = q;
  args.o = o;
  if (mode == Mode::fp8_fused) args.chunk_kv = PagedAttentionChunkKv{k_new, v_new, 0, 0};

  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  if (!check(run_paged_attention(args, *plan, workspace, *bytes, nullptr), state)) return;  // warm-up
  double seconds = 0.0;
  for (auto _ : state) {
    cudaEventRecord(start);
    const Status s = run_paged_attention(args, *plan, workspace, *bytes, nullptr);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    if (!check(s, state)) break;
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
    seconds += ms / 1e3;
  }
  const double kv_bytes = 2.0 * batch * static_cast<double>(context) * kv_heads * head_dim * element_bytes(dtype);
  // Score and output mma work of the visible (causal) pairs.
  double pairs = 0.0;
  for (std::int32_t i = 0; i < qo_len; ++i) pairs += context - qo_len + i + 1;
  const double flops = 4.0 * batch * pairs * qo_heads * head_dim;
  state.counters["kv_GBps"] = benchmark::Counter(kv_bytes, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  state.counters["TFLOPs"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  const double achieved = kv_bytes * static_cast<double>(state.iterations()) / std::max(seconds, 1e-9);
  state.counters["of_copy_bw"] = g_copy_bandwidth > 0 ? achieved / g_copy_bandwidth : 0.0;
  state.counters["tensor_core"] = plan->choice.kernel == AttentionKernel::tensor_core ? 1 : 0;
  const char* names[] = {"bf16", "fp8_e4m3", "fp8_e4m3 fused"};
  state.SetLabel(names[static_cast<int>(mode)]);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

/// args: batch, context, mode
void BM_PagedDecode(benchmark::State& state) {
  run_case(state, static_cast<std::int32_t>(state.range(0)), static_cast<std::int32_t>(state.range(1)), 1, 8,
           static_cast<Mode>(state.range(2)));
}
/// args: tokens, mode (one request, the whole prompt as one causal chunk, GQA 4)
void BM_PagedPrefill(benchmark::State& state) {
  const auto tokens = static_cast<std::int32_t>(state.range(0));
  run_case(state, 1, tokens, tokens, 4, static_cast<Mode>(state.range(1)));
}

}  // namespace

BENCHMARK(BM_DeviceCopy)->UseManualTime()->Iterations(20);
BENCHMARK(BM_PagedDecode)
    ->ArgsProduct({{64}, {4096, 32768}, {0, 1}})
    ->UseManualTime()
    ->ArgNames({"batch", "context", "mode"});
BENCHMARK(BM_PagedPrefill)->ArgsProduct({{4096}, {0, 1, 2}})->UseManualTime()->ArgNames({"tokens", "mode"});
BENCHMARK_MAIN();
