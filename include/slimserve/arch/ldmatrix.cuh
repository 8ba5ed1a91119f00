#pragma once
/// \file
/// \brief ldmatrix: a warp loads one, two or four 8x8 matrices of 16-bit elements from shared
/// memory into mma fragments.
///
/// Lanes 8j..8j+7 pass the addresses of rows 0..7 of matrix j (16-byte aligned); the other
/// lanes' addresses are ignored. Lane l receives, in register j:
///   plain:  row l/4, columns 2(l%4) and 2(l%4)+1 of matrix j (low half first)
///   .trans: column l/4 of rows 2(l%4) and 2(l%4)+1 of matrix j
/// All 32 lanes of the warp must call it together.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

#if !defined(__CUDACC__)
#include "slimserve/emu/tensor_core.hpp"
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

#if defined(__CUDACC__)

namespace detail {
__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}
}  // namespace detail

__device__ __forceinline__ void ldmatrix_x1(std::uint32_t (&r)[1], const void* smem_row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(detail::shared_address(smem_row_address))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2(std::uint32_t (&r)[2], const void* smem_row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(detail::shared_address(smem_row_address))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem_row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(detail::shared_address(smem_row_address))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x1_trans(std::uint32_t (&r)[1],
                                                  const void* smem_row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0])
               : "r"(detail::shared_address(smem_row_address))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x2_trans(std::uint32_t (&r)[2],
                                                  const void* smem_row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(detail::shared_address(smem_row_address))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4],
                                                  const void* smem_row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(detail::shared_address(smem_row_address))
               : "memory");
}

#else  // CPU emulator

#define SLIMSERVE_ARCH_EMU_LDMATRIX(name, count, transposed)                                  \
  inline void name(std::uint32_t (&r)[count], const void* smem_row_address,                   \
                   const char* file = __builtin_FILE(), int line = __builtin_LINE()) {        \
    emu::detail::ldmatrix<count, transposed>(r, smem_row_address, {#name, file, line});       \
  }
SLIMSERVE_ARCH_EMU_LDMATRIX(ldmatrix_x1, 1, false)
SLIMSERVE_ARCH_EMU_LDMATRIX(ldmatrix_x2, 2, false)
SLIMSERVE_ARCH_EMU_LDMATRIX(ldmatrix_x4, 4, false)
SLIMSERVE_ARCH_EMU_LDMATRIX(ldmatrix_x1_trans, 1, true)
SLIMSERVE_ARCH_EMU_LDMATRIX(ldmatrix_x2_trans, 2, true)
SLIMSERVE_ARCH_EMU_LDMATRIX(ldmatrix_x4_trans, 4, true)
#undef SLIMSERVE_ARCH_EMU_LDMATRIX

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
