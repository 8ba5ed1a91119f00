// Grouped (MoE) W4A16 GEMM on a Kimi K2-like decode step, against a per-expert cuBLASLt BF16
// loop. Needs a GPU: without one it prints why and exits with 77 (scripts/gpu-check: SKIP).
//
// The layer: T tokens, top-8 of 384 experts, hidden 7168, expert intermediate 2048, INT4
// group 32 (as the checkpoint ships). One alignment (run_moe_routing) feeds the gate+up
// (n = 2 x 2048, SiLU . mul) and the down (k = 2048, n = 7168, router-weighted sum) GEMMs.
//
// Counters (microseconds are CUDA-event means over `iterations` launches):
//   align_us, up_us, down_us, layer_us   alignment, each GEMM, and all three in a row
//   hit_experts                          experts that received at least one token
//   hit_weight_MB                        INT4 codes + scales of the hit experts (up + down)
//   layer_of_copy                        hit_weight_bytes / layer time, as a fraction of a
//                                        device-to-device copy's bandwidth in the same run
//                                        (issue target: >= 0.70 at T = 64)
//   cublas_loop_us                       per-hit-expert cuBLASLt BF16 GEMMs (up m x 4096 and
//                                        down m x 7168, m = the expert's tokens): the GEMMs
//                                        only, no gather, SiLU or combine, so a lower bound
//                                        for the per-expert-loop approach
//   speedup_cublas                       cublas_loop_us / layer_us
#include <benchmark/benchmark.h>
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "slimserve/int4/moe.hpp"

using namespace slimserve;
using namespace slimserve::int4;

namespace {

constexpr std::int64_t experts = 384;
constexpr std::int64_t top_k = 8;
constexpr std::int64_t hidden = 7168;
constexpr std::int64_t intermediate = 2048;
constexpr std::int64_t group = 32;
constexpr std::int64_t token_counts[] = {1, 16, 64, 256};
constexpr int iterations = 20;

#define BENCH_CHECK(expr)                                                    \
  do {                                                                       \
    if (!(expr)) {                                                           \
      std::fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #expr); \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

/// A device allocation filled with one byte value (finite, non-zero numbers; the speed does
/// not depend on the values).
class DeviceBytes {
 public:
  DeviceBytes(std::size_t bytes, int byte) : bytes_(std::max<std::size_t>(bytes, 1)) {
    BENCH_CHECK(cudaMalloc(&data_, bytes_) == cudaSuccess);
    BENCH_CHECK(cudaMemset(data_, byte, bytes_) == cudaSuccess);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() { cudaFree(data_); }
  template <class T = void>
  T* data() const {
    return static_cast<T*>(data_);
  }
  std::size_t size() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_;
};

float time_ms(const std::function<void()>& work) {
  cudaEvent_t start;
  cudaEvent_t stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  work();  // warm-up
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

double copy_bandwidth() {
  static const double bandwidth = [] {
    const std::size_t bytes = std::size_t{1} << 30;
    const DeviceBytes src(bytes, 1);
    const DeviceBytes dst(bytes, 2);
    const float ms = time_ms([&] {
      cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, nullptr);
    });
    return 2.0 * static_cast<double>(bytes) / (static_cast<double>(ms) * 1e-3);
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

/// Row-major C[m, n] = A[m, k] . W[k, n] in BF16 with FP32 accumulation (column-major:
/// C^T[n, m] = W^T[n, k] . A^T[k, m], no transposes).
class LtBf16Gemm {
 public:
  LtBf16Gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::size_t workspace_bytes) {
    const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatrixLayoutCreate(&w_, CUDA_R_16BF, u(n), u(k), n);
    cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, u(k), u(m), k);
    cublasLtMatrixLayoutCreate(&c_, CUDA_R_16BF, u(n), u(m), n);
    cublasLtMatmulPreference_t preference = nullptr;
    cublasLtMatmulPreferenceCreate(&preference);
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace_bytes, sizeof(workspace_bytes));
    int found = 0;
    ok_ = cublasLtMatmulAlgoGetHeuristic(lt(), op_, w_, a_, c_, c_, preference, 1, &heuristic_,
                                         &found) == CUBLAS_STATUS_SUCCESS &&
          found > 0;
    cublasLtMatmulPreferenceDestroy(preference);
  }
  LtBf16Gemm(const LtBf16Gemm&) = delete;
  LtBf16Gemm& operator=(const LtBf16Gemm&) = delete;
  ~LtBf16Gemm() {
    if (c_) cublasLtMatrixLayoutDestroy(c_);
    if (a_) cublasLtMatrixLayoutDestroy(a_);
    if (w_) cublasLtMatrixLayoutDestroy(w_);
    if (op_) cublasLtMatmulDescDestroy(op_);
  }
  bool ok() const { return ok_; }
  void run(const void* weights, const void* activations, void* out, void* workspace,
           std::size_t workspace_bytes) const {
    const float alpha = 1.0f;
    const float beta = 0.0f;
    cublasLtMatmul(lt(), op_, &alpha, weights, w_, activations, a_, &beta, out, c_, out, c_,
                   &heuristic_.algo, workspace, workspace_bytes, nullptr);
  }

 private:
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t w_ = nullptr, a_ = nullptr, c_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_{};
  bool ok_ = false;
};

/// top_k distinct experts per token, uniformly (a fixed seed: every run times the same
/// routing), and the tokens each expert receives.
struct DecodeRouting {
  std::vector<std::int32_t> ids;
  std::vector<float> weights;
  std::vector<std::int64_t> tokens_of_expert;  // [E]
  std::int64_t hit = 0;
};

DecodeRouting make_routing(std::int64_t tokens) {
  DecodeRouting r;
  std::mt19937_64 rng(20261130);
  std::vector<std::int32_t> pool(experts);
  std::iota(pool.begin(), pool.end(), 0);
  r.tokens_of_expert.assign(experts, 0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);
    for (std::int64_t s = 0; s < top_k; ++s) {
      const std::int32_t e = pool[static_cast<std::size_t>(s)];
      r.ids.push_back(e);
      r.weights.push_back(1.0f / static_cast<float>(top_k));
      ++r.tokens_of_expert[static_cast<std::size_t>(e)];
    }
  }
  r.hit = std::count_if(r.tokens_of_expert.begin(), r.tokens_of_expert.end(),
                        [](std::int64_t count) { return count > 0; });
  return r;
}

void BM_MoeDecodeLayer(benchmark::State& state) {
  const std::int64_t tokens = state.range(0);
  const std::int64_t pairs = tokens * top_k;
  const DecodeRouting routing = make_routing(tokens);
  const auto e = static_cast<std::size_t>(experts);
  const std::size_t up_words = static_cast<std::size_t>(hidden * 2 * intermediate / 8);
  const std::size_t down_words = static_cast<std::size_t>(intermediate * hidden / 8);
  const std::size_t up_scales = static_cast<std::size_t>(hidden / group * 2 * intermediate);
  const std::size_t down_scales = static_cast<std::size_t>(intermediate / group * hidden);

  const DeviceBytes x(static_cast<std::size_t>(tokens * hidden) * 2, 0x3C);  // BF16 0.0115
  const DeviceBytes up_b(e * up_words * 4, 0x5A);
  const DeviceBytes up_s(e * up_scales * 2, 0x3C);
  const DeviceBytes down_b(e * down_words * 4, 0x5A);
  const DeviceBytes down_s(e * down_scales * 2, 0x3C);
  const DeviceBytes ids(static_cast<std::size_t>(pairs) * 4, 0);
  const DeviceBytes weights(static_cast<std::size_t>(pairs) * 4, 0);
  BENCH_CHECK(cudaMemcpy(ids.data(), routing.ids.data(), ids.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  BENCH_CHECK(cudaMemcpy(weights.data(), routing.weights.data(), weights.size(),
                         cudaMemcpyHostToDevice) == cudaSuccess);
  const DeviceBytes inter(static_cast<std::size_t>(pairs * intermediate) * 2, 0);
  const DeviceBytes out(static_cast<std::size_t>(tokens * hidden) * 2, 0);

  MoeGemmArguments up;
  up.activation = ActivationType::bf16;
  up.epilogue = MoeEpilogue::gate_up_silu;
  up.num_tokens = tokens;
  up.top_k = top_k;
  up.num_experts = experts;
  up.k = hidden;
  up.n = 2 * intermediate;
  up.group_size = group;
  up.a = x.data();
  up.b = up_b.data<std::uint32_t>();
  up.scales = up_s.data();
  up.topk_ids = ids.data<std::int32_t>();
  up.topk_weights = weights.data<float>();
  up.c = inter.data();
  MoeGemmArguments down = up;
  down.epilogue = MoeEpilogue::down_weighted_sum;
  down.k = intermediate;
  down.n = hidden;
  down.a = inter.data();
  down.b = down_b.data<std::uint32_t>();
  down.scales = down_s.data();
  down.c = out.data();
  const MoeRoutingArguments routing_args{tokens, top_k, experts, ids.data<std::int32_t>()};

  Result<MoeRoutingPlan> routing_plan = plan_moe_routing(routing_args);
  Result<MoeGemmPlan> up_plan = plan_moe_gemm(up);
  Result<MoeGemmPlan> down_plan = plan_moe_gemm(down);
  BENCH_CHECK(routing_plan.ok() && up_plan.ok() && down_plan.ok());
  const DeviceBytes routing_workspace(routing_plan->workspace_bytes(), 0);
  const DeviceBytes gemm_workspace(
      std::max(up_plan->gemm_workspace_bytes(), down_plan->gemm_workspace_bytes()), 0);
  MoeRouting aligned;
  auto align = [&] {
    Result<MoeRouting> r = run_moe_routing(routing_args, *routing_plan, routing_workspace.data(),
                                           routing_workspace.size(), nullptr);
    BENCH_CHECK(r.ok());
    aligned = *r;
  };
  auto run_up = [&] {
    BENCH_CHECK(run_moe_gemm(up, *up_plan, aligned, gemm_workspace.data(), gemm_workspace.size(),
                             nullptr).ok());
  };
  auto run_down = [&] {
    BENCH_CHECK(run_moe_gemm(down, *down_plan, aligned, gemm_workspace.data(),
                             gemm_workspace.size(), nullptr).ok());
  };
  align();
  BENCH_CHECK(read_moe_routing_status(aligned, nullptr).ok());

  // The per-expert cuBLASLt loop: dense BF16 weights of the hit experts only, one prepared
  // GEMM per distinct token count.
  const std::size_t lt_workspace_bytes = std::size_t{32} << 20;
  const DeviceBytes lt_workspace(lt_workspace_bytes, 0);
  const auto hit = static_cast<std::size_t>(routing.hit);
  const DeviceBytes dense_up(hit * static_cast<std::size_t>(hidden * 2 * intermediate) * 2, 0x3C);
  const DeviceBytes dense_down(hit * static_cast<std::size_t>(intermediate * hidden) * 2, 0x3C);
  const DeviceBytes dense_x(static_cast<std::size_t>(pairs * hidden) * 2, 0x3C);
  const DeviceBytes dense_inter(static_cast<std::size_t>(pairs * 2 * intermediate) * 2, 0x3C);
  const DeviceBytes dense_out(static_cast<std::size_t>(pairs * hidden) * 2, 0);
  std::map<std::int64_t, std::unique_ptr<LtBf16Gemm>> up_gemms, down_gemms;
  bool cublas_ok = true;
  for (std::int64_t m : routing.tokens_of_expert) {
    if (m == 0 || up_gemms.count(m) != 0) continue;
    up_gemms[m] = std::make_unique<LtBf16Gemm>(m, 2 * intermediate, hidden, lt_workspace_bytes);
    down_gemms[m] = std::make_unique<LtBf16Gemm>(m, hidden, intermediate, lt_workspace_bytes);
    cublas_ok = cublas_ok && up_gemms[m]->ok() && down_gemms[m]->ok();
  }
  auto cublas_loop = [&] {
    std::size_t slot = 0;
    for (std::int64_t m : routing.tokens_of_expert) {
      if (m == 0) continue;
      const std::size_t up_at = slot * static_cast<std::size_t>(hidden * 2 * intermediate) * 2;
      const std::size_t down_at = slot * static_cast<std::size_t>(intermediate * hidden) * 2;
      up_gemms[m]->run(dense_up.data<unsigned char>() + up_at, dense_x.data(), dense_inter.data(),
                       lt_workspace.data(), lt_workspace_bytes);
      down_gemms[m]->run(dense_down.data<unsigned char>() + down_at, dense_inter.data(),
                         dense_out.data(), lt_workspace.data(), lt_workspace_bytes);
      ++slot;
    }
  };

  double align_ms = 0, up_ms = 0, down_ms = 0, layer_ms = 0, cublas_ms = 0;
  for (auto _ : state) {
    align_ms = time_ms(align);
    up_ms = time_ms(run_up);
    down_ms = time_ms(run_down);
    layer_ms = time_ms([&] {
      align();
      run_up();
      run_down();
    });
    cublas_ms = cublas_ok ? time_ms(cublas_loop) : 0.0;
    state.SetIterationTime(layer_ms * 1e-3);
  }
  const double hit_bytes = static_cast<double>(routing.hit) *
                           static_cast<double>((up_words + down_words) * 4 + (up_scales + down_scales) * 2);
  state.counters["align_us"] = align_ms * 1e3;
  state.counters["up_us"] = up_ms * 1e3;
  state.counters["down_us"] = down_ms * 1e3;
  state.counters["layer_us"] = layer_ms * 1e3;
  state.counters["hit_experts"] = static_cast<double>(routing.hit);
  state.counters["hit_weight_MB"] = hit_bytes / 1e6;
  state.counters["layer_of_copy"] = hit_bytes / (layer_ms * 1e-3) / copy_bandwidth();
  state.counters["copy_GBps"] = copy_bandwidth() / 1e9;
  state.counters["cublas_loop_us"] = cublas_ms * 1e3;
  state.counters["speedup_cublas"] = cublas_ms > 0 ? cublas_ms / layer_ms : 0.0;
  char label[64];
  std::snprintf(label, sizeof(label), "T%lld top8 E384 k7168 n2048x2 g32",
                static_cast<long long>(tokens));
  state.SetLabel(label);
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "moe_w4a16_bench_gpu: no GPU, skipped\n");
    return 77;  // scripts/gpu-check reports SKIP
  }
  for (std::int64_t tokens : token_counts) {
    benchmark::RegisterBenchmark("BM_MoeDecodeLayer", BM_MoeDecodeLayer)
        ->Arg(tokens)
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
