#pragma once
/// \file
/// \brief Calibration kernels of the SASS report: loops whose bound is known, so the model's
/// classification can be checked statically (the sass_budget test) and, on a GPU, measured
/// (benchmarks/perf/calibration_bench.cu, run by scripts/gpu-check).
///
///   copy16_kernel      16-byte vector copy, 4 loads in flight per thread: DRAM-bound (~100%)
///   alu_copy16_kernel  the same copy with 256 dependent FFMA per element: issue-bound
///   mma_loop_kernel    one 16-byte load per thread feeds 64 mma.sync: tensor-bound
/// Not part of the library; compiled for sm_90a only.

#include <cstdint>

namespace slimserve_calibration {

inline constexpr int copy_unroll = 4;  // 16-byte loads issued before the first store
inline constexpr int alu_rounds = 256; // dependent FFMA per float element
inline constexpr int mma_per_load = 64;

/// dst[i] = src[i] over n 16-byte vectors; grid-stride, copy_unroll vectors per thread per step.
__global__ void __launch_bounds__(256) copy16_kernel(const uint4* __restrict__ src,
                                                     uint4* __restrict__ dst, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (copy_unroll - 1) * stride < n; i += copy_unroll * stride) {
    uint4 v[copy_unroll];
#pragma unroll
    for (int u = 0; u < copy_unroll; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < copy_unroll; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < n; i += stride) dst[i] = src[i];  // tail
}

/// The copy with alu_rounds dependent FFMA on each of the 4 floats of a vector.
__global__ void __launch_bounds__(256) alu_copy16_kernel(const float4* __restrict__ src,
                                                         float4* __restrict__ dst, std::int64_t n,
                                                         float a, float b) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float4 v = src[i];
#pragma unroll
    for (int r = 0; r < alu_rounds; ++r) {
      v.x = fmaf(v.x, a, b);
      v.y = fmaf(v.y, a, b);
      v.z = fmaf(v.z, a, b);
      v.w = fmaf(v.w, a, b);
    }
    dst[i] = v;
  }
}

/// Per step each thread loads 16 bytes (A and B fragments of bf16), then issues mma_per_load
/// m16n8k16 BF16 mma.sync on them; the FP32 accumulators are stored once at the end.
__global__ void __launch_bounds__(128) mma_loop_kernel(const uint4* __restrict__ src,
                                                       float4* __restrict__ dst, std::int64_t n) {
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const uint4 v = src[i];
#pragma unroll
    for (int r = 0; r < mma_per_load; ++r) {
      // Rotate which words feed A and B so consecutive mma are not merged by the compiler.
      const std::uint32_t a0 = r % 2 ? v.x : v.y, a1 = r % 3 ? v.y : v.z;
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
          "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
          : "r"(a0), "r"(a1), "r"(v.z), "r"(v.w), "r"(v.x), "r"(v.w));
    }
  }
  dst[static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x] =
      make_float4(acc[0], acc[1], acc[2], acc[3]);
}

}  // namespace slimserve_calibration
