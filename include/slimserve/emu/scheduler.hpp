#pragma once
/// \file
/// \brief Runs one block at a time: one fiber per CUDA thread, each run until it blocks.
///
/// The scheduler (the launching OS thread) resumes a runnable fiber; the fiber runs until it
/// reaches a barrier, a warp operation or its end, posts what it waits for in its mailbox and
/// switches back. The scheduler checks the request (divergent barriers, bad warp masks),
/// releases barriers and warp operations once everyone arrived, and reports a deadlock when
/// nothing can run. Blocks run one after another, in x, then y, then z order.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "slimserve/config.hpp"
#include "slimserve/emu/fiber.hpp"
#include "slimserve/emu/sanitizer_hooks.hpp"
#include "slimserve/emu/thread_state.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

/// The emulated thread running on this OS thread, null outside a kernel.
inline thread_local EmulatedThread* current_thread_slot = nullptr;
/// The scheduler's own context on this OS thread (fibers switch back to it).
inline thread_local FiberContext* scheduler_context_slot = nullptr;
/// TSan: __threadfence() synchronises with every other fence (see atomics.hpp).
inline int fence_sync_object = 0;

[[noreturn]] inline void used_outside_kernel(const char* what) {
  std::fprintf(stderr, "slimserve emulator: %s used outside an emulated kernel\n", what);
  std::abort();
}

inline EmulatedThread& this_thread(const char* what = "a CUDA built-in") {
  EmulatedThread* thread = relaxed_load(current_thread_slot);
  if (thread == nullptr) used_outside_kernel(what);
  return *thread;
}

/// Hands control back to the scheduler until it resumes this thread.
inline void yield_to_scheduler(EmulatedThread& self, ThreadState state) noexcept {
  relaxed_store(self.state, state);
  switch_context(self.context, *scheduler_context_slot, SwitchSync::publish);
}

/// Stops the calling emulated thread for good and fails the launch with `message`.
[[noreturn]] inline void fail_this_thread(std::string message) {
  EmulatedThread& self = this_thread("an emulator check");
  self.error = std::move(message);
  // This fiber never unwinds: free what the moved-from string may still own (libstdc++ hands
  // it self.error's previous buffer), or LeakSanitizer reports it.
  std::string().swap(message);
  yield_to_scheduler(self, ThreadState::failed);
  std::abort();  // a failed thread is never resumed
}

inline std::string format_index(const uint3& index) {
  std::ostringstream text;
  text << '(' << index.x << ',' << index.y << ',' << index.z << ')';
  return text.str();
}
inline std::string format_site(const CallSite& site) {
  std::ostringstream text;
  text << site.what << " at " << site.file << ':' << site.line;
  return text.str();
}
inline std::string format_mask(unsigned mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask);
  return text;
}

/// Runnable threads in the order they became runnable. A thread is in it at most once, so a
/// ring of one slot per thread suffices.
class RunQueue {
 public:
  void reset(std::size_t capacity) {
    slots_.assign(capacity, nullptr);
    head_ = 0;
    size_ = 0;
  }
  bool empty() const noexcept { return size_ == 0; }
  void push(EmulatedThread* thread) noexcept {
    slots_[(head_ + size_) % slots_.size()] = thread;
    ++size_;
  }
  EmulatedThread* pop() noexcept {
    EmulatedThread* thread = slots_[head_];
    head_ = (head_ + 1) % slots_.size();
    --size_;
    return thread;
  }

 private:
  std::vector<EmulatedThread*> slots_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

class Scheduler {
 public:
  Scheduler() = default;
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;
  ~Scheduler() {
#if defined(SLIMSERVE_EMU_TSAN)
    for (auto& thread : pool_) {
      if (thread->context.tsan_fiber != nullptr) __tsan_destroy_fiber(thread->context.tsan_fiber);
    }
#endif
#if defined(SLIMSERVE_EMU_ASAN)
    for (auto& thread : pool_) {
      if (thread->stack.bottom() != nullptr) {
        __asan_unpoison_memory_region(thread->stack.bottom(), thread->stack.size());
      }
    }
#endif
  }

  static Scheduler& for_this_thread() {
    static thread_local Scheduler scheduler;
    return scheduler;
  }

  /// Runs every block of the grid; stops at the first error.
  Status run(LaunchState& launch) {
    if (relaxed_load(current_thread_slot) != nullptr) {
      return make_status(StatusCode::device_error,
                         "emulator: a kernel launched another kernel (not supported)");
    }
    const dim3 block = launch.block_dim;
    const unsigned threads = block.x * block.y * block.z;
    SLIMSERVE_RETURN_IF_ERROR(prepare_threads(threads));
    // SLIMSERVE_EMU_SCHEDULE=reverse runs threads in the opposite order (last thread first,
    // at the start and after every barrier), to shake out code that depends on the order.
    const char* schedule = std::getenv("SLIMSERVE_EMU_SCHEDULE");
    reverse_ = schedule != nullptr && std::strcmp(schedule, "reverse") == 0;
    scheduler_context_slot = &context_;
    for (unsigned z = 0; z < launch.grid_dim.z; ++z) {
      for (unsigned y = 0; y < launch.grid_dim.y; ++y) {
        for (unsigned x = 0; x < launch.grid_dim.x; ++x) {
          launch.block_idx = uint3{x, y, z};
          Status status = run_block(launch, threads);
          if (!status.ok()) {
            scheduler_context_slot = nullptr;
            return status;
          }
        }
      }
    }
    scheduler_context_slot = nullptr;
    return {};
  }

 private:
  [[noreturn]] static void fiber_main(void* argument) {
    auto& self = *static_cast<EmulatedThread*>(argument);
    fiber_started(self.context, *scheduler_context_slot);
    for (;;) {  // one iteration per block; a fiber never returns (TSan requires it)
      LaunchState& launch = *relaxed_load(self.launch);
      tsan_acquire(&launch);  // everything the host did before this block started
      ThreadState end = ThreadState::exited;
      try {
        launch.run_kernel(launch.bound_kernel);
      } catch (const std::exception& error) {
        self.error = std::string("exception in kernel: ") + error.what();
        end = ThreadState::failed;
      } catch (...) {
        self.error = "unknown exception in kernel";
        end = ThreadState::failed;
      }
      yield_to_scheduler(self, end);
    }
  }

  Status prepare_threads(unsigned threads) {
    while (pool_.size() < threads) {
      auto thread = std::make_unique<EmulatedThread>();
      thread->pool_index = static_cast<unsigned>(pool_.size());
      if (!thread->stack.allocate(fiber_stack_bytes)) {
        return make_status(StatusCode::resource_exhausted, "emulator: cannot map a ",
                           fiber_stack_bytes, "-byte fiber stack");
      }
      pool_.push_back(std::move(thread));
    }
    if (warps_.size() < (threads + warp_size - 1) / warp_size) {
      warps_.resize((threads + warp_size - 1) / warp_size);
    }
    if (warpgroups_.size() < (threads + warpgroup_size - 1) / warpgroup_size) {
      warpgroups_.resize((threads + warpgroup_size - 1) / warpgroup_size);
    }
    return {};
  }

  void fresh_fiber(EmulatedThread& thread) {
#if defined(SLIMSERVE_EMU_TSAN)
    if (context_.tsan_fiber == nullptr) context_.tsan_fiber = __tsan_get_current_fiber();
    if (thread.context.tsan_fiber != nullptr) __tsan_destroy_fiber(thread.context.tsan_fiber);
    thread.context.tsan_fiber = __tsan_create_fiber(0);
    // Pool slot i always runs the block's thread with linear index i: name it in reports.
    const std::string name =
        "emulated CUDA thread, linear index " + std::to_string(thread.pool_index);
    __tsan_set_fiber_name(thread.context.tsan_fiber, name.c_str());
#endif
    make_fiber_context(thread.context, thread.stack, &fiber_main, &thread);
    thread.needs_fresh_fiber = false;
  }

  Status run_block(LaunchState& launch, unsigned threads) {
    const dim3 block = launch.block_dim;
    const unsigned num_warps = (threads + warp_size - 1) / warp_size;
    for (unsigned w = 0; w < num_warps; ++w) {
      WarpState& warp = warps_[w];
      warp.present = 0;
      warp.exited = 0;
      warp.pending.clear();
      std::fill(std::begin(warp.lanes), std::end(warp.lanes), nullptr);
    }
    for (PendingWarpgroupOp& group : warpgroups_) group = PendingWarpgroupOp{};
    threads_ = threads;
    queue_.reset(threads);
    for (unsigned i = 0; i < threads; ++i) {
      EmulatedThread& thread = *pool_[i];
      if (thread.needs_fresh_fiber) fresh_fiber(thread);
      thread.thread_idx = uint3{i % block.x, i / block.x % block.y, i / (block.x * block.y)};
      thread.linear = i;
      thread.warp = i / warp_size;
      thread.lane = i % warp_size;
      relaxed_store(thread.launch, &launch);
      thread.warp_state = &warps_[thread.warp];
      thread.state = ThreadState::running;
      thread.error.clear();
      thread.async_copies.reset();
      thread.wgmma.reset();
      thread.atomics_since_yield = 0;
      warps_[thread.warp].lanes[thread.lane] = &thread;
      warps_[thread.warp].present |= 1u << thread.lane;
    }
    for (unsigned k = 0; k < threads; ++k) queue_.push(pool_[reverse_ ? threads - 1 - k : k].get());
    live_ = threads;
    spins_without_progress_ = 0;
    barrier_waiters_.clear();
    barrier_predicates_ = 0;
    if (launch.dynamic_smem != nullptr) {
      std::memset(launch.dynamic_smem, 0xFF, launch.dynamic_smem_bytes);  // poison
    }
    tsan_release(&launch);

    while (!queue_.empty()) {
      EmulatedThread& thread = *queue_.pop();
      relaxed_store(current_thread_slot, &thread);
      switch_context(context_, thread.context, SwitchSync::none);
      relaxed_store(current_thread_slot, static_cast<EmulatedThread*>(nullptr));
      Status status = handle_request(launch, thread);
      if (!status.ok()) {
        abandon_block(threads);
        return status;
      }
    }
    if (live_ != 0) {
      Status status = deadlock(launch, threads);
      abandon_block(threads);
      return status;
    }
    return {};
  }

  // Threads still suspended mid-kernel cannot be resumed: give them fresh fibers next time.
  void abandon_block(unsigned threads) {
    for (unsigned i = 0; i < threads; ++i) {
      EmulatedThread& thread = *pool_[i];
      ThreadState state = relaxed_load(thread.state);
      if (state != ThreadState::exited) thread.needs_fresh_fiber = true;
    }
  }

  Status thread_error(const LaunchState& launch, const EmulatedThread& thread,
                      const std::string& message) const {
    return make_status(StatusCode::device_error, "emulated kernel: block ",
                       format_index(launch.block_idx), " thread ", format_index(thread.thread_idx),
                       ": ", message);
  }

  Status handle_request(const LaunchState& launch, EmulatedThread& thread) {
    const ThreadState state = relaxed_load(thread.state);
    if (state == ThreadState::yielded) return on_yield(launch, thread);
    spins_without_progress_ = 0;
    switch (state) {
      case ThreadState::exited: return on_exit(launch, thread);
      case ThreadState::failed:
        thread.needs_fresh_fiber = true;
        return thread_error(launch, thread, thread.error);
      case ThreadState::at_barrier: return on_barrier(launch, thread);
      case ThreadState::at_warp_op: return on_warp_op(launch, thread);
      case ThreadState::at_warpgroup_op: return on_warpgroup_op(launch, thread);
      case ThreadState::running:
      case ThreadState::yielded: break;
    }
    return thread_error(launch, thread, "emulator bug: a thread yielded without a request");
  }

  // A thread that sleeps in a spin loop (__nanosleep) goes to the back of the queue. If only
  // spinning threads are left for long, nothing can ever change what they wait for.
  Status on_yield(const LaunchState& launch, EmulatedThread& thread) {
    if (++spins_without_progress_ > live_ * max_spins_per_thread) {
      return thread_error(launch, thread,
                          "livelock: " + format_site(thread.posted_site()) +
                              " keeps spinning and no emulated thread of the block makes progress "
                              "(waiting for another block? blocks run one at a time)");
    }
    relaxed_store(thread.state, ThreadState::running);
    queue_.push(&thread);
    return {};
  }

  Status on_exit(const LaunchState& launch, EmulatedThread& thread) {
    --live_;
    WarpState& warp = *thread.warp_state;
    const unsigned bit = 1u << thread.lane;
    warp.exited |= bit;
    for (const PendingWarpOp& op : warp.pending) {
      if (op.mask & bit) {
        return thread_error(
            launch, thread,
            "exited while lanes " + format_mask(op.arrived) + " of its warp wait for it in " +
                format_site(op.first->posted_site()) + " with mask " + format_mask(op.mask));
      }
    }
    if (thread.linear / warpgroup_size < warpgroups_.size()) {
      const PendingWarpgroupOp& group = warpgroups_[thread.linear / warpgroup_size];
      if (group.arrived != 0) {
        return thread_error(launch, thread,
                            "exited while " + std::to_string(group.arrived) +
                                " threads of its warpgroup wait for it in " +
                                format_site(group.first->posted_site()));
      }
    }
    if (!thread.wgmma.ops.empty()) {
      return thread_error(launch, thread,
                          "exited with " + std::to_string(thread.wgmma.ops.size()) +
                              " wgmma.mma_async operations that no wgmma.wait_group retired "
                              "(their accumulators were never written)");
    }
    // Exited threads no longer count at __syncthreads (as on the hardware).
    if (!barrier_waiters_.empty() && barrier_waiters_.size() == live_) release_barrier();
    return {};
  }

  Status on_barrier(const LaunchState& launch, EmulatedThread& thread) {
    const CallSite site = thread.posted_site();
    if (!barrier_waiters_.empty()) {
      const EmulatedThread& first = *barrier_waiters_.front();
      const CallSite first_site = first.posted_site();
      if (!site.same_place(first_site)) {
        return thread_error(launch, thread,
                            "divergent barrier: waits at " + format_site(site) + " while thread " +
                                format_index(first.thread_idx) + " waits at " +
                                format_site(first_site));
      }
    }
    barrier_waiters_.push_back(&thread);
    if (relaxed_load(thread.barrier_predicate) != 0) ++barrier_predicates_;
    if (barrier_waiters_.size() == live_) release_barrier();
    return {};
  }

  void release_barrier() {
    if (reverse_) {
      std::sort(barrier_waiters_.begin(), barrier_waiters_.end(),
                [](const EmulatedThread* a, const EmulatedThread* b) { return a->linear > b->linear; });
    }
    for (EmulatedThread* waiter : barrier_waiters_) {
      relaxed_store(waiter->result[0], std::uint64_t{barrier_predicates_});
      relaxed_store(waiter->result[1], std::uint64_t{barrier_waiters_.size()});
      relaxed_store(waiter->state, ThreadState::running);
      queue_.push(waiter);
    }
    barrier_waiters_.clear();
    barrier_predicates_ = 0;
  }

  Status on_warp_op(const LaunchState& launch, EmulatedThread& thread) {
    WarpState& warp = *thread.warp_state;
    const unsigned mask = relaxed_load(thread.warp_mask);
    const WarpCombine combine = relaxed_load(thread.combine);
    const unsigned bit = 1u << thread.lane;
    const CallSite site = thread.posted_site();
    if (!(mask & bit)) {
      return thread_error(launch, thread,
                          format_site(site) + ": mask " + format_mask(mask) +
                              " does not include the calling lane " + std::to_string(thread.lane));
    }
    if (mask & ~warp.present) {
      return thread_error(launch, thread,
                          format_site(site) + ": mask " + format_mask(mask) +
                              " names lanes that do not exist in this warp (present lanes " +
                              format_mask(warp.present) + ")");
    }
    if (mask & warp.exited) {
      return thread_error(launch, thread,
                          format_site(site) + ": mask " + format_mask(mask) +
                              " names lanes that have exited: " + format_mask(mask & warp.exited));
    }
    auto op = std::find_if(warp.pending.begin(), warp.pending.end(),
                           [&](const PendingWarpOp& p) { return (p.mask & mask) != 0; });
    if (op == warp.pending.end()) {
      warp.pending.push_back(PendingWarpOp{mask, 0, combine, &thread});
      op = warp.pending.end() - 1;
    } else if (op->mask != mask || op->combine != combine) {
      return thread_error(launch, thread,
                          format_site(site) + " with mask " + format_mask(mask) +
                              " meets lane " + std::to_string(op->first->lane) + " in " +
                              format_site(op->first->posted_site()) + " with mask " +
                              format_mask(op->mask) + " (warp operations do not match)");
    }
    op->arrived |= bit;
    if (op->arrived != op->mask) return {};

    WarpGroup group(warp, mask);
    if (combine != nullptr) combine(group);
    warp.pending.erase(op);
    if (group.failed_lane() >= 0) {
      return thread_error(launch, *warp.lanes[group.failed_lane()],
                          format_site(warp.lanes[group.failed_lane()]->posted_site()) + ": " +
                              group.error());
    }
    for (unsigned k = 0; k < warp_size; ++k) {
      const unsigned lane = reverse_ ? warp_size - 1 - k : k;
      if (mask >> lane & 1u) {
        relaxed_store(warp.lanes[lane]->state, ThreadState::running);
        queue_.push(warp.lanes[lane]);
      }
    }
    return {};
  }

  // A warpgroup operation (wgmma.*: .sync.aligned over 4 warps) completes once all 128
  // threads of the warpgroup reached the same call site.
  Status on_warpgroup_op(const LaunchState& launch, EmulatedThread& thread) {
    const unsigned index = thread.linear / warpgroup_size;
    const CallSite site = thread.posted_site();
    const unsigned first_thread = index * warpgroup_size;
    if (first_thread + warpgroup_size > threads_) {
      return thread_error(launch, thread,
                          format_site(site) + ": warpgroup " + std::to_string(index) +
                              " needs threads " + std::to_string(first_thread) + ".." +
                              std::to_string(first_thread + warpgroup_size - 1) +
                              " but the block has " + std::to_string(threads_) + " threads");
    }
    for (unsigned w = first_thread / warp_size; w < (first_thread + warpgroup_size) / warp_size;
         ++w) {
      if (warps_[w].exited != 0) {
        return thread_error(launch, thread,
                            format_site(site) + ": lanes " + format_mask(warps_[w].exited) +
                                " of warp " + std::to_string(w) +
                                " in this warpgroup have exited");
      }
    }
    PendingWarpgroupOp& group = warpgroups_[index];
    const WarpgroupCombine combine = relaxed_load(thread.warpgroup_combine);
    if (group.arrived == 0) {
      group.first = &thread;
      group.combine = combine;
    } else if (!site.same_place(group.first->posted_site()) || combine != group.combine) {
      return thread_error(launch, thread,
                          "divergent warpgroup operation: " + format_site(site) +
                              " while thread " + format_index(group.first->thread_idx) +
                              " of the same warpgroup waits in " +
                              format_site(group.first->posted_site()) +
                              " (wgmma instructions are .sync.aligned over 128 threads)");
    }
    if (++group.arrived != warpgroup_size) return {};

    EmulatedThread* members[warpgroup_size];
    for (unsigned k = 0; k < warpgroup_size; ++k) members[k] = pool_[first_thread + k].get();
    WarpgroupView view(members);
    if (combine != nullptr) combine(view);
    group = PendingWarpgroupOp{};
    if (view.failed_index() >= 0) {
      const EmulatedThread& failed = *members[view.failed_index()];
      return thread_error(launch, failed, format_site(failed.posted_site()) + ": " + view.error());
    }
    for (unsigned k = 0; k < warpgroup_size; ++k) {
      EmulatedThread* member = members[reverse_ ? warpgroup_size - 1 - k : k];
      relaxed_store(member->state, ThreadState::running);
      queue_.push(member);
    }
    return {};
  }

  // Lists each distinct place where threads wait, with a count and the first thread there.
  Status deadlock(const LaunchState& launch, unsigned threads) const {
    struct WaitGroup {
      const EmulatedThread* first;
      CallSite site;
      unsigned mask;
      unsigned count;
    };
    std::vector<WaitGroup> groups;
    for (unsigned i = 0; i < threads; ++i) {
      const EmulatedThread& thread = *pool_[i];
      const ThreadState state = relaxed_load(thread.state);
      if (state != ThreadState::at_barrier && state != ThreadState::at_warp_op &&
          state != ThreadState::at_warpgroup_op) {
        continue;
      }
      const CallSite site = thread.posted_site();
      const unsigned mask = state == ThreadState::at_warp_op ? relaxed_load(thread.warp_mask) : 0;
      auto same = std::find_if(groups.begin(), groups.end(), [&](const WaitGroup& g) {
        return g.site.same_place(site) && g.mask == mask;
      });
      if (same != groups.end()) {
        ++same->count;
      } else {
        groups.push_back(WaitGroup{&thread, site, mask, 1});
      }
    }
    std::ostringstream text;
    text << "deadlock: " << live_ << " emulated threads wait and none can run:";
    for (const WaitGroup& group : groups) {
      text << ' ' << group.count << " wait in " << format_site(group.site);
      if (group.mask != 0) text << " (mask " << format_mask(group.mask) << ')';
      text << " (first: thread " << format_index(group.first->thread_idx) << ");";
    }
    return thread_error(launch, groups.empty() ? *pool_[0] : *groups.front().first, text.str());
  }

  FiberContext context_;
  std::vector<std::unique_ptr<EmulatedThread>> pool_;
  std::vector<WarpState> warps_;
  struct PendingWarpgroupOp {
    unsigned arrived = 0;
    WarpgroupCombine combine = nullptr;
    EmulatedThread* first = nullptr;
  };
  std::vector<PendingWarpgroupOp> warpgroups_;
  unsigned threads_ = 0;  // threads of the running block
  RunQueue queue_;
  std::vector<EmulatedThread*> barrier_waiters_;
  unsigned barrier_predicates_ = 0;
  std::size_t live_ = 0;
  static constexpr std::size_t max_spins_per_thread = 2000;
  std::size_t spins_without_progress_ = 0;
  bool reverse_ = false;
};

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END
