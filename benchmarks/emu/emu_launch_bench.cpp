// What an emulated launch costs: 64 blocks x 128 threads, 19 __syncthreads and 10 warp
// shuffles per thread (the size the test guide recommends for one kernel-test launch).
#include <benchmark/benchmark.h>

#include <vector>

#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/runtime/shared_memory.cuh"

namespace rt = slimserve::rt;

namespace {

constexpr unsigned block_threads = 128;

struct Shared {
  float values[block_threads];
  float warp_sums[block_threads / 32];
};

__global__ void smooth_and_sum_kernel(const float* input, float* block_sums) {
  auto& shared = rt::shared_storage<Shared>();
  const unsigned tid = threadIdx.x;
  shared.values[tid] = input[blockIdx.x * block_threads + tid];
  __syncthreads();
  for (int round = 0; round < 9; ++round) {
    const float mine = shared.values[tid];
    const float next = shared.values[(tid + 1) % block_threads];
    __syncthreads();
    shared.values[tid] = 0.5f * (mine + next);
    __syncthreads();
  }
  float v = shared.values[tid];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  if (tid % 32 == 0) shared.warp_sums[tid / 32] = v;
  __syncthreads();
  if (tid >= 32) return;
  float total = tid < 4 ? shared.warp_sums[tid] : 0.0f;
  for (int offset = 16; offset > 0; offset >>= 1) {
    total += __shfl_down_sync(0xFFFFFFFFu, total, static_cast<unsigned>(offset));
  }
  if (tid == 0) block_sums[blockIdx.x] = total;
}

void BM_emulated_launch_64x128(benchmark::State& state) {
  constexpr unsigned blocks = 64;
  std::vector<float> host(blocks * block_threads, 1.0f);
  auto input = rt::DeviceBuffer<float>::create(host.size());
  auto sums = rt::DeviceBuffer<float>::create(blocks);
  if (!input.ok() || !sums.ok() || !input->upload(host).ok()) {
    state.SkipWithError("allocation failed");
    return;
  }
  const rt::LaunchConfig config{dim3(blocks), dim3(block_threads), sizeof(Shared), nullptr};
  for (auto _ : state) {
    const slimserve::Status status =
        rt::launch(&smooth_and_sum_kernel, config, input->data(), sums->data());
    if (!status.ok()) {
      state.SkipWithError(status.to_string().c_str());
      return;
    }
  }
  const double switches_per_launch = blocks * block_threads * (20.0 + 10.0) * 2.0;
  state.counters["switches/s"] = benchmark::Counter(switches_per_launch * static_cast<double>(state.iterations()),
                                                    benchmark::Counter::kIsRate);
}
BENCHMARK(BM_emulated_launch_64x128)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
