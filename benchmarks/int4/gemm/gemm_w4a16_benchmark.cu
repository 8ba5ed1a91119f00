// W4A16 GEMM (fused kernel and expansion path) against cuBLASLt with BF16 weights and with
// FP8 (e4m3) weights, on Llama-70B / GLM-like layer shapes, M = 1 .. 4096.
//
// Each benchmark row times all paths for one (shape, M) and reports, as counters:
//   fused_us, expand_us, bf16_us, fp8_us   median-free mean time per GEMM (CUDA events)
//   fused_GBps, fused_of_copy               bytes the fused kernel must move / time, and that
//                                           as a fraction of a device-to-device copy's
//                                           bandwidth measured in the same run
//   speedup_bf16, speedup_fp8                best INT4 path vs the dense baselines
//   fused_wins                               1 while the fused kernel beats the expansion
//                                            path: the largest M with 1 is the crossover
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "slimserve/int4/gemm.hpp"

using namespace slimserve;
using namespace slimserve::int4;

namespace {

struct Shape {
  const char* name;
  std::int64_t k;
  std::int64_t n;
  std::int64_t group_size;
};

// K = 10944 (a TP shard of an MoE/GLM-like intermediate size) is not a multiple of 128: it
// runs with group 64. N = 7392 (Qwen2-72B at TP=4) is not a multiple of 64.
constexpr Shape shapes[] = {
    {"8192x28672", 8192, 28672, 128},   // gate/up projection
    {"28672x8192", 28672, 8192, 128},   // down projection
    {"8192x10240", 8192, 10240, 128},   // fused QKV (GQA)
    {"10944x4096_g64", 10944, 4096, 64},
    {"8192x7392", 8192, 7392, 128},
};
constexpr std::int64_t m_values[] = {1, 4, 16, 64, 256, 1024, 4096};
constexpr int iterations = 20;

#define BENCH_CHECK(expr)                                                        \
  do {                                                                           \
    if (!(expr)) {                                                               \
      std::fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #expr);     \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

/// A device allocation filled with one byte value (the speed of a GEMM does not depend on
/// the values; the bytes are chosen to give finite, non-zero numbers).
template <class T>
class DeviceArray {
 public:
  DeviceArray(std::size_t count, int byte) : bytes_(std::max<std::size_t>(count, 1) * sizeof(T)) {
    BENCH_CHECK(cudaMalloc(&data_, bytes_) == cudaSuccess);
    BENCH_CHECK(cudaMemset(data_, byte, bytes_) == cudaSuccess);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }
  T* data() const { return static_cast<T*>(data_); }
  std::size_t size_bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

/// Mean milliseconds of `work` over `iterations` launches (after one warm-up).
float time_ms(const std::function<void()>& work) {
  cudaEvent_t start;
  cudaEvent_t stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  work();
  cudaEventRecord(start);
  for (int i = 0; i < iterations; ++i) work();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  BENCH_CHECK(cudaGetLastError() == cudaSuccess);
  return ms / iterations;
}

/// Device-to-device copy bandwidth (read + write bytes per second), measured once per run.
double copy_bandwidth() {
  static const double bandwidth = [] {
    const std::size_t bytes = std::size_t{1} << 30;
    const DeviceArray<unsigned char> src(bytes, 1);
    const DeviceArray<unsigned char> dst(bytes, 2);
    const float ms = time_ms([&] {
      cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, nullptr);
    });
    return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
  }();
  return bandwidth;
}

cublasLtHandle_t lt() {
  static cublasLtHandle_t handle = [] {
    cublasLtHandle_t h = nullptr;
    BENCH_CHECK(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
    return h;
  }();
  return handle;
}

/// A prepared cuBLASLt matmul: row-major C[m, n] = A[m, k] . W, with W either row-major
/// [k, n] (BF16: no transposes in column-major terms) or [n, k] (FP8 needs the "TN" form).
struct LtGemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, a = nullptr, c = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic{};
  bool ok = false;
  ~LtGemm() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (w) cublasLtMatrixLayoutDestroy(w);
    if (op) cublasLtMatmulDescDestroy(op);
  }
  LtGemm(cudaDataType_t weight_type, std::int64_t m, std::int64_t n, std::int64_t k,
         std::size_t workspace_bytes) {
    const bool fp8 = weight_type == CUDA_R_8F_E4M3;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t transpose = CUBLAS_OP_T;
    if (fp8) {
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose));
      cublasLtMatrixLayoutCreate(&w, weight_type, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(n), k);
    } else {
      cublasLtMatrixLayoutCreate(&w, weight_type, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(k), n);
    }
    cublasLtMatrixLayoutCreate(&a, weight_type, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(m), k);
    cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(m), n);
    cublasLtMatmulPreference_t preference = nullptr;
    cublasLtMatmulPreferenceCreate(&preference);
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace_bytes, sizeof(workspace_bytes));
    int found = 0;
    ok = cublasLtMatmulAlgoGetHeuristic(lt(), op, w, a, c, c, preference, 1, &heuristic, &found) ==
             CUBLAS_STATUS_SUCCESS &&
         found > 0;
    cublasLtMatmulPreferenceDestroy(preference);
  }
  void run(const void* weights, const void* activations, void* out, void* workspace,
           std::size_t workspace_bytes) const {
    const float alpha = 1.0f;
    const float beta = 0.0f;
    cublasLtMatmul(lt(), op, &alpha, weights, w, activations, a, &beta, out, c, out, c,
                   &heuristic.algo, workspace, workspace_bytes, nullptr);
  }
};

void BM_W4A16(benchmark::State& state) {
  const Shape& shape = shapes[state.range(0)];
  const std::int64_t m = state.range(1);
  const std::int64_t k = shape.k;
  const std::int64_t n = shape.n;
  const auto kn = static_cast<std::size_t>(k * n);
  const auto mk = static_cast<std::size_t>(m * k);
  const auto mn = static_cast<std::size_t>(m * n);
  const auto groups = static_cast<std::size_t>(k / shape.group_size);

  const DeviceArray<std::uint16_t> a(mk, 0x3C);       // BF16 0.0115
  const DeviceArray<std::uint32_t> packed(kn / 8, 0x5A);
  const DeviceArray<std::uint16_t> scales(groups * static_cast<std::size_t>(n), 0x3C);
  const DeviceArray<std::uint16_t> c(mn, 0);
  const DeviceArray<std::uint16_t> dense_w(kn, 0x3C);
  const DeviceArray<std::uint8_t> fp8_w(kn, 0x30);
  const DeviceArray<std::uint8_t> fp8_a(mk, 0x30);
  const std::size_t lt_workspace_bytes = std::size_t{32} << 20;
  const DeviceArray<unsigned char> lt_workspace(lt_workspace_bytes, 0);

  GemmArguments args;
  args.activation = ActivationType::bf16;
  args.m = m;
  args.n = n;
  args.k = k;
  args.group_size = shape.group_size;
  args.a = a.data();
  args.b = packed.data();
  args.scales = scales.data();
  args.c = c.data();
  GemmOptions fused_options;
  fused_options.path = GemmPath::fused;
  GemmOptions expand_options;
  expand_options.path = GemmPath::expand;
  Result<GemmPlan> fused_plan = plan_gemm(args, fused_options);
  Result<GemmPlan> expand_plan = plan_gemm(args, expand_options);
  BENCH_CHECK(fused_plan.ok() && expand_plan.ok());
  const DeviceArray<unsigned char> workspace(
      std::max(fused_plan->workspace_bytes(), expand_plan->workspace_bytes()), 0);

  const LtGemm bf16_gemm(CUDA_R_16BF, m, n, k, lt_workspace_bytes);
  const LtGemm fp8_gemm(CUDA_R_8F_E4M3, m, n, k, lt_workspace_bytes);
  double fused_ms = 0, expand_ms = 0, bf16_ms = 0, fp8_ms = 0;
  for (auto _ : state) {
    fused_ms = time_ms([&] {
      BENCH_CHECK(run_gemm(args, *fused_plan, workspace.data(), workspace.size_bytes(), nullptr).ok());
    });
    expand_ms = time_ms([&] {
      BENCH_CHECK(run_gemm(args, *expand_plan, workspace.data(), workspace.size_bytes(), nullptr).ok());
    });
    bf16_ms = bf16_gemm.ok ? time_ms([&] {
      bf16_gemm.run(dense_w.data(), a.data(), c.data(), lt_workspace.data(), lt_workspace_bytes);
    }) : 0.0;
    fp8_ms = fp8_gemm.ok ? time_ms([&] {
      fp8_gemm.run(fp8_w.data(), fp8_a.data(), c.data(), lt_workspace.data(), lt_workspace_bytes);
    }) : 0.0;
    state.SetIterationTime(fused_ms * 1e-3);
  }
  // Bytes the fused kernel cannot avoid: 4-bit weights, scales, A, C.
  const double bytes = static_cast<double>(kn) / 2 + 2.0 * static_cast<double>(groups * n) +
                       2.0 * static_cast<double>(mk + mn);
  const double best_int4 = std::min(fused_ms, expand_ms);
  state.counters["fused_us"] = fused_ms * 1e3;
  state.counters["expand_us"] = expand_ms * 1e3;
  state.counters["bf16_us"] = bf16_ms * 1e3;
  state.counters["fp8_us"] = fp8_ms * 1e3;
  state.counters["fused_GBps"] = bytes / (fused_ms * 1e-3) / 1e9;
  state.counters["fused_of_copy"] = bytes / (fused_ms * 1e-3) / copy_bandwidth();
  state.counters["copy_GBps"] = copy_bandwidth() / 1e9;
  state.counters["speedup_bf16"] = bf16_ms > 0 ? bf16_ms / best_int4 : 0.0;
  state.counters["speedup_fp8"] = fp8_ms > 0 ? fp8_ms / best_int4 : 0.0;
  state.counters["fused_wins"] = fused_ms < expand_ms ? 1.0 : 0.0;
  state.counters["splits"] = fused_plan->splits;
  state.SetLabel(shape.name);
}

void register_all() {
  for (std::int64_t s = 0; s < static_cast<std::int64_t>(std::size(shapes)); ++s) {
    for (std::int64_t m : m_values) {
      benchmark::RegisterBenchmark("BM_W4A16", BM_W4A16)
          ->Args({s, m})
          ->UseManualTime()
          ->Iterations(1)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "gemm_w4a16_benchmark needs a GPU\n");
    return 1;
  }
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
