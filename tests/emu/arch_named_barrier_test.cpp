// Named barriers (bar.sync / bar.arrive) and setmaxnreg on the emulator: a warp-specialized
// kernel in the shape prefill uses (one producer warpgroup that drops its registers and fills
// two shared-memory stages, two consumer warpgroups that take them in turn and order their
// work by a ping-pong pair of barriers) gives exactly the host's sums and the alternating turn
// order; each broken rule of the PTX ISA's barrier{.cta} and setmaxnreg text fails the launch
// with a message that names it; the next launch runs normally. (Not a KERNEL test: the error
// kernels are undefined behaviour on a GPU.)
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "slimserve/arch/named_barrier.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/runtime/shared_memory.cuh"
#include "support/random.hpp"

namespace rt = slimserve::rt;
namespace arch = slimserve::arch;
using slimserve::Status;

namespace {

const bool forward_schedule = [] {
  unsetenv("SLIMSERVE_EMU_SCHEDULE");
  return true;
}();

constexpr int warpgroup = 128;
constexpr int stages = 2;
constexpr int tiles = 6;  // per consumer warpgroup
constexpr int values = 128;  // per tile: one per consumer thread
// Barrier ids: a stage full (producer arrives, the consumer waits), a stage empty (the consumer
// arrives, the producer waits), a consumer's turn (the other consumer arrives, it waits).
constexpr std::uint32_t full_barrier = 1;    // + stage
constexpr std::uint32_t empty_barrier = 3;   // + stage
constexpr std::uint32_t turn_barrier = 5;    // + consumer
constexpr std::uint32_t pair = 2 * warpgroup;  // producer + one consumer, or both consumers

struct PipelineShared {
  float stage[stages][values];
  int turns;  // the consumers' turns so far, advanced by the consumer whose turn it is
};

// Tile k goes to consumer k % 2 through stage k % 2: stage s always serves consumer s, so
// the full/empty barriers of a stage pair the producer with that one consumer.
__global__ void pipeline_kernel(const float* __restrict__ in,  // [2 * tiles][values]
                                float* __restrict__ sums,      // [2][values]
                                int* __restrict__ order)       // [2 * tiles]: turn -> consumer
{
  auto& s = rt::shared_storage<PipelineShared>();
  const int role = static_cast<int>(threadIdx.x) / warpgroup;  // 0 producer, 1 and 2 consumers
  const int t = static_cast<int>(threadIdx.x) % warpgroup;
  if (threadIdx.x == 0) s.turns = 0;
  __syncthreads();
  if (role == 0) {
    arch::set_max_registers_dec<40>();
    for (int k = 0; k < 2 * tiles; ++k) {
      const int stage = k % stages;
      if (k >= stages) arch::named_barrier_sync(empty_barrier + stage, pair);  // consumer done with it
      s.stage[stage][t] = in[k * values + t];
      arch::named_barrier_arrive(full_barrier + stage, pair);
    }
    return;
  }
  arch::set_max_registers_inc<232>();
  const int consumer = role - 1;
  const int stage = consumer;
  float sum = 0.0f;
  // Consumer 0 starts; consumer 1 waits for consumer 0's first turn.
  if (consumer == 1) arch::named_barrier_sync(turn_barrier + 1, pair);
  for (int k = 0; k < tiles; ++k) {
    arch::named_barrier_sync(full_barrier + stage, pair);
    sum += s.stage[stage][t] * static_cast<float>(k + 1);
    if (t == 0) order[s.turns++] = consumer;
    // The stage is free again, and it is the other consumer's turn.
    if (k + 1 < tiles) arch::named_barrier_arrive(empty_barrier + stage, pair);
    if (consumer == 0 || k + 1 < tiles) arch::named_barrier_arrive(turn_barrier + (1 - consumer), pair);
    if (k + 1 < tiles) arch::named_barrier_sync(turn_barrier + consumer, pair);
  }
  sums[consumer * values + t] = sum;
}

// Each broken rule, one kernel each (128 threads unless said).
__global__ void barrier_zero_kernel(int*) { arch::named_barrier_sync(0, 128); }
__global__ void odd_count_kernel(int*) { arch::named_barrier_sync(2, 48); }
__global__ void too_many_threads_kernel(int*) { arch::named_barrier_sync(2, 256); }
__global__ void mixed_counts_kernel(int*) {
  arch::named_barrier_sync(3, threadIdx.x < 64 ? 128 : 96);
}
__global__ void partial_warp_kernel(int*) {
  // Lanes 0..15 of warp 0 and warps 1..3 arrive for 96 threads: the phase completes with
  // warp 0 partial (its lanes 16..31 are alive, waiting elsewhere).
  if (threadIdx.x < 16 || threadIdx.x >= 32) arch::named_barrier_arrive(4, 96);
  __syncthreads();
}
__global__ void arrive_twice_kernel(int*) {
  if (threadIdx.x < 32) {  // warp 0 alone, twice, for a 64-thread phase
    arch::named_barrier_arrive(5, 64);
    arch::named_barrier_arrive(5, 64);
  }
}
__global__ void nobody_arrives_kernel(int*) {
  if (threadIdx.x < 64) arch::named_barrier_sync(6, 128);
}
// One call site (inside raise_registers), two counts.
template <int Registers>
void raise_registers() {
  arch::set_max_registers_inc<Registers>();
}
__global__ void divergent_setmaxnreg_kernel(int*) {
  if (threadIdx.x < 64) {
    raise_registers<232>();
  } else {
    raise_registers<240>();
  }
}
__global__ void inc_below_kernel(int*) {
  arch::set_max_registers_dec<40>();
  arch::set_max_registers_inc<32>();
}

void expect_error(const Status& status, const std::vector<std::string>& fragments) {
  INFO(status.to_string());
  REQUIRE_FALSE(status.ok());
  for (const std::string& fragment : fragments) {
    INFO("expected fragment: " << fragment);
    CHECK(status.message().find(fragment) != std::string_view::npos);
  }
}

struct PipelineRun {
  std::vector<float> sums;
  std::vector<int> order;
};

PipelineRun run_pipeline(const std::vector<float>& in) {
  auto d_in = rt::DeviceBuffer<float>::create(in.size());
  auto d_sums = rt::DeviceBuffer<float>::create(2 * values);
  auto d_order = rt::DeviceBuffer<int>::create(2 * tiles);
  REQUIRE((d_in.ok() && d_sums.ok() && d_order.ok()));
  REQUIRE(d_in->upload(in).ok());
  REQUIRE(d_sums->fill_bytes(0xFF).ok());  // poison: NaN
  REQUIRE(d_order->fill_bytes(0x7F).ok());
  const Status status = rt::launch(&pipeline_kernel, {dim3(1), dim3(3 * warpgroup), sizeof(PipelineShared), nullptr},
                                   d_in->data(), d_sums->data(), d_order->data());
  INFO(status.to_string());
  REQUIRE(status.ok());
  PipelineRun run{std::vector<float>(2 * values), std::vector<int>(2 * tiles)};
  REQUIRE(d_sums->download(run.sums).ok());
  REQUIRE(d_order->download(run.order).ok());
  return run;
}

}  // namespace

TEST_CASE("named barriers: a producer and two ping-pong consumers", "[emu][arch]") {
  auto rng = slimserve_test::make_rng(2412);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> in(2 * tiles * values);
  for (float& x : in) x = dist(rng);
  for (const char* schedule : {"forward", "reverse"}) {
    INFO("schedule " << schedule);
    if (std::string(schedule) == "reverse") {
      setenv("SLIMSERVE_EMU_SCHEDULE", "reverse", 1);
    } else {
      unsetenv("SLIMSERVE_EMU_SCHEDULE");
    }
    const PipelineRun run = run_pipeline(in);
    unsetenv("SLIMSERVE_EMU_SCHEDULE");
    for (int consumer = 0; consumer < 2; ++consumer) {
      for (int t = 0; t < values; ++t) {
        float expected = 0.0f;  // the kernel's order of additions, so equal bits
        for (int k = 0; k < tiles; ++k) expected += in[(2 * k + consumer) * values + t] * static_cast<float>(k + 1);
        INFO("consumer " << consumer << " thread " << t);
        CHECK(run.sums[consumer * values + t] == expected);
      }
    }
    for (int turn = 0; turn < 2 * tiles; ++turn) {
      INFO("turn " << turn);
      CHECK(run.order[turn] == turn % 2);
    }
  }
}

TEST_CASE("named barriers and setmaxnreg: broken rules are reported", "[emu][arch][checks]") {
  auto out = rt::DeviceBuffer<int>::create(1);
  REQUIRE(out.ok());
  const rt::LaunchConfig one_warpgroup{dim3(1), dim3(128), 0, nullptr};
  SECTION("barrier 0") {
    expect_error(rt::launch(&barrier_zero_kernel, one_warpgroup, out->data()), {"bar.sync", "barrier id 0", "1..15"});
  }
  SECTION("a count that is not whole warps") {
    expect_error(rt::launch(&odd_count_kernel, one_warpgroup, out->data()), {"thread count 48", "multiple of 32"});
  }
  SECTION("more threads than the block has") {
    expect_error(rt::launch(&too_many_threads_kernel, one_warpgroup, out->data()), {"thread count 256", "block's 128"});
  }
  SECTION("two counts in one phase") {
    expect_error(rt::launch(&mixed_counts_kernel, one_warpgroup, out->data()), {"barrier 3 with 96 threads", "with 128"});
  }
  SECTION("part of a warp") {
    expect_error(rt::launch(&partial_warp_kernel, one_warpgroup, out->data()), {"barrier 4", "warp 0", ".aligned"});
  }
  SECTION("a lane arrives twice in one phase") {
    expect_error(rt::launch(&arrive_twice_kernel, one_warpgroup, out->data()), {"bar.arrive", "arrives twice at barrier 5"});
  }
  SECTION("a phase that never completes") {
    expect_error(rt::launch(&nobody_arrives_kernel, one_warpgroup, out->data()), {"livelock", "bar.sync"});
  }
  SECTION("setmaxnreg differs across the warpgroup") {
    expect_error(rt::launch(&divergent_setmaxnreg_kernel, one_warpgroup, out->data()), {"setmaxnreg", "same setmaxnreg"});
  }
  SECTION("setmaxnreg.inc below the current limit") {
    expect_error(rt::launch(&inc_below_kernel, one_warpgroup, out->data()), {"setmaxnreg.inc", ".inc to 32 is below", "40"});
  }
  // The emulator recovers: the pipeline runs after any of these.
  std::vector<float> in(2 * tiles * values, 0.5f);
  const PipelineRun run = run_pipeline(in);
  CHECK(run.sums[0] == 0.5f * (1 + 2 + 3 + 4 + 5 + 6));
}
