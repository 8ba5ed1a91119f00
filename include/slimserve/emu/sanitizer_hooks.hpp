#pragma once
/// \file
/// \brief Which sanitizer the emulator runs under, and the fiber annotations it needs.
///
/// Under TSan each emulated CUDA thread is a TSan fiber, switched with "no sync": only the
/// emulator's barriers (and fences) create happens-before, so a missing __syncthreads shows
/// up as a data race. Under ASan the fiber stacks are announced on every switch.

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SLIMSERVE_EMU_TSAN 1
#endif
#if __has_feature(address_sanitizer)
#define SLIMSERVE_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(SLIMSERVE_EMU_TSAN)
#define SLIMSERVE_EMU_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(SLIMSERVE_EMU_ASAN)
#define SLIMSERVE_EMU_ASAN 1
#endif

#include <atomic>
#include <cstddef>

#if defined(SLIMSERVE_EMU_TSAN)
#include <sanitizer/tsan_interface.h>
#endif
#if defined(SLIMSERVE_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

/// Happens-before edges that the emulator's synchronisation points create under TSan
/// (no-ops elsewhere): every thread releases at a barrier before any thread leaves it.
inline void tsan_release(void* sync_object) noexcept {
#if defined(SLIMSERVE_EMU_TSAN)
  __tsan_release(sync_object);
#else
  (void)sync_object;
#endif
}
inline void tsan_acquire(void* sync_object) noexcept {
#if defined(SLIMSERVE_EMU_TSAN)
  __tsan_acquire(sync_object);
#else
  (void)sync_object;
#endif
}

/// Emulator bookkeeping shared between a fiber and the scheduler goes through these relaxed
/// atomic accesses: plain moves on x86, and invisible to TSan's race detection (the scheduler
/// must not create happens-before between emulated threads).
template <class T>
inline T relaxed_load(const T& value) noexcept {
  return std::atomic_ref<T>(const_cast<T&>(value)).load(std::memory_order_relaxed);
}
template <class T>
inline void relaxed_store(T& value, T desired) noexcept {
  std::atomic_ref<T>(value).store(desired, std::memory_order_relaxed);
}

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END
