// Times the SASS report's calibration kernels (tests/perf/calibration_kernels.cuh) with CUDA
// events. Counters: bytes_per_second (DRAM bytes the kernel must move: read + write) and, for
// the mma loop, fma_per_second. Compare with the predicted fractions of docs/perf/static.md:
// copy16 ≈ copy bandwidth; alu_copy16 and mma_loop at the fractions their bound allows.
// The honest model's calibration kernels (one per fix, docs/perf/h200-model.md) report
// fma_per_second for the wgmma loops (tensor fraction = fma_per_second / (2048 x 132 x
// 1.83e9)); scripts/gpu-check also profiles each with Nsight Compute (sass_report.fit).
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "calibration_kernels.cuh"

namespace {

namespace cal = slimserve_calibration;

constexpr std::int64_t buffer_bytes = std::int64_t{1} << 30;  // 1 GiB: many times the L2

int sm_count() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return count;
}

/// Runs `launch` under CUDA events; reports `bytes` and `fmas` per iteration as rates.
template <class Launch>
void time_kernel(benchmark::State& state, double bytes, double fmas, Launch launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  launch();  // warm-up
  for (auto _ : state) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(static_cast<double>(ms) / 1e3);
  }
  if (cudaGetLastError() != cudaSuccess) state.SkipWithError("kernel launch failed");
  state.counters["bytes_per_second"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
  if (fmas > 0) {
    state.counters["fma_per_second"] =
        benchmark::Counter(fmas, benchmark::Counter::kIsIterationInvariantRate);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

struct Buffers {
  void* src = nullptr;
  void* dst = nullptr;
  bool ok() const { return src != nullptr && dst != nullptr; }
  Buffers() {
    if (cudaMalloc(&src, buffer_bytes) != cudaSuccess) src = nullptr;
    if (cudaMalloc(&dst, buffer_bytes) != cudaSuccess) dst = nullptr;
    if (ok()) cudaMemset(src, 0x3c, buffer_bytes);  // finite bf16/float patterns
  }
  ~Buffers() {
    cudaFree(src);
    cudaFree(dst);
  }
};

void BM_Copy16(benchmark::State& state) {
  const int sms = sm_count();
  Buffers b;
  if (sms == 0 || !b.ok()) return state.SkipWithError("no GPU");
  const std::int64_t n = buffer_bytes / 16;
  const unsigned ctas = static_cast<unsigned>(sms * 8);
  time_kernel(state, 2.0 * buffer_bytes, 0, [&] {
    cal::copy16_kernel<<<ctas, 256>>>(static_cast<const uint4*>(b.src), static_cast<uint4*>(b.dst), n);
  });
}

void BM_AluCopy16(benchmark::State& state) {
  const int sms = sm_count();
  Buffers b;
  if (sms == 0 || !b.ok()) return state.SkipWithError("no GPU");
  const std::int64_t n = buffer_bytes / 16;
  const unsigned ctas = static_cast<unsigned>(sms * 8);
  time_kernel(state, 2.0 * buffer_bytes, 4.0 * cal::alu_rounds * static_cast<double>(n), [&] {
    cal::alu_copy16_kernel<<<ctas, 256>>>(static_cast<const float4*>(b.src),
                                          static_cast<float4*>(b.dst), n, 0.999f, 0.001f);
  });
}

void BM_MmaLoop(benchmark::State& state) {
  const int sms = sm_count();
  Buffers b;
  if (sms == 0 || !b.ok()) return state.SkipWithError("no GPU");
  const std::int64_t n = buffer_bytes / 16;
  const unsigned ctas = static_cast<unsigned>(sms * 16);
  // Per 32 threads and 16-byte load each: mma_per_load mma of 16 x 8 x 16 multiply-adds.
  const double fmas = static_cast<double>(n) / 32.0 * cal::mma_per_load * 16 * 8 * 16;
  time_kernel(state, static_cast<double>(buffer_bytes), fmas, [&] {
    cal::mma_loop_kernel<<<ctas, 128>>>(static_cast<const uint4*>(b.src),
                                        static_cast<float4*>(b.dst), n);
  });
}

void BM_Copy16OneWarp(benchmark::State& state) {
  const int sms = sm_count();
  Buffers b;
  if (sms == 0 || !b.ok()) return state.SkipWithError("no GPU");
  const std::int64_t n = buffer_bytes / 16;
  time_kernel(state, 2.0 * buffer_bytes, 0, [&] {
    cal::copy16_one_warp_kernel<<<static_cast<unsigned>(sms), 128>>>(
        static_cast<const uint4*>(b.src), static_cast<uint4*>(b.dst), n);
  });
}

void BM_Copy16Small(benchmark::State& state) {
  const int sms = sm_count();
  Buffers b;
  if (sms == 0 || !b.ok()) return state.SkipWithError("no GPU");
  constexpr std::int64_t small_bytes = std::int64_t{64} << 20;  // 64 MiB
  const unsigned ctas = static_cast<unsigned>(sms * 8);
  time_kernel(state, 2.0 * small_bytes, 0, [&] {
    cal::copy16_small_kernel<<<ctas, 256>>>(static_cast<const uint4*>(b.src),
                                            static_cast<uint4*>(b.dst), small_bytes / 16);
  });
}

void BM_ImadCopy16(benchmark::State& state) {
  const int sms = sm_count();
  Buffers b;
  if (sms == 0 || !b.ok()) return state.SkipWithError("no GPU");
  const std::int64_t n = buffer_bytes / 16;
  const unsigned ctas = static_cast<unsigned>(sms * 8);
  time_kernel(state, 2.0 * buffer_bytes, 0, [&] {
    cal::imad_copy16_kernel<<<ctas, 256>>>(static_cast<const uint4*>(b.src),
                                           static_cast<uint4*>(b.dst), n, 3u, 1u);
  });
}

constexpr int calibration_trips = 4096;

/// m64nNk16 SS wgmma loop: 4 CTAs per SM, each trip wgmma_steps instructions.
template <int N>
void BM_SsWgmma(benchmark::State& state) {
  const int sms = sm_count();
  Buffers b;
  if (sms == 0 || !b.ok()) return state.SkipWithError("no GPU");
  const unsigned ctas = static_cast<unsigned>(sms * 4);
  const double fmas = static_cast<double>(ctas) * calibration_trips * cal::wgmma_steps * 64.0 * N * 16;
  const double bytes = static_cast<double>(ctas) * 128 * (N / 2) * 4;
  time_kernel(state, bytes, fmas, [&] {
    cal::ss_wgmma_loop_kernel<N><<<ctas, 128>>>(static_cast<float*>(b.dst), calibration_trips);
  });
}

void BM_Phased(benchmark::State& state) {
  const int sms = sm_count();
  Buffers b;
  if (sms == 0 || !b.ok()) return state.SkipWithError("no GPU");
  const unsigned ctas = static_cast<unsigned>(sms);
  const double fmas = static_cast<double>(ctas) * calibration_trips * 64 * 64.0 * 64 * 16;
  time_kernel(state, static_cast<double>(ctas) * 128 * 32 * 4, fmas, [&] {
    cal::phased_kernel<<<ctas, 128>>>(static_cast<float*>(b.dst), calibration_trips, 0.999f,
                                      0.001f);
  });
}

void BM_PingPongPhased(benchmark::State& state) {
  const int sms = sm_count();
  Buffers b;
  if (sms == 0 || !b.ok()) return state.SkipWithError("no GPU");
  const unsigned ctas = static_cast<unsigned>(sms);
  // two warpgroups per CTA, each with phased_kernel's work
  const double fmas = 2.0 * ctas * calibration_trips * 64 * 64.0 * 64 * 16;
  time_kernel(state, static_cast<double>(ctas) * 256 * 32 * 4, fmas, [&] {
    cal::pingpong_phased_kernel<<<ctas, 256>>>(static_cast<float*>(b.dst), calibration_trips, 0.999f,
                                               0.001f);
  });
}

}  // namespace

BENCHMARK(BM_Copy16OneWarp)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Copy16Small)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ImadCopy16)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SsWgmma<16>)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SsWgmma<32>)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SsWgmma<64>)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Phased)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PingPongPhased)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Copy16)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AluCopy16)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MmaLoop)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
