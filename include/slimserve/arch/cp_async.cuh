#pragma once
/// \file
/// \brief cp.async: asynchronous 16-byte (or 4/8-byte) global -> shared copies, grouped by
/// commit and completed by wait.
///
///   cp_async_16(dst, src);               // queue a copy
///   cp_async_16_zfill(dst, src, valid);  // ... or 16 zero bytes when !valid (src not read)
///   cp_async_zfill<Bytes>(dst, src, valid);  // 4, 8 or 16 bytes, both addresses Bytes-aligned
///   cp_async_16_zfill_hint(dst, src, valid, policy);  // ... with an L2 cache policy
///   cp_async_commit();                   // close the current group
///   cp_async_wait<N>();                  // wait until at most N groups are pending
///
/// A wait covers only the calling thread's copies: a __syncthreads() must follow before other
/// threads read them. The emulator performs the copies at the wait, so data read before the
/// matching wait is the 0xFF poison.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

#if !defined(__CUDACC__)
#include "slimserve/emu/async_copy.hpp"
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

#if defined(__CUDACC__)

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src) {
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src)
               : "memory");
}

__device__ __forceinline__ void cp_async_16_zfill(void* smem_dst, const void* gmem_src,
                                                  bool valid) {
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int source_bytes = valid ? 16 : 0;  // 0: read nothing, fill 16 zero bytes
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(source_bytes)
               : "memory");
}

/// 4 and 8 bytes exist only as .ca (cached in L1 too); 16 takes .cg as cp_async_16_zfill. For
/// rows whose size is not a multiple of 16 bytes (NVFP4 head vectors: 36 or 72 bytes).
template <int Bytes>
__device__ __forceinline__ void cp_async_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (Bytes == 16) {
    cp_async_16_zfill(smem_dst, gmem_src, valid);
  } else {
    const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_dst));
    const int source_bytes = valid ? Bytes : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem_src), "n"(Bytes),
                 "r"(source_bytes)
                 : "memory");
  }
}

/// An L2 policy that marks lines read under it first in line for eviction: for data streamed
/// once (INT4 weights in decode), so it does not push reused data (activations) out of L2.
__device__ __forceinline__ std::uint64_t l2_evict_first_policy() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void cp_async_16_zfill_hint(void* smem_dst, const void* gmem_src,
                                                       bool valid, std::uint64_t policy) {
  const auto dst = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int source_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(gmem_src), "r"(source_bytes), "l"(policy)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
  static_assert(N >= 0, "cp_async_wait<N>: N is a count of pending groups");
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#else  // CPU emulator

inline void cp_async_16(void* smem_dst, const void* gmem_src) {
  emu::detail::async_copy_16(smem_dst, gmem_src, false, "cp_async_16");
}
inline void cp_async_16_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  emu::detail::async_copy_16(smem_dst, valid ? gmem_src : nullptr, !valid, "cp_async_16_zfill");
}
template <int Bytes>
inline void cp_async_zfill(void* smem_dst, const void* gmem_src, bool valid) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
  emu::detail::async_copy(smem_dst, valid ? gmem_src : nullptr, Bytes, !valid, "cp_async_zfill");
}
// The emulator has no L2: a policy is a token and the copy is the plain one.
inline std::uint64_t l2_evict_first_policy() { return 0; }
inline void cp_async_16_zfill_hint(void* smem_dst, const void* gmem_src, bool valid,
                                   std::uint64_t /*policy*/) {
  emu::detail::async_copy_16(smem_dst, valid ? gmem_src : nullptr, !valid,
                             "cp_async_16_zfill_hint");
}
inline void cp_async_commit() { emu::detail::async_copy_commit(); }
template <int N>
inline void cp_async_wait() {
  static_assert(N >= 0, "cp_async_wait<N>: N is a count of pending groups");
  emu::detail::async_copy_wait(N);
}

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
