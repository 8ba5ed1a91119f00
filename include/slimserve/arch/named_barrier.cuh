#pragma once
/// \file
/// \brief Warp specialization on sm_90a: named barriers between warp groups and setmaxnreg.
///
///   named_barrier_sync(id, threads);    // bar.sync id, threads: arrive and wait for the phase
///   named_barrier_arrive(id, threads);  // bar.arrive id, threads: arrive, do not wait
///   set_max_registers_dec<24>();        // setmaxnreg.dec.sync.aligned.u32 24 (a producer)
///   set_max_registers_inc<240>();       // setmaxnreg.inc.sync.aligned.u32 240 (consumers)
///
/// Barriers (PTX barrier{.cta}): ids 1..15 here (0 is __syncthreads'); `threads` a non-zero
/// multiple of 32, the same for every arrival of one phase; whole warps arrive (.aligned).
/// A phase completes when `threads` threads arrived; arrivals order the arriving threads'
/// earlier memory accesses before what the phase's waiters do after it (a producer's stores,
/// then bar.arrive; a consumer's bar.sync, then its loads).
/// setmaxnreg (PTX 8.0, sm_90a): every warp of a warpgroup runs the same one; .inc blocks
/// until the CTA's pool has the registers, whose contents are then undefined; .dec releases
/// them. The count is 24..256 and a multiple of 8. ptxas needs the kernel's register count
/// fixed for it (__launch_bounds__ with a minimum of blocks, or maxrregcount).
/// The emulator (emu/named_barrier.hpp) checks every rule above and gives TSan the
/// happens-before edges of each phase.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

#if !defined(__CUDACC__)
#include "slimserve/emu/named_barrier.hpp"
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

template <int Registers>
constexpr bool valid_register_limit = Registers >= 24 && Registers <= 256 && Registers % 8 == 0;

#if defined(__CUDACC__)

__device__ __forceinline__ void named_barrier_sync(std::uint32_t id, std::uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(std::uint32_t id, std::uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int Registers>
__device__ __forceinline__ void set_max_registers_inc() {
  static_assert(valid_register_limit<Registers>, "setmaxnreg takes 24..256 in steps of 8");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
#endif
}
template <int Registers>
__device__ __forceinline__ void set_max_registers_dec() {
  static_assert(valid_register_limit<Registers>, "setmaxnreg takes 24..256 in steps of 8");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
#endif
}

#else  // CPU emulator

inline void named_barrier_sync(std::uint32_t id, std::uint32_t threads, const char* file = __builtin_FILE(),
                               int line = __builtin_LINE()) {
  emu::detail::named_barrier(id, threads, false, {"bar.sync", file, line});
}
inline void named_barrier_arrive(std::uint32_t id, std::uint32_t threads, const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
  emu::detail::named_barrier(id, threads, true, {"bar.arrive", file, line});
}
template <int Registers>
inline void set_max_registers_inc(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(valid_register_limit<Registers>, "setmaxnreg takes 24..256 in steps of 8");
  emu::detail::set_max_registers(Registers, true, {"setmaxnreg.inc", file, line});
}
template <int Registers>
inline void set_max_registers_dec(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(valid_register_limit<Registers>, "setmaxnreg takes 24..256 in steps of 8");
  emu::detail::set_max_registers(Registers, false, {"setmaxnreg.dec", file, line});
}

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
