#pragma once
/// \file
/// \brief CUDA atomics and fences for emulated kernels.
///
/// Atomics are relaxed C++ atomics (as CUDA's are): TSan sees them as atomic, so they never
/// race, but they order nothing. __threadfence() makes every fence synchronise with every
/// earlier fence, which is what the usual "write, fence, atomic flag" pattern relies on.

#include <atomic>
#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/emu/scheduler.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

/// Every 256th atomic of a thread lets the others run, so a spin loop on an atomic flag
/// (even without __nanosleep) waits for the thread that will set it, or ends as a livelock.
inline void atomic_spin_point() {
  EmulatedThread& self = this_thread("an atomic operation");
  if (++self.atomics_since_yield < 256) return;
  self.atomics_since_yield = 0;
  self.post_site({"a loop of atomic operations", "(kernel)", 0});
  yield_to_scheduler(self, ThreadState::yielded);
}

template <class T>
inline std::atomic_ref<T> atomic_at(T* address) {
  atomic_spin_point();
  return std::atomic_ref<T>(*address);
}

template <class T, class Update>
inline T atomic_update(T* address, Update update) {
  atomic_spin_point();
  std::atomic_ref<T> ref(*address);
  T old = ref.load(std::memory_order_relaxed);
  while (!ref.compare_exchange_weak(old, update(old), std::memory_order_relaxed)) {
  }
  return old;
}

inline void fence() noexcept {
  __atomic_signal_fence(__ATOMIC_SEQ_CST);  // one OS thread runs every fiber
  tsan_release(&fence_sync_object);
  tsan_acquire(&fence_sync_object);
}

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END

#define SLIMSERVE_EMU_ATOMIC_ADD(T)                                                           \
  inline T atomicAdd(T* address, T value) {                                                   \
    return ::slimserve::emu::detail::atomic_at(address).fetch_add(value,                      \
                                                                  std::memory_order_relaxed); \
  }
SLIMSERVE_EMU_ATOMIC_ADD(int)
SLIMSERVE_EMU_ATOMIC_ADD(unsigned)
SLIMSERVE_EMU_ATOMIC_ADD(unsigned long long)
SLIMSERVE_EMU_ATOMIC_ADD(float)
SLIMSERVE_EMU_ATOMIC_ADD(double)
#undef SLIMSERVE_EMU_ATOMIC_ADD

#define SLIMSERVE_EMU_ATOMIC_SUB(T)                                                           \
  inline T atomicSub(T* address, T value) {                                                   \
    return ::slimserve::emu::detail::atomic_at(address).fetch_sub(value,                      \
                                                                  std::memory_order_relaxed); \
  }
SLIMSERVE_EMU_ATOMIC_SUB(int)
SLIMSERVE_EMU_ATOMIC_SUB(unsigned)
#undef SLIMSERVE_EMU_ATOMIC_SUB

#define SLIMSERVE_EMU_ATOMIC_EXCH(T)                                                         \
  inline T atomicExch(T* address, T value) {                                                 \
    return ::slimserve::emu::detail::atomic_at(address).exchange(value,                      \
                                                                 std::memory_order_relaxed); \
  }
SLIMSERVE_EMU_ATOMIC_EXCH(int)
SLIMSERVE_EMU_ATOMIC_EXCH(unsigned)
SLIMSERVE_EMU_ATOMIC_EXCH(unsigned long long)
SLIMSERVE_EMU_ATOMIC_EXCH(float)
#undef SLIMSERVE_EMU_ATOMIC_EXCH

#define SLIMSERVE_EMU_ATOMIC_CAS(T)                                                      \
  inline T atomicCAS(T* address, T compare, T value) {                                   \
    ::slimserve::emu::detail::atomic_at(address).compare_exchange_strong(                \
        compare, value, std::memory_order_relaxed);                                      \
    return compare; /* the old value either way */                                       \
  }
SLIMSERVE_EMU_ATOMIC_CAS(int)
SLIMSERVE_EMU_ATOMIC_CAS(unsigned)
SLIMSERVE_EMU_ATOMIC_CAS(unsigned long long)
SLIMSERVE_EMU_ATOMIC_CAS(unsigned short)
#undef SLIMSERVE_EMU_ATOMIC_CAS

#define SLIMSERVE_EMU_ATOMIC_MINMAX(T)                                                       \
  inline T atomicMin(T* address, T value) {                                                  \
    return ::slimserve::emu::detail::atomic_update(address,                                  \
                                                   [&](T old) { return value < old ? value : old; }); \
  }                                                                                          \
  inline T atomicMax(T* address, T value) {                                                  \
    return ::slimserve::emu::detail::atomic_update(address,                                  \
                                                   [&](T old) { return value > old ? value : old; }); \
  }
SLIMSERVE_EMU_ATOMIC_MINMAX(int)
SLIMSERVE_EMU_ATOMIC_MINMAX(unsigned)
SLIMSERVE_EMU_ATOMIC_MINMAX(long long)
SLIMSERVE_EMU_ATOMIC_MINMAX(unsigned long long)
#undef SLIMSERVE_EMU_ATOMIC_MINMAX

#define SLIMSERVE_EMU_ATOMIC_BITS(T)                                                            \
  inline T atomicAnd(T* address, T value) {                                                     \
    return ::slimserve::emu::detail::atomic_at(address).fetch_and(value,                        \
                                                                  std::memory_order_relaxed);   \
  }                                                                                             \
  inline T atomicOr(T* address, T value) {                                                      \
    return ::slimserve::emu::detail::atomic_at(address).fetch_or(value,                         \
                                                                 std::memory_order_relaxed);    \
  }                                                                                             \
  inline T atomicXor(T* address, T value) {                                                     \
    return ::slimserve::emu::detail::atomic_at(address).fetch_xor(value,                        \
                                                                  std::memory_order_relaxed);   \
  }
SLIMSERVE_EMU_ATOMIC_BITS(int)
SLIMSERVE_EMU_ATOMIC_BITS(unsigned)
SLIMSERVE_EMU_ATOMIC_BITS(unsigned long long)
#undef SLIMSERVE_EMU_ATOMIC_BITS

/// ((old >= limit) ? 0 : old + 1), as CUDA defines it.
inline unsigned atomicInc(unsigned* address, unsigned limit) {
  return ::slimserve::emu::detail::atomic_update(
      address, [&](unsigned old) { return old >= limit ? 0u : old + 1u; });
}
/// ((old == 0 || old > limit) ? limit : old - 1), as CUDA defines it.
inline unsigned atomicDec(unsigned* address, unsigned limit) {
  return ::slimserve::emu::detail::atomic_update(
      address, [&](unsigned old) { return old == 0u || old > limit ? limit : old - 1u; });
}

// Scoped variants: the emulator runs one block at a time, so every scope is the same.
#define SLIMSERVE_EMU_ATOMIC_SCOPES(name)                                                    \
  template <class... Args>                                                                   \
  inline auto name##_block(Args... args) -> decltype(name(args...)) { return name(args...); } \
  template <class... Args>                                                                   \
  inline auto name##_system(Args... args) -> decltype(name(args...)) { return name(args...); }
SLIMSERVE_EMU_ATOMIC_SCOPES(atomicAdd)
SLIMSERVE_EMU_ATOMIC_SCOPES(atomicSub)
SLIMSERVE_EMU_ATOMIC_SCOPES(atomicExch)
SLIMSERVE_EMU_ATOMIC_SCOPES(atomicCAS)
SLIMSERVE_EMU_ATOMIC_SCOPES(atomicMin)
SLIMSERVE_EMU_ATOMIC_SCOPES(atomicMax)
SLIMSERVE_EMU_ATOMIC_SCOPES(atomicAnd)
SLIMSERVE_EMU_ATOMIC_SCOPES(atomicOr)
SLIMSERVE_EMU_ATOMIC_SCOPES(atomicXor)
#undef SLIMSERVE_EMU_ATOMIC_SCOPES

inline void __threadfence() { ::slimserve::emu::detail::fence(); }
inline void __threadfence_block() { ::slimserve::emu::detail::fence(); }
inline void __threadfence_system() { ::slimserve::emu::detail::fence(); }
