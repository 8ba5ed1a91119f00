#pragma once
/// \file
/// \brief Calibration kernels of the SASS report: loops whose bound is known, so the model's
/// classification can be checked statically (the sass_budget test) and, on a GPU, measured
/// (benchmarks/perf/calibration_bench.cu, run by scripts/gpu-check).
///
///   copy16_kernel      16-byte vector copy, 4 loads in flight per thread: DRAM-bound (~100%)
///   alu_copy16_kernel  the same copy with 256 dependent FFMA per element: issue-bound
///   mma_loop_kernel    one 16-byte load per thread feeds 64 mma.sync: tensor-bound
/// One per fix of the honest model (docs/perf/h200-model.md), each a prediction that fix moves:
///   ss_wgmma_loop_kernel<N>  m64nNk16 wgmma with A and B in shared memory, no global traffic
///                      in the loop: shared-memory-operand bound at N = 16/32, tensor at 64
///   copy16_one_warp_kernel   the copy with 4 warps per CTA and one CTA per SM: one warp per
///                      scheduler (issue per warp, bytes in flight, drains)
///   phased_kernel      one CTA per SM: a wgmma phase, a wait, an FFMA phase, a barrier:
///                      the phases add
///   pingpong_phased_kernel  one CTA of two warpgroups per SM, each phased_kernel's trip, the
///                      wgmma phases taken in turns through named barriers (bar.sync before
///                      the issue, bar.arrive after it): one's FFMA phase under the other's
///                      wgmma, the overlap the model credits to ping-pong kernels
///   imad_copy16_kernel the copy with 64 dependent-free IMAD per element: the IMAD rate
///   copy16_small_kernel the copy over 64 MiB: launch ramp and fill against the steady state
/// Not part of the library; compiled for sm_90a only.

#include <cstdint>

#include "slimserve/arch/named_barrier.cuh"
#include "slimserve/arch/wgmma.cuh"

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

inline constexpr int wgmma_steps = 256;   // wgmma per loop trip
inline constexpr int phased_ffma = 64;    // dependent FFMA per thread per phase

/// Shared memory of the wgmma calibration kernels: A 64 x 16 and B 256 x 16 bf16, no swizzle
/// (core matrices 8 x 16 B), zero-filled once.
struct CalibrationWgmmaShared {
  alignas(1024) std::uint16_t a[64 * 16];
  alignas(1024) std::uint16_t b[256 * 16];
};

/// One warpgroup per CTA; each trip issues wgmma_steps m64nNk16 SS wgmma on the same tiles
/// (accumulating), then waits. dst gets the accumulators (keeps the loop alive).
template <int N>
__global__ void __launch_bounds__(128) ss_wgmma_loop_kernel(float* __restrict__ dst, int trips) {
  __shared__ CalibrationWgmmaShared smem;
  for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) smem.a[i] = 0;
  for (int i = threadIdx.x; i < 256 * 16; i += blockDim.x) smem.b[i] = 0;
  slimserve::arch::fence_proxy_async_shared();
  __syncthreads();
  float d[N / 2] = {};
  const std::uint64_t desc_a = slimserve::arch::make_wgmma_descriptor(
      slimserve::arch::wgmma_shared_address(smem.a), 128, 256, slimserve::arch::WgmmaSwizzle::none);
  const std::uint64_t desc_b = slimserve::arch::make_wgmma_descriptor(
      slimserve::arch::wgmma_shared_address(smem.b), 128, 256, slimserve::arch::WgmmaSwizzle::none);
  for (int t = 0; t < trips; ++t) {
    slimserve::arch::wgmma_fence();
#pragma unroll
    for (int s = 0; s < wgmma_steps; ++s) {
      slimserve::arch::wgmma_mma_ss_bf16<N>(d, desc_a, desc_b, true);
    }
    slimserve::arch::wgmma_commit_group();
    slimserve::arch::wgmma_wait_group<0>();
  }
#pragma unroll
  for (int j = 0; j < N / 2; ++j) dst[(blockIdx.x * blockDim.x + threadIdx.x) * (N / 2) + j] = d[j];
}

/// The copy with one CTA of 128 threads per SM (grid = SM count): one warp per scheduler.
__global__ void __launch_bounds__(128, 1) copy16_one_warp_kernel(const uint4* __restrict__ src,
                                                                 uint4* __restrict__ dst,
                                                                 std::int64_t n) {
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

/// One CTA (one warpgroup) per SM, alternating a wgmma phase (64 m64n64k16 SS wgmma, then a
/// wait) and an FFMA phase (phased_ffma dependent FFMA on 8 accumulators), a barrier between.
__global__ void __launch_bounds__(128, 1) phased_kernel(float* __restrict__ dst, int trips,
                                                        float a, float b) {
  __shared__ CalibrationWgmmaShared smem;
  for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) smem.a[i] = 0;
  for (int i = threadIdx.x; i < 256 * 16; i += blockDim.x) smem.b[i] = 0;
  slimserve::arch::fence_proxy_async_shared();
  __syncthreads();
  float d[32] = {};
  const std::uint64_t desc_a = slimserve::arch::make_wgmma_descriptor(
      slimserve::arch::wgmma_shared_address(smem.a), 128, 256, slimserve::arch::WgmmaSwizzle::none);
  const std::uint64_t desc_b = slimserve::arch::make_wgmma_descriptor(
      slimserve::arch::wgmma_shared_address(smem.b), 128, 256, slimserve::arch::WgmmaSwizzle::none);
  for (int t = 0; t < trips; ++t) {
    slimserve::arch::wgmma_fence();
#pragma unroll
    for (int s = 0; s < 64; ++s) slimserve::arch::wgmma_mma_ss_bf16<64>(d, desc_a, desc_b, true);
    slimserve::arch::wgmma_commit_group();
    slimserve::arch::wgmma_wait_group<0>();
#pragma unroll
    for (int r = 0; r < phased_ffma; ++r) {
#pragma unroll
      for (int j = 0; j < 8; ++j) d[j] = fmaf(d[j], a, b);
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 32; ++j) dst[(blockIdx.x * blockDim.x + threadIdx.x) * 32 + j] = d[j];
}

/// Two warpgroups per CTA, one CTA per SM, each running phased_kernel's trip (64 m64n64k16 SS
/// wgmma, wait, phased_ffma x 8 FFMA); warpgroup w waits on named barrier 1 + w for its turn
/// before issuing and passes the turn on 2 - w once issued (warpgroup 0 goes first), so the
/// tensor phases alternate and each FFMA phase can run under the other's wgmma.
__global__ void __launch_bounds__(256, 1) pingpong_phased_kernel(float* __restrict__ dst, int trips,
                                                                 float a, float b) {
  __shared__ CalibrationWgmmaShared smem;
  for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) smem.a[i] = 0;
  for (int i = threadIdx.x; i < 256 * 16; i += blockDim.x) smem.b[i] = 0;
  slimserve::arch::fence_proxy_async_shared();
  __syncthreads();
  const int group = static_cast<int>(threadIdx.x) / 128;
  float d[32] = {};
  const std::uint64_t desc_a = slimserve::arch::make_wgmma_descriptor(
      slimserve::arch::wgmma_shared_address(smem.a), 128, 256, slimserve::arch::WgmmaSwizzle::none);
  const std::uint64_t desc_b = slimserve::arch::make_wgmma_descriptor(
      slimserve::arch::wgmma_shared_address(smem.b), 128, 256, slimserve::arch::WgmmaSwizzle::none);
  for (int t = 0; t < trips; ++t) {
    // turn order 0, 1, 0, 1, ...: group 0's trip t follows group 1's trip t - 1
    if (group == 1 || t > 0) slimserve::arch::named_barrier_sync(1 + group, 256);
    slimserve::arch::wgmma_fence();
#pragma unroll
    for (int s = 0; s < 64; ++s) slimserve::arch::wgmma_mma_ss_bf16<64>(d, desc_a, desc_b, true);
    slimserve::arch::wgmma_commit_group();
    if (group == 0 || t + 1 < trips) slimserve::arch::named_barrier_arrive(2 - group, 256);
    slimserve::arch::wgmma_wait_group<0>();
#pragma unroll
    for (int r = 0; r < phased_ffma; ++r) {
#pragma unroll
      for (int j = 0; j < 8; ++j) d[j] = fmaf(d[j], a, b);
    }
  }
#pragma unroll
  for (int j = 0; j < 32; ++j) dst[(blockIdx.x * blockDim.x + threadIdx.x) * 32 + j] = d[j];
}

inline constexpr int imad_rounds = 64;  // IMAD per 32-bit word

/// The copy with imad_rounds multiply-adds on each 32-bit word (4 independent chains).
__global__ void __launch_bounds__(256) imad_copy16_kernel(const uint4* __restrict__ src,
                                                          uint4* __restrict__ dst, std::int64_t n,
                                                          unsigned a, unsigned b) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    uint4 v = src[i];
#pragma unroll
    for (int r = 0; r < imad_rounds; ++r) {
      v.x = v.x * a + b;
      v.y = v.y * a + b;
      v.z = v.z * a + b;
      v.w = v.w * a + b;
    }
    dst[i] = v;
  }
}

/// The copy16 loop again, under its own name: its rows time 64 MiB, where the launch ramp and
/// the first fill are a visible part of the kernel.
__global__ void __launch_bounds__(256) copy16_small_kernel(const uint4* __restrict__ src,
                                                           uint4* __restrict__ dst,
                                                           std::int64_t n) {
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

}  // namespace slimserve_calibration
