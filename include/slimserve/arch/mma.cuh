#pragma once
/// \file
/// \brief Warp-level tensor-core MMA: D = A * B + C for one 16x8x16 tile (mma.sync
/// m16n8k16, A row-major, B "col", fp32 accumulate), bf16 or fp16 inputs.
///
/// Fragments per lane (g = lane / 4, t = lane % 4; element i is half i%2 of register i/2):
///   a[4]: A[g + 8*((i/2)%2)][2t + i%2 + 8*(i/4)], i = 0..7
///   b[2]: B[2t + i%2 + 8*(i/2)][g],              i = 0..3
///   c[4], d[4]: C[g + 8*(i/2)][2t + i%2],         i = 0..3
/// All 32 lanes of the warp must call it together (the emulator checks this).

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

#if !defined(__CUDACC__)
#include "slimserve/emu/tensor_core.hpp"
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

#if defined(__CUDACC__)

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                                  const std::uint32_t (&b)[2],
                                                  const float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#elif defined(__CUDA_ARCH__)
  __trap();  // bf16 mma needs sm_80 or newer
#endif
}

__device__ __forceinline__ void mma_m16n8k16_fp16(float (&d)[4], const std::uint32_t (&a)[4],
                                                  const std::uint32_t (&b)[2],
                                                  const float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#elif defined(__CUDA_ARCH__)
  __trap();  // m16n8k16 needs sm_80 or newer
#endif
}

#else  // CPU emulator

inline void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                              const std::uint32_t (&b)[2], const float (&c)[4],
                              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::detail::mma_m16n8k16<emu::detail::MmaInput::bf16>(
      d, a, b, c, {"mma_m16n8k16_bf16", file, line});
}

inline void mma_m16n8k16_fp16(float (&d)[4], const std::uint32_t (&a)[4],
                              const std::uint32_t (&b)[2], const float (&c)[4],
                              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::detail::mma_m16n8k16<emu::detail::MmaInput::fp16>(
      d, a, b, c, {"mma_m16n8k16_fp16", file, line});
}

#endif

}  // namespace arch
SLIMSERVE_NAMESPACE_END
