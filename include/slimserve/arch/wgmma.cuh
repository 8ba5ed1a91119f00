#pragma once
/// \file
/// \brief sm_90a warpgroup MMA (wgmma): D(64xN, f32) = A(64x16) * B(16xN) [+ D], bf16 or fp16
/// inputs, issued by the 128 threads of a warpgroup and completed asynchronously.
///
///   wgmma_fence();                        // before the first mma of a batch (orders registers)
///   wgmma_mma_ss_bf16<N>(d, desc_a, desc_b, accumulate);  // A and B in shared memory
///   wgmma_mma_rs_bf16<N>(d, a, desc_b, accumulate);       // A in registers, B in shared memory
///   wgmma_commit_group();                 // close the batch
///   wgmma_wait_group<0>();                // d is readable (and the smem tiles reusable) now
///
/// Fragments (w = warp % 4, g = lane / 4, t = lane % 4; element i of A is half i%2 of register
/// i/2):
///   d[i], i < N/2: D[16w + g + 8*((i/2)%2)][8*(i/4) + 2t + i%2]
///   a[i/2] elem i: A[16w + g + 8*((i/2)%2)][2t + i%2 + 8*(i/4)]
/// Shared operands: make_wgmma_descriptor() over a tile in one of the canonical layouts of the
/// PTX ISA (K-major or MN-major, core matrices of 8 rows x 16 bytes, optional 32/64/128-byte
/// swizzle); wgmma_smem_offset() gives the byte offset of an element inside such a tile, for
/// the code that fills it. Tiles that are written by ordinary stores need
/// fence_proxy_async_shared() (after the stores, before the barrier) to be seen by wgmma.
///
/// Warpgroups are warps 4k..4k+3; every wgmma_* call must be made by all 128 threads at the
/// same place. The emulator (emu/wgmma.hpp) checks the fence, the warpgroup rendezvous, and
/// makes accumulators readable only after the wait_group that retires their operation.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

#if defined(__CUDACC__)
#include "slimserve/arch/detail/wgmma_asm.cuh"
#else
#include "slimserve/emu/wgmma.hpp"
#endif

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SLIMSERVE_ARCH_HAS_WGMMA 1
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

/// Descriptor bits 62-63.
enum class WgmmaSwizzle : std::uint32_t { none = 0, bytes128 = 1, bytes64 = 2, bytes32 = 3 };
/// imm-trans-a / imm-trans-b: K-major (0) or M/N-major (1, transposed).
enum class WgmmaMajor : int { k = 0, mn = 1 };

/// Bytes of one swizzled row, the width of the swizzle atom (16 without swizzling: one core
/// matrix row).
SLIMSERVE_HOST_DEVICE constexpr std::uint32_t wgmma_row_bytes(WgmmaSwizzle swizzle) {
  return swizzle == WgmmaSwizzle::bytes128  ? 128u
         : swizzle == WgmmaSwizzle::bytes64 ? 64u
         : swizzle == WgmmaSwizzle::bytes32 ? 32u
                                            : 16u;
}
/// Alignment the tile's first byte needs so that its swizzle pattern starts there (the
/// descriptor's base offset is then 0).
SLIMSERVE_HOST_DEVICE constexpr std::uint32_t wgmma_pattern_bytes(WgmmaSwizzle swizzle) {
  return swizzle == WgmmaSwizzle::none ? 16u : 8u * wgmma_row_bytes(swizzle);
}

/// The 64-bit shared memory matrix descriptor. `smem_address` is a shared-window address
/// (wgmma_shared_address()); offsets are in bytes and multiples of 16.
SLIMSERVE_HOST_DEVICE constexpr std::uint64_t make_wgmma_descriptor(
    std::uint32_t smem_address, std::uint32_t leading_byte_offset,
    std::uint32_t stride_byte_offset, WgmmaSwizzle swizzle, std::uint32_t base_offset = 0) {
  auto encode = [](std::uint32_t x) { return std::uint64_t{(x & 0x3FFFFu) >> 4}; };
  return encode(smem_address) | encode(leading_byte_offset) << 16 |
         encode(stride_byte_offset) << 32 | std::uint64_t{base_offset & 7u} << 49 |
         std::uint64_t{static_cast<std::uint32_t>(swizzle)} << 62;
}

/// Byte offset of 16-bit element (mn, k) from the tile start in a canonical layout, after
/// swizzling: where one instruction's descriptor finds it. Valid when the tile starts on a
/// wgmma_pattern_bytes(swizzle) boundary.
/// K-major: mn indexes rows, in 8-row groups SBO apart; k runs along the row (LBO between the
/// two 8-element halves without swizzle; swizzled rows hold k < row_bytes/2, and later K
/// slices are addressed by moving the start address). MN-major: mn runs along the row (LBO
/// between row_bytes/2-element atoms when swizzled, SBO between 8-element core matrices
/// without); k indexes rows (SBO between groups of 8 when swizzled, LBO without).
SLIMSERVE_HOST_DEVICE constexpr std::uint32_t wgmma_smem_offset(
    WgmmaMajor major, WgmmaSwizzle swizzle, std::uint32_t leading_byte_offset,
    std::uint32_t stride_byte_offset, std::uint32_t mn, std::uint32_t k) {
  const std::uint32_t row_bytes = wgmma_row_bytes(swizzle);
  std::uint32_t offset = 0;
  if (major == WgmmaMajor::k) {
    offset = swizzle == WgmmaSwizzle::none
                 ? (mn % 8) * 16 + (mn / 8) * stride_byte_offset + (k % 8) * 2 +
                       (k / 8) * leading_byte_offset
                 : (mn % 8) * row_bytes + (mn / 8) * stride_byte_offset + k * 2;
  } else {
    offset = swizzle == WgmmaSwizzle::none
                 ? (mn % 8) * 2 + (mn / 8) * stride_byte_offset + (k % 8) * 16 +
                       (k / 8) * leading_byte_offset
                 : (mn % (row_bytes / 2)) * 2 + (mn / (row_bytes / 2)) * leading_byte_offset +
                       (k % 8) * row_bytes + (k / 8) * stride_byte_offset;
  }
  const std::uint32_t row_bits = swizzle == WgmmaSwizzle::bytes128  ? 7u
                                 : swizzle == WgmmaSwizzle::bytes64 ? 3u
                                 : swizzle == WgmmaSwizzle::bytes32 ? 1u
                                                                    : 0u;
  return offset ^ (((offset >> 7) & row_bits) << 4);
}

#if defined(__CUDACC__)

/// The shared-window address of a pointer into shared memory (what descriptors hold).
__device__ __forceinline__ std::uint32_t wgmma_shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(SLIMSERVE_ARCH_HAS_WGMMA)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
  __trap();  // wgmma needs sm_90a
#endif
}

__device__ __forceinline__ void wgmma_commit_group() {
#if defined(SLIMSERVE_ARCH_HAS_WGMMA)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

/// Waits until at most `Pending` committed groups of this warpgroup are still in flight.
template <int Pending>
__device__ __forceinline__ void wgmma_wait_group() {
  static_assert(Pending >= 0 && Pending <= 7, "wgmma.wait_group takes 0..7");
#if defined(SLIMSERVE_ARCH_HAS_WGMMA)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

/// Makes this thread's earlier generic-proxy shared-memory writes visible to the async proxy
/// (wgmma operand reads). Follow it with a barrier before another thread issues the wgmma.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

template <int N, WgmmaMajor AMajor = WgmmaMajor::k, WgmmaMajor BMajor = WgmmaMajor::k>
__device__ __forceinline__ void wgmma_mma_ss_bf16(float (&d)[N / 2], std::uint64_t desc_a,
                                                  std::uint64_t desc_b, bool accumulate) {
#if defined(SLIMSERVE_ARCH_HAS_WGMMA)
  detail::WgmmaAsm<N>::template mma_async_ss_bf16<static_cast<int>(AMajor),
                                                   static_cast<int>(BMajor)>(d, desc_a, desc_b,
                                                                             accumulate ? 1 : 0);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
template <int N, WgmmaMajor AMajor = WgmmaMajor::k, WgmmaMajor BMajor = WgmmaMajor::k>
__device__ __forceinline__ void wgmma_mma_ss_fp16(float (&d)[N / 2], std::uint64_t desc_a,
                                                  std::uint64_t desc_b, bool accumulate) {
#if defined(SLIMSERVE_ARCH_HAS_WGMMA)
  detail::WgmmaAsm<N>::template mma_async_ss_fp16<static_cast<int>(AMajor),
                                                   static_cast<int>(BMajor)>(d, desc_a, desc_b,
                                                                             accumulate ? 1 : 0);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
template <int N, WgmmaMajor BMajor = WgmmaMajor::k>
__device__ __forceinline__ void wgmma_mma_rs_bf16(float (&d)[N / 2], const std::uint32_t (&a)[4],
                                                  std::uint64_t desc_b, bool accumulate) {
#if defined(SLIMSERVE_ARCH_HAS_WGMMA)
  detail::WgmmaAsm<N>::template mma_async_rs_bf16<static_cast<int>(BMajor)>(d, a, desc_b,
                                                                             accumulate ? 1 : 0);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
template <int N, WgmmaMajor BMajor = WgmmaMajor::k>
__device__ __forceinline__ void wgmma_mma_rs_fp16(float (&d)[N / 2], const std::uint32_t (&a)[4],
                                                  std::uint64_t desc_b, bool accumulate) {
#if defined(SLIMSERVE_ARCH_HAS_WGMMA)
  detail::WgmmaAsm<N>::template mma_async_rs_fp16<static_cast<int>(BMajor)>(d, a, desc_b,
                                                                             accumulate ? 1 : 0);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

#else  // CPU emulator

/// The emulator's shared window: offsets from the block's dynamic shared memory base.
inline std::uint32_t wgmma_shared_address(const void* pointer) {
  const auto* base = emu::detail::dynamic_shared_memory();
  const auto* byte = static_cast<const unsigned char*>(pointer);
  if (byte < base || byte >= base + emu::detail::dynamic_shared_memory_bytes()) {
    emu::detail::fail_this_thread(
        "wgmma_shared_address: the pointer is not inside the block's dynamic shared memory");
  }
  return static_cast<std::uint32_t>(byte - base);
}

inline void wgmma_fence(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::detail::wgmma_fence({"wgmma.fence", file, line});
}
inline void wgmma_commit_group(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::detail::wgmma_commit({"wgmma.commit_group", file, line});
}
template <int Pending>
inline void wgmma_wait_group(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(Pending >= 0 && Pending <= 7, "wgmma.wait_group takes 0..7");
  emu::detail::wgmma_wait(Pending, {"wgmma.wait_group", file, line});
}
/// The emulator has one memory proxy: nothing to order.
inline void fence_proxy_async_shared() {}

namespace detail {
template <int N>
inline constexpr bool valid_wgmma_n = N >= 8 && N <= 256 && N % 8 == 0;
}  // namespace detail

template <int N, WgmmaMajor AMajor = WgmmaMajor::k, WgmmaMajor BMajor = WgmmaMajor::k>
inline void wgmma_mma_ss_bf16(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b,
                              bool accumulate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  static_assert(detail::valid_wgmma_n<N>, "m64nNk16 needs N = 8, 16, ..., 256");
  emu::detail::wgmma_mma_async<emu::detail::MmaInput::bf16>(
      d, N, nullptr, desc_a, desc_b, AMajor == WgmmaMajor::mn, BMajor == WgmmaMajor::mn,
      accumulate, {"wgmma.mma_async (bf16, A and B in shared memory)", file, line});
}
template <int N, WgmmaMajor AMajor = WgmmaMajor::k, WgmmaMajor BMajor = WgmmaMajor::k>
inline void wgmma_mma_ss_fp16(float (&d)[N / 2], std::uint64_t desc_a, std::uint64_t desc_b,
                              bool accumulate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  static_assert(detail::valid_wgmma_n<N>, "m64nNk16 needs N = 8, 16, ..., 256");
  emu::detail::wgmma_mma_async<emu::detail::MmaInput::fp16>(
      d, N, nullptr, desc_a, desc_b, AMajor == WgmmaMajor::mn, BMajor == WgmmaMajor::mn,
      accumulate, {"wgmma.mma_async (f16, A and B in shared memory)", file, line});
}
template <int N, WgmmaMajor BMajor = WgmmaMajor::k>
inline void wgmma_mma_rs_bf16(float (&d)[N / 2], const std::uint32_t (&a)[4],
                              std::uint64_t desc_b, bool accumulate,
                              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(detail::valid_wgmma_n<N>, "m64nNk16 needs N = 8, 16, ..., 256");
  emu::detail::wgmma_mma_async<emu::detail::MmaInput::bf16>(
      d, N, a, 0, desc_b, false, BMajor == WgmmaMajor::mn, accumulate,
      {"wgmma.mma_async (bf16, A in registers)", file, line});
}
template <int N, WgmmaMajor BMajor = WgmmaMajor::k>
inline void wgmma_mma_rs_fp16(float (&d)[N / 2], const std::uint32_t (&a)[4],
                              std::uint64_t desc_b, bool accumulate,
                              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(detail::valid_wgmma_n<N>, "m64nNk16 needs N = 8, 16, ..., 256");
  emu::detail::wgmma_mma_async<emu::detail::MmaInput::fp16>(
      d, N, a, 0, desc_b, false, BMajor == WgmmaMajor::mn, accumulate,
      {"wgmma.mma_async (f16, A in registers)", file, line});
}

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
