#pragma once
/// \file
/// \brief Dynamic shared memory, the same on the GPU and on the CPU emulator.
///
/// Kernels describe their shared memory with one struct and launch with sizeof(that struct)
/// dynamic bytes (the CUTLASS SharedStorage pattern):
///
///   struct SharedStorage { float partial[4][32]; int count; };
///   auto& shared = rt::shared_storage<SharedStorage>();
///   ... rt::launch(kernel, {grid, block, sizeof(SharedStorage), stream}, ...);
///
/// On the emulator the buffer is exactly that size (ASan reports overruns) and holds 0xFF
/// bytes when each block starts (reading what nothing wrote gives NaN / -1).

#include <cstddef>

#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace rt {

/// Alignment of the dynamic shared memory base (enough for ldmatrix, cp.async and TMA rows).
inline constexpr std::size_t dynamic_shared_memory_alignment = 128;

#if defined(SLIMSERVE_PLATFORM_CUDA)
__device__ __forceinline__ unsigned char* dynamic_shared_memory() {
  extern __shared__ __align__(128) unsigned char slimserve_dynamic_shared_memory[];
  return slimserve_dynamic_shared_memory;
}
#else
inline unsigned char* dynamic_shared_memory() { return emu::detail::dynamic_shared_memory(); }
#endif

/// The block's shared memory viewed as a T at offset 0 (launch with sizeof(T) bytes).
template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE T& shared_storage() {
  static_assert(alignof(T) <= dynamic_shared_memory_alignment,
                "shared storage needs more alignment than the dynamic shared memory base has");
#if !defined(SLIMSERVE_PLATFORM_CUDA)
  if (emu::detail::dynamic_shared_memory_bytes() < sizeof(T)) {
    emu::detail::fail_this_thread("shared_storage<T>() needs " + std::to_string(sizeof(T)) +
                                  " bytes of dynamic shared memory but the launch gave " +
                                  std::to_string(emu::detail::dynamic_shared_memory_bytes()));
  }
#endif
  return *reinterpret_cast<T*>(dynamic_shared_memory());
}

}  // namespace rt
SLIMSERVE_NAMESPACE_END
