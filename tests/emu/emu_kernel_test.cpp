// Kernels that exercise the emulator the way library kernels do: dynamic shared memory,
// barriers, warp shuffles and votes, atomics, early exits. The same file builds with nvcc
// (KERNEL), so it uses only rt:: APIs and standard CUDA.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/runtime/shared_memory.cuh"
#include "support/random.hpp"

namespace rt = slimserve::rt;

namespace {

constexpr unsigned block_threads = 128;
constexpr unsigned warps_per_block = block_threads / 32;
constexpr int smoothing_rounds = 9;

struct ReduceShared {
  float values[block_threads];
  float warp_sums[warps_per_block];
};

// Per block: smooths its 128 inputs 9 times (neighbour averages, two barriers per round),
// then sums them with warp shuffles. Warps 1..3 leave before warp 0's final shuffles.
__global__ void smooth_and_sum_kernel(const float* __restrict__ input,  // [blocks, 128]
                                      float* __restrict__ block_sums,   // [blocks]
                                      int* __restrict__ ballot_counts)  // [blocks]
{
  auto& shared = rt::shared_storage<ReduceShared>();
  const unsigned tid = threadIdx.x;
  const unsigned lane = tid % 32;
  const unsigned warp = tid / 32;
  shared.values[tid] = input[blockIdx.x * block_threads + tid];
  __syncthreads();
  for (int round = 0; round < smoothing_rounds; ++round) {
    const float mine = shared.values[tid];
    const float next = shared.values[(tid + 1) % block_threads];
    __syncthreads();  // everyone read before anyone writes
    shared.values[tid] = 0.5f * (mine + next);
    __syncthreads();
  }
  float v = shared.values[tid];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  const unsigned positive = __ballot_sync(0xFFFFFFFFu, shared.values[tid] > 0.0f);
  if (lane == 0) {
    shared.warp_sums[warp] = v;
    atomicAdd(&ballot_counts[gridDim.x], __popc(positive));
  }
  const int counted = __syncthreads_count(shared.values[tid] > 0.0f);
  if (warp != 0) return;  // warps 1..3 are done
  float total = lane < warps_per_block ? shared.warp_sums[lane] : 0.0f;
  for (int offset = 2; offset > 0; offset >>= 1) {
    total += __shfl_down_sync(0xFFFFFFFFu, total, static_cast<unsigned>(offset), 4);
  }
  if (lane == 0) {
    block_sums[blockIdx.x] = total;
    ballot_counts[blockIdx.x] = counted;
  }
}

// The block's inputs after the smoothing rounds, computed as the kernel does.
std::vector<float> smoothed_block(const std::vector<float>& input, unsigned block) {
  std::vector<float> v(block_threads);
  for (unsigned t = 0; t < block_threads; ++t) v[t] = input[block * block_threads + t];
  std::vector<float> next(block_threads);
  for (int round = 0; round < smoothing_rounds; ++round) {
    for (unsigned t = 0; t < block_threads; ++t) {
      next[t] = 0.5f * (v[t] + v[(t + 1) % block_threads]);
    }
    v.swap(next);
  }
  return v;
}

}  // namespace

TEST_CASE("reduction with barriers, shuffles, votes and early-exiting warps", "[emu]") {
  constexpr unsigned blocks = 64;
  auto rng = slimserve_test::make_rng(1);
  std::normal_distribution<float> normal(0.25f, 1.0f);
  std::vector<float> input(blocks * block_threads);
  for (float& x : input) x = normal(rng);

  auto d_input = rt::DeviceBuffer<float>::create(input.size());
  auto d_sums = rt::DeviceBuffer<float>::create(blocks);
  auto d_counts = rt::DeviceBuffer<int>::create(blocks + 1);
  REQUIRE(d_input.ok());
  REQUIRE(d_sums.ok());
  REQUIRE(d_counts.ok());
  REQUIRE(d_input->upload(input).ok());
  REQUIRE(d_sums->fill_bytes(0xFF).ok());  // poison: NaN unless written
  REQUIRE(d_counts->fill_bytes(0).ok());

  const rt::LaunchConfig config{dim3(blocks), dim3(block_threads), sizeof(ReduceShared), nullptr};
  const slimserve::Status status = rt::launch(&smooth_and_sum_kernel, config, d_input->data(),
                                              d_sums->data(), d_counts->data());
  INFO(status.to_string());
  REQUIRE(status.ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());

  std::vector<float> sums(blocks);
  std::vector<int> counts(blocks + 1);
  REQUIRE(d_sums->download(sums).ok());
  REQUIRE(d_counts->download(counts).ok());

  int total_positive = 0;
  for (unsigned b = 0; b < blocks; ++b) {
    INFO("block " << b);
    const std::vector<float> v = smoothed_block(input, b);
    double expected_sum = 0;
    int positive = 0;
    for (float x : v) {
      expected_sum += x;
      positive += x > 0.0f ? 1 : 0;
    }
    CHECK(sums[b] == Approx(expected_sum).margin(1e-4).epsilon(1e-5));
    CHECK(counts[b] == positive);
    total_positive += positive;
  }
  CHECK(counts[blocks] == total_positive);
}

namespace {

// Every lane records what each shuffle flavour returns, over a 2-D block with a partial
// last warp (3 x 20 = 60 threads: warp 1 has 28 lanes).
__global__ void shuffle_table_kernel(int* out)  // [60, 6]
{
  const unsigned tid = threadIdx.y * blockDim.x + threadIdx.x;
  const unsigned lane = tid % 32;
  const unsigned mask = tid < 32 ? 0xFFFFFFFFu : 0x0FFFFFFFu;
  const int value = static_cast<int>(tid * 10 + 1);
  int* row = out + tid * 6;
  row[0] = __shfl_sync(mask, value, 3, 8);
  row[1] = __shfl_up_sync(mask, value, 2, 16);
  row[2] = __shfl_down_sync(mask, value, 1, 4);
  row[3] = __shfl_xor_sync(mask, value, 16, 16);  // later groups: own value
  row[4] = static_cast<int>(__ballot_sync(mask, (lane % 3) == 0));
  row[5] = __all_sync(mask, value > 0) * 2 + __any_sync(mask, lane == 27);
}

}  // namespace

TEST_CASE("shuffle flavours follow CUDA's sub-warp rules", "[emu]") {
  constexpr unsigned threads = 60;
  auto d_out = rt::DeviceBuffer<int>::create(threads * 6);
  REQUIRE(d_out.ok());
  REQUIRE(d_out->fill_bytes(0xFF).ok());
  const slimserve::Status status =
      rt::launch(&shuffle_table_kernel, {dim3(1), dim3(20, 3), 0, nullptr}, d_out->data());
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<int> out(threads * 6);
  REQUIRE(d_out->download(out).ok());
  for (unsigned tid = 0; tid < threads; ++tid) {
    INFO("thread " << tid);
    const unsigned lane = tid % 32;
    const unsigned base = tid - lane;
    const unsigned present = tid < 32 ? 32 : 28;
    auto value_of = [&](unsigned l) { return static_cast<int>((base + l) * 10 + 1); };
    CHECK(out[tid * 6 + 0] == value_of((lane & ~7u) + 3));
    CHECK(out[tid * 6 + 1] == value_of((lane % 16) >= 2 ? lane - 2 : lane));
    CHECK(out[tid * 6 + 2] == value_of((lane & 3u) + 1 < 4 ? lane + 1 : lane));
    CHECK(out[tid * 6 + 3] == value_of(lane >= 16 ? lane - 16 : lane));
    unsigned ballot = 0;
    for (unsigned l = 0; l < present; ++l) ballot |= (l % 3 == 0 ? 1u : 0u) << l;
    CHECK(static_cast<unsigned>(out[tid * 6 + 4]) == ballot);
    CHECK(out[tid * 6 + 5] == 2 + 1);
  }
}

namespace {

__global__ void atomics_kernel(unsigned* counters, float* float_sum, int* extremes) {
  const unsigned tid = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&counters[0], 1u);
  atomicInc(&counters[1], 9u);  // wraps every 10
  atomicOr(&counters[2], 1u << (tid % 32));
  atomicAdd(float_sum, 0.5f);
  atomicMax(&extremes[0], static_cast<int>(tid));
  atomicMin(&extremes[1], -static_cast<int>(tid));
  int expected = atomicCAS(&extremes[2], -1, static_cast<int>(tid));
  (void)expected;
  __threadfence();
}

}  // namespace

TEST_CASE("atomics from every thread of several blocks", "[emu]") {
  auto counters = rt::DeviceBuffer<unsigned>::create(3);
  auto float_sum = rt::DeviceBuffer<float>::create(1);
  auto extremes = rt::DeviceBuffer<int>::create(3);
  REQUIRE((counters.ok() && float_sum.ok() && extremes.ok()));
  REQUIRE(counters->fill_bytes(0).ok());
  REQUIRE(float_sum->fill_bytes(0).ok());
  const std::vector<int> start{-1000, 1000, -1};
  REQUIRE(extremes->upload(start).ok());
  REQUIRE(rt::launch(&atomics_kernel, {dim3(3), dim3(64), 0, nullptr}, counters->data(),
                     float_sum->data(), extremes->data())
              .ok());
  std::vector<unsigned> c(3);
  std::vector<float> f(1);
  std::vector<int> e(3);
  REQUIRE(counters->download(c).ok());
  REQUIRE(float_sum->download(f).ok());
  REQUIRE(extremes->download(e).ok());
  CHECK(c[0] == 192u);
  CHECK(c[1] == 192u % 10u);
  CHECK(c[2] == 0xFFFFFFFFu);
  CHECK(f[0] == 96.0f);
  CHECK(e[0] == 191);
  CHECK(e[1] == -191);
  CHECK(e[2] >= 0);
  CHECK(e[2] < 192);
}
