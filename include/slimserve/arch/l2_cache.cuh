#pragma once
/// \file
/// \brief L2 residency controls for data that lives only inside one launch (stream-K
/// partial sums): keep it in L2 while it is needed, then drop it without a write-back.
///
///   const std::uint64_t keep = l2_evict_last_policy();   // once per kernel
///   store_f32x2_l2_hint(slot, v0, v1, keep);             // written ... (8-byte aligned)
///   ... read back by another block of the same launch ...
///   discard_l2_line(slot_line);                          // 128 aligned bytes: no write-back
///
/// `discard.global.L2 [a], 128` (PTX ISA, sm_80+) behaves as a weak write of indeterminate
/// values to [a, a + 128): the dirty line is dropped instead of written to DRAM, and any
/// later read of those bytes (before they are written again) may return anything. Every
/// thread that reads the line must be done with it (a barrier) before one thread discards it.
/// The emulator fills discarded lines with 0xFF (NaN), so a read after a discard fails tests.
///
/// Whether the lines do stay in L2 (the policy is a hint; H200's L2 is 50 MB) is a prediction
/// to confirm with a DRAM byte counter on a GPU.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

#if !defined(__CUDACC__)
#include "slimserve/emu/l2_cache.hpp"
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

inline constexpr int l2_line_bytes = 128;

#if defined(__CUDACC__)

/// An L2 policy that marks lines accessed under it last in line for eviction.
__device__ __forceinline__ std::uint64_t l2_evict_last_policy() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

/// Two FP32 values to global memory (8-byte aligned) under an L2 cache policy.
__device__ __forceinline__ void store_f32x2_l2_hint(float* address, float v0, float v1,
                                                    std::uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;\n" ::"l"(address), "f"(v0),
               "f"(v1), "l"(policy)
               : "memory");
}

/// Drops the 128-byte L2 line at `line` (128-byte aligned, global) without writing it back;
/// its contents are indeterminate afterwards.
__device__ __forceinline__ void discard_l2_line(void* line) {
  asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(line) : "memory");
}

#else  // CPU emulator

inline std::uint64_t l2_evict_last_policy() { return 0; }
inline void store_f32x2_l2_hint(float* address, float v0, float v1, std::uint64_t /*policy*/) {
  emu::detail::check_store_alignment(address, 8, "store_f32x2_l2_hint");
  address[0] = v0;
  address[1] = v1;
}
inline void discard_l2_line(void* line) { emu::detail::discard_l2_line(line, "discard_l2_line"); }

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
