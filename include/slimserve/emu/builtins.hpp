#pragma once
/// \file
/// \brief threadIdx/blockIdx/blockDim/gridDim, warpSize and the block barriers.
///
/// The built-ins are macros for per-fiber values (a thread_local would be shared by all the
/// fibers of an OS thread). Barriers remember their call site so that threads waiting at two
/// different __syncthreads() are reported as a divergent barrier.

#include <cstddef>
#include <string>

#include "slimserve/config.hpp"
#include "slimserve/emu/scheduler.hpp"
#include "slimserve/emu/vector_types.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

inline const uint3& thread_index() { return this_thread("threadIdx").thread_idx; }
inline const uint3& block_index() { return this_thread("blockIdx").launch->block_idx; }
inline const dim3& block_dimensions() { return this_thread("blockDim").launch->block_dim; }
inline const dim3& grid_dimensions() { return this_thread("gridDim").launch->grid_dim; }

struct BarrierOutcome {
  unsigned passed;   // threads with a non-zero predicate
  unsigned arrived;  // threads at the barrier (exited threads do not take part)
};

/// The block's dynamic shared memory: a heap buffer of exactly the launch's size, 128-byte
/// aligned, filled with 0xFF before each block.
inline unsigned char* dynamic_shared_memory() {
  return this_thread("dynamic shared memory").launch->dynamic_smem;
}
inline std::size_t dynamic_shared_memory_bytes() {
  return this_thread("dynamic shared memory").launch->dynamic_smem_bytes;
}

/// All threads of the block wait here.
inline BarrierOutcome block_barrier(int predicate, CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  self.post_site(site);
  relaxed_store(self.barrier_predicate, predicate != 0 ? 1u : 0u);
  LaunchState* launch = self.launch;
  tsan_release(&launch->block_dim);  // everyone releases before anyone leaves
  yield_to_scheduler(self, ThreadState::at_barrier);
  tsan_acquire(&launch->block_dim);
  return {static_cast<unsigned>(relaxed_load(self.result[0])),
          static_cast<unsigned>(relaxed_load(self.result[1]))};
}

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END

#define threadIdx (::slimserve::emu::detail::thread_index())
#define blockIdx (::slimserve::emu::detail::block_index())
#define blockDim (::slimserve::emu::detail::block_dimensions())
#define gridDim (::slimserve::emu::detail::grid_dimensions())

inline constexpr int warpSize = 32;

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  (void)::slimserve::emu::detail::block_barrier(0, {"__syncthreads", file, line});
}
inline int __syncthreads_count(int predicate, const char* file = __builtin_FILE(),
                               int line = __builtin_LINE()) {
  return static_cast<int>(
      ::slimserve::emu::detail::block_barrier(predicate, {"__syncthreads_count", file, line})
          .passed);
}
inline int __syncthreads_and(int predicate, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
  auto outcome =
      ::slimserve::emu::detail::block_barrier(predicate, {"__syncthreads_and", file, line});
  return outcome.passed == outcome.arrived ? 1 : 0;
}
inline int __syncthreads_or(int predicate, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
  return ::slimserve::emu::detail::block_barrier(predicate, {"__syncthreads_or", file, line})
                     .passed != 0
             ? 1
             : 0;
}
