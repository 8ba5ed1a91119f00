// The emulator's own checks: each planted bug makes the launch fail with a device_error that
// names the block and thread, and the next launch runs normally. (Emulator-only: on a GPU
// these kernels are undefined behaviour, not errors.)
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/runtime/shared_memory.cuh"

namespace rt = slimserve::rt;
using slimserve::Status;
using slimserve::StatusCode;

namespace {

// The expected messages name the first offending thread in the default (forward) order.
const bool forward_schedule = [] {
  unsetenv("SLIMSERVE_EMU_SCHEDULE");
  return true;
}();

// Threads of the second block split between two different __syncthreads.
__global__ void divergent_barrier_kernel(int* out) {
  if (blockIdx.x == 1 && threadIdx.x >= 40) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

// Lane 5 of warp 1 leaves; the rest of the warp then shuffles with a full mask.
__global__ void shuffle_with_exited_lane_kernel(int* out) {
  const unsigned tid = threadIdx.x;
  if (tid == 37) return;
  out[tid] = __shfl_xor_sync(0xFFFFFFFFu, static_cast<int>(tid), 1);
}

// A 48-thread block: warp 1 has 16 lanes, but shuffles with a full mask.
__global__ void shuffle_with_absent_lane_kernel(int* out) {
  out[threadIdx.x] = __shfl_down_sync(0xFFFFFFFFu, static_cast<int>(threadIdx.x), 1);
}

// Lanes 0..15 shuffle among themselves, but lane 3 reads lane 20 (outside the mask).
__global__ void shuffle_outside_mask_kernel(int* out) {
  const unsigned lane = threadIdx.x;
  if (lane < 16) {
    out[lane] = __shfl_sync(0x0000FFFFu, static_cast<int>(lane), lane == 3 ? 20 : 0);
  }
}

// The caller is not in its own mask.
__global__ void caller_outside_mask_kernel(int* out) {
  out[threadIdx.x] = static_cast<int>(__ballot_sync(0x0000FFFFu, 1));
}

// Lanes 0..15 wait at __syncwarp(full mask) while lanes 16..31 wait at __syncthreads.
__global__ void deadlock_kernel(int* out) {
  if (threadIdx.x < 16) {
    __syncwarp();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

struct Big {
  float values[256];
};
__global__ void storage_bigger_than_launch_kernel(float* out) {
  auto& shared = rt::shared_storage<Big>();
  shared.values[threadIdx.x] = 1.0f;
  out[threadIdx.x] = shared.values[threadIdx.x];
}

__global__ void trap_kernel(int* out) {
  if (blockIdx.x == 2 && threadIdx.x == 7) __trap();
  out[threadIdx.x] = 1;
}

// Thread 0 spin-waits (backing off with __nanosleep) for a flag that thread 33 sets after
// publishing a value behind a fence: the usual flag pattern, which must work and be
// race-free under TSan.
__global__ void spin_wait_kernel(int* data, int* flag, int* out) {
  if (threadIdx.x == 33) {
    data[0] = 42;
    __threadfence();
    atomicExch(flag, 1);
  }
  if (threadIdx.x == 0) {
    while (atomicAdd(flag, 0) == 0) __nanosleep(100);
    __threadfence();
    out[0] = data[0];
  }
}

// Waits for a flag that only another block could set: blocks run one at a time.
__global__ void spin_forever_kernel(int* flag) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    while (atomicAdd(flag, 0) == 0) __nanosleep(100);
  }
  if (blockIdx.x == 1) atomicExch(flag, 1);
}

// The same wait without __nanosleep: atomics yield now and then, so it ends too.
__global__ void atomic_spin_forever_kernel(int* flag) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    while (atomicAdd(flag, 0) == 0) {
    }
  }
}

// Records the order in which threads pass two points (before and after a barrier).
__global__ void order_kernel(int* counter, int* tickets) {
  tickets[threadIdx.x] = atomicAdd(counter, 1);
  __syncthreads();
  tickets[blockDim.x + threadIdx.x] = atomicAdd(counter, 1);
}

// A healthy kernel: proves the emulator recovers after an aborted launch.
__global__ void healthy_kernel(int* out) {
  int v = static_cast<int>(threadIdx.x);
  v += __shfl_xor_sync(0xFFFFFFFFu, v, 16);
  __syncthreads();
  out[threadIdx.x] = v;
}

void expect_error(const Status& status, const std::vector<std::string>& fragments) {
  INFO(status.to_string());
  REQUIRE_FALSE(status.ok());
  for (const std::string& fragment : fragments) {
    INFO("expected fragment: " << fragment);
    CHECK(status.message().find(fragment) != std::string_view::npos);
  }
}

void expect_healthy_launch_works() {
  auto out = rt::DeviceBuffer<int>::create(64);
  REQUIRE(out.ok());
  const Status status = rt::launch(&healthy_kernel, {dim3(2), dim3(64), 0, nullptr}, out->data());
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<int> host(64);
  REQUIRE(out->download(host).ok());
  for (int t = 0; t < 64; ++t) {
    INFO("thread " << t);
    CHECK(host[t] == t + (t ^ 16));
  }
}

}  // namespace

TEST_CASE("divergent __syncthreads is reported with block and thread", "[emu][checks]") {
  auto out = rt::DeviceBuffer<int>::create(3 * 64);
  REQUIRE(out.ok());
  const Status status =
      rt::launch(&divergent_barrier_kernel, {dim3(3), dim3(64), 0, nullptr}, out->data());
  CHECK(status.code() == StatusCode::device_error);
  expect_error(status, {"divergent barrier", "block (1,0,0)", "thread (", "__syncthreads at",
                        "emu_checks_test.cpp"});
  expect_healthy_launch_works();
}

TEST_CASE("bad shuffle masks are reported", "[emu][checks]") {
  auto out = rt::DeviceBuffer<int>::create(64);
  REQUIRE(out.ok());
  SECTION("mask names a lane that has exited") {
    expect_error(rt::launch(&shuffle_with_exited_lane_kernel, {dim3(1), dim3(64), 0, nullptr},
                            out->data()),
                 {"block (0,0,0)", "__shfl_xor_sync", "exited"});
  }
  SECTION("mask names a lane that does not exist") {
    expect_error(rt::launch(&shuffle_with_absent_lane_kernel, {dim3(1), dim3(48), 0, nullptr},
                            out->data()),
                 {"thread (32,0,0)", "__shfl_down_sync", "do not exist"});
  }
  SECTION("shuffle reads a lane outside the mask") {
    expect_error(rt::launch(&shuffle_outside_mask_kernel, {dim3(1), dim3(32), 0, nullptr},
                            out->data()),
                 {"thread (3,0,0)", "reads lane 20", "not in the mask 0x0000ffff"});
  }
  SECTION("caller outside its own mask") {
    expect_error(rt::launch(&caller_outside_mask_kernel, {dim3(1), dim3(32), 0, nullptr},
                            out->data()),
                 {"thread (16,0,0)", "__ballot_sync", "does not include the calling lane 16"});
  }
  expect_healthy_launch_works();
}

TEST_CASE("a deadlock is reported instead of hanging", "[emu][checks]") {
  auto out = rt::DeviceBuffer<int>::create(32);
  REQUIRE(out.ok());
  expect_error(rt::launch(&deadlock_kernel, {dim3(1), dim3(32), 0, nullptr}, out->data()),
               {"deadlock", "__syncwarp", "__syncthreads"});
  expect_healthy_launch_works();
}

TEST_CASE("shared memory limits are enforced", "[emu][checks]") {
  auto out = rt::DeviceBuffer<float>::create(64);
  REQUIRE(out.ok());
  SECTION("over the 227 KB limit") {
    const Status status = rt::launch(&storage_bigger_than_launch_kernel,
                                     {dim3(1), dim3(64), 228 * 1024, nullptr}, out->data());
    CHECK(status.code() == StatusCode::resource_exhausted);
    expect_error(status, {"232448", "limit"});
  }
  SECTION("shared_storage<T> larger than the launch's dynamic shared memory") {
    expect_error(rt::launch(&storage_bigger_than_launch_kernel,
                            {dim3(1), dim3(64), sizeof(Big) - 4, nullptr}, out->data()),
                 {"thread (0,0,0)", "needs 1024 bytes", "gave 1020"});
  }
  expect_healthy_launch_works();
}

TEST_CASE("__trap fails the launch at the trapping thread", "[emu][checks]") {
  auto out = rt::DeviceBuffer<int>::create(32);
  REQUIRE(out.ok());
  expect_error(rt::launch(&trap_kernel, {dim3(4), dim3(32), 0, nullptr}, out->data()),
               {"block (2,0,0) thread (7,0,0)", "__trap"});
  expect_healthy_launch_works();
}

TEST_CASE("spin-waits that back off with __nanosleep make progress", "[emu][checks]") {
  auto data = rt::DeviceBuffer<int>::create(1);
  auto flag = rt::DeviceBuffer<int>::create(1);
  auto out = rt::DeviceBuffer<int>::create(1);
  REQUIRE((data.ok() && flag.ok() && out.ok()));
  REQUIRE(flag->fill_bytes(0).ok());
  REQUIRE(out->fill_bytes(0xFF).ok());
  const Status status = rt::launch(&spin_wait_kernel, {dim3(1), dim3(64), 0, nullptr},
                                   data->data(), flag->data(), out->data());
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<int> host(1);
  REQUIRE(out->download(host).ok());
  CHECK(host[0] == 42);
}

TEST_CASE("a spin-wait on another block is reported as a livelock", "[emu][checks]") {
  auto flag = rt::DeviceBuffer<int>::create(1);
  REQUIRE(flag.ok());
  REQUIRE(flag->fill_bytes(0).ok());
  expect_error(rt::launch(&spin_forever_kernel, {dim3(2), dim3(32), 0, nullptr}, flag->data()),
               {"livelock", "block (0,0,0) thread (0,0,0)", "__nanosleep at"});
  expect_error(
      rt::launch(&atomic_spin_forever_kernel, {dim3(2), dim3(32), 0, nullptr}, flag->data()),
      {"livelock", "block (0,0,0) thread (0,0,0)", "atomic operations"});
  expect_healthy_launch_works();
}

TEST_CASE("SLIMSERVE_EMU_SCHEDULE=reverse runs threads last-first", "[emu][checks]") {
  constexpr int threads = 40;
  auto counter = rt::DeviceBuffer<int>::create(1);
  auto tickets = rt::DeviceBuffer<int>::create(2 * threads);
  REQUIRE((counter.ok() && tickets.ok()));
  for (const bool reverse : {true, false}) {
    INFO("reverse " << reverse);
    if (reverse) {
      setenv("SLIMSERVE_EMU_SCHEDULE", "reverse", 1);
    } else {
      unsetenv("SLIMSERVE_EMU_SCHEDULE");
    }
    REQUIRE(counter->fill_bytes(0).ok());
    const Status status = rt::launch(&order_kernel, {dim3(1), dim3(threads), 0, nullptr},
                                     counter->data(), tickets->data());
    INFO(status.to_string());
    REQUIRE(status.ok());
    std::vector<int> host(2 * threads);
    REQUIRE(tickets->download(host).ok());
    for (int t = 0; t < threads; ++t) {
      INFO("thread " << t);
      const int rank = reverse ? threads - 1 - t : t;
      CHECK(host[t] == rank);
      CHECK(host[threads + t] == threads + rank);
    }
  }
  unsetenv("SLIMSERVE_EMU_SCHEDULE");
}
