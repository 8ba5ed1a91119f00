#pragma once
/// \file
/// \brief The emulator's named barriers (bar.sync / bar.arrive with an id and a thread count)
/// and setmaxnreg, the two pieces of warp specialization (arch/named_barrier.cuh).
///
/// Barriers, per the PTX ISA's barrier{.cta}: ids 1..15 here (0 is the barrier __syncthreads
/// uses, which the scheduler keeps), a thread count that is a non-zero multiple of 32 up to
/// the block's (rounded up to whole warps) and the same at every arrival of one phase. A warp
/// arrives as a whole (.aligned): it counts, as 32 threads, once all its lanes arrived; the
/// phase completes at count / 32 warps, and a warp with only some lanes in it then, or a lane
/// that arrives twice in one phase, is an error. Stricter than the hardware in one point: a
/// warp with exited lanes never counts (the hardware counts its live lanes), so its phase
/// never completes (kernels here exit whole warpgroups). bar.arrive does not wait;
/// bar.sync waits (backing off like a __nanosleep spin, so a phase that never completes is
/// reported as a livelock naming the bar.sync). The state lives beside the scheduler of the
/// calling OS thread and is reset when a new block (launch, kernel, block index) starts.
/// Under TSan every arrival releases its phase's sync object and every waiter acquires it on
/// leaving: what a producer wrote before its bar.arrive is ordered before what a consumer
/// reads after its bar.sync of that phase, and nothing else is, so a missing barrier between
/// warpgroups shows as a data race.
///
/// setmaxnreg: a warpgroup operation (all 128 threads at the same place, the same action and
/// count). The emulator has no register file; it checks the contract: the count (24..256, a
/// multiple of 8: the wrapper's static_assert), the warpgroup agreeing, and .inc not below
/// (.dec not above) the warpgroup's previous setmaxnreg in the block.

#include <cstdint>
#include <string>

#include "slimserve/config.hpp"
#include "slimserve/emu/scheduler.hpp"
#include "slimserve/emu/wgmma.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

inline constexpr unsigned named_barrier_ids = 16;
inline constexpr unsigned named_barrier_phase_tokens = 64;  // TSan sync objects per id
inline constexpr unsigned max_block_warps = max_threads_per_block / warp_size;

/// Every field is read and written by the fibers of one OS thread, one at a time, through
/// relaxed atomics (invisible to TSan's race detection, like the scheduler's bookkeeping).
struct NamedBarrierTable {
  struct Barrier {
    std::uint64_t phase = 0;  // completed phases in this block
    unsigned expected_warps = 0;  // 0: no arrival in this phase yet
    unsigned arrived_warps = 0;
    std::uint32_t counted[max_block_warps / 32] = {};  // bit w: warp w is in
    std::uint32_t lanes[max_block_warps] = {};         // [warp] lanes arrived
    unsigned first_linear = 0;
    const char* first_file = "";
    int first_line = 0;
  };
  // The block this state belongs to.
  const LaunchState* launch = nullptr;
  void (*run_kernel)(const void*) = nullptr;
  const void* bound_kernel = nullptr;
  const unsigned char* dynamic_smem = nullptr;
  unsigned block[3] = {};  // x, y, z (separate words: an atomic uint3 is not lock-free)
  Barrier barriers[named_barrier_ids];
  unsigned register_limit[max_threads_per_block] = {};  // 0: the launch's (unknown)
  char tokens[named_barrier_ids][named_barrier_phase_tokens] = {};
};

inline NamedBarrierTable& named_barrier_table() {
  static thread_local NamedBarrierTable table;  // the scheduler is per OS thread, too
  return table;
}

template <class T>
inline void relaxed_zero(T& value) noexcept {
  relaxed_store(value, T{});
}

/// The table of the running block (reset when a new one started).
inline NamedBarrierTable& block_named_barriers(const EmulatedThread& self) {
  NamedBarrierTable& table = named_barrier_table();
  const LaunchState& launch = *self.launch;
  const uint3 block = launch.block_idx;
  if (relaxed_load(table.launch) != &launch || relaxed_load(table.run_kernel) != launch.run_kernel ||
      relaxed_load(table.bound_kernel) != launch.bound_kernel ||
      relaxed_load(table.dynamic_smem) != launch.dynamic_smem || relaxed_load(table.block[0]) != block.x ||
      relaxed_load(table.block[1]) != block.y || relaxed_load(table.block[2]) != block.z) {
    relaxed_store(table.launch, &launch);
    relaxed_store(table.run_kernel, launch.run_kernel);
    relaxed_store(table.bound_kernel, launch.bound_kernel);
    relaxed_store(table.dynamic_smem, static_cast<const unsigned char*>(launch.dynamic_smem));
    relaxed_store(table.block[0], block.x);
    relaxed_store(table.block[1], block.y);
    relaxed_store(table.block[2], block.z);
    for (auto& barrier : table.barriers) {
      relaxed_zero(barrier.phase);
      relaxed_zero(barrier.expected_warps);
      relaxed_zero(barrier.arrived_warps);
      for (auto& word : barrier.counted) relaxed_zero(word);
      for (auto& word : barrier.lanes) relaxed_zero(word);
    }
    for (auto& limit : table.register_limit) relaxed_zero(limit);
  }
  return table;
}

/// Counts the warps whose live lanes are all in; completes the phase at the expected count.
/// Returns an error message (empty: none).
inline std::string count_named_barrier_warps(const EmulatedThread& self, NamedBarrierTable::Barrier& barrier,
                                             unsigned id) {
  const unsigned expected = relaxed_load(barrier.expected_warps);
  if (expected == 0) return {};
  const LaunchState& launch = *self.launch;
  const unsigned threads = launch.block_dim.x * launch.block_dim.y * launch.block_dim.z;
  const unsigned warps = (threads + warp_size - 1) / warp_size;
  // The warps' lane masks: this thread's warp state is one of an array indexed by warp.
  const WarpState* warp0 = self.warp_state - self.warp;
  for (unsigned w = 0; w < warps; ++w) {
    const std::uint32_t in = relaxed_load(barrier.lanes[w]);
    const std::uint32_t bit = 1u << (w % 32);
    if (in == 0 || (relaxed_load(barrier.counted[w / 32]) & bit) != 0) continue;
    // `present` is set before the block starts (ordered for TSan); `exited` is the
    // scheduler's, unordered with this fiber, so it is not read.
    const unsigned live = relaxed_load(warp0[w].present);
    if ((in & live) != live) continue;
    relaxed_store(barrier.counted[w / 32], relaxed_load(barrier.counted[w / 32]) | bit);
    relaxed_store(barrier.arrived_warps, relaxed_load(barrier.arrived_warps) + 1);
  }
  if (relaxed_load(barrier.arrived_warps) < expected) return {};
  for (unsigned w = 0; w < warps; ++w) {
    const std::uint32_t in = relaxed_load(barrier.lanes[w]);
    if (in != 0 && (relaxed_load(barrier.counted[w / 32]) & (1u << (w % 32))) == 0) {
      return "barrier " + std::to_string(id) + " completed with only lanes " + format_mask(in) + " of warp " +
             std::to_string(w) + " in it (bar.sync / bar.arrive are .aligned: whole warps)";
    }
  }
  relaxed_zero(barrier.expected_warps);
  relaxed_zero(barrier.arrived_warps);
  for (auto& word : barrier.counted) relaxed_zero(word);
  for (unsigned w = 0; w < warps; ++w) relaxed_zero(barrier.lanes[w]);
  relaxed_store(barrier.phase, relaxed_load(barrier.phase) + 1);
  return {};
}

inline void named_barrier(unsigned id, unsigned threads, bool arrive_only, CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  const LaunchState& launch = *self.launch;
  const unsigned block_threads = launch.block_dim.x * launch.block_dim.y * launch.block_dim.z;
  const unsigned block_warps = (block_threads + warp_size - 1) / warp_size;
  std::string detail;
  if (id == 0 || id >= named_barrier_ids) {
    detail = "barrier id " + std::to_string(id) + " is not 1..15 (0 is __syncthreads' barrier)";
    fail_keeping_nothing(site, detail);
  }
  if (threads == 0 || threads % warp_size != 0 || threads / warp_size > block_warps) {
    detail = "thread count " + std::to_string(threads) + " is not a non-zero multiple of 32 up to the block's " +
             std::to_string(block_warps * warp_size);
    fail_keeping_nothing(site, detail);
  }
  NamedBarrierTable& table = block_named_barriers(self);
  NamedBarrierTable::Barrier& barrier = table.barriers[id];
  if (relaxed_load(barrier.expected_warps) == 0) {
    relaxed_store(barrier.expected_warps, threads / warp_size);
    relaxed_store(barrier.first_linear, self.linear);
    relaxed_store(barrier.first_file, site.file);
    relaxed_store(barrier.first_line, site.line);
  } else if (relaxed_load(barrier.expected_warps) * warp_size != threads) {
    detail = "barrier " + std::to_string(id) + " with " + std::to_string(threads) + " threads, while thread " +
             std::to_string(relaxed_load(barrier.first_linear)) + " arrived at " + relaxed_load(barrier.first_file) +
             ":" + std::to_string(relaxed_load(barrier.first_line)) + " with " +
             std::to_string(relaxed_load(barrier.expected_warps) * warp_size);
    fail_keeping_nothing(site, detail);
  }
  const std::uint32_t bit = 1u << self.lane;
  if ((relaxed_load(barrier.lanes[self.warp]) & bit) != 0) {
    detail = "arrives twice at barrier " + std::to_string(id) + " in one phase";
    fail_keeping_nothing(site, detail);
  }
  relaxed_store(barrier.lanes[self.warp], relaxed_load(barrier.lanes[self.warp]) | bit);
  const std::uint64_t phase = relaxed_load(barrier.phase);
  char* token = &table.tokens[id][phase % named_barrier_phase_tokens];
  tsan_release(token);
  detail = count_named_barrier_warps(self, barrier, id);
  if (!detail.empty()) fail_keeping_nothing(site, detail);
  if (arrive_only) return;
  while (relaxed_load(barrier.phase) == phase) {
    self.post_site(site);
    yield_to_scheduler(self, ThreadState::yielded);
  }
  tsan_acquire(token);
}

inline void combine_setmaxnreg(WarpgroupView& group) {
  for (unsigned i = 1; i < warpgroup_size; ++i) {
    if (group.payload(i, 0) != group.payload(0, 0) || group.payload(i, 1) != group.payload(0, 1)) {
      group.fail(i, std::string("setmaxnreg.") + (group.payload(i, 1) != 0 ? "inc " : "dec ") +
                        std::to_string(group.payload(i, 0)) + " differs from thread 0 of the warpgroup (" +
                        (group.payload(0, 1) != 0 ? "inc " : "dec ") + std::to_string(group.payload(0, 0)) +
                        "): every warp of a warpgroup runs the same setmaxnreg");
      return;
    }
  }
}

inline void set_max_registers(unsigned count, bool increase, CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  NamedBarrierTable& table = block_named_barriers(self);
  const unsigned limit = relaxed_load(table.register_limit[self.linear]);
  if (limit != 0 && (increase ? count < limit : count > limit)) {
    std::string detail = std::string(increase ? ".inc to " : ".dec to ") + std::to_string(count) +
                         (increase ? " is below" : " is above") + " the warpgroup's current limit " +
                         std::to_string(limit);
    fail_keeping_nothing(site, detail);
  }
  relaxed_store(self.payload[0], std::uint64_t{count});
  relaxed_store(self.payload[1], std::uint64_t{increase ? 1u : 0u});
  warpgroup_exchange(self, &combine_setmaxnreg, site);
  relaxed_store(table.register_limit[self.linear], count);
}

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END
