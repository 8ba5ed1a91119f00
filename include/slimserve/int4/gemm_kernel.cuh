#pragma once
/// \file
/// \brief The dense W4A16 GEMM kernel: C[M,N] = A[M,K] . dequant(W)[K,N] (+ bias).
///
/// One thread block computes a block_m x block_n tile of C over one K slice (split-K: the
/// grid's z) with the shared mainloop (gemm_mainloop.cuh). With one split the epilogue adds
/// the bias and writes C; with several it writes FP32 partial sums and `splitk_reduce_kernel`
/// adds them in a fixed order (deterministic).

#include <cstdint>
#include <type_traits>

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/int4/gemm_mainloop.cuh"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

/// Kernel parameters (built by the host façade from GemmArguments after preflight).
struct GemmParams {
  const std::uint16_t* a;       ///< [m, k] activation type
  const std::uint32_t* b;       ///< [k/16, n/16, 32] packed codes (gemm_layout)
  const std::uint16_t* scales;  ///< [k/group_size, n]
  const std::uint16_t* zeros;   ///< [k/group_size, n], or null: z = 8
  const std::uint16_t* bias;    ///< [n], or null
  std::uint16_t* c;             ///< [m, n]
  float* partials;              ///< [splits, m, n] FP32 when splits > 1
  int m;
  int n;
  int k;
  int group_shift;  ///< group of row r = r >> group_shift (31: per-channel)
  int k_per_split;  ///< a multiple of block_k
  int splits;
};

template <class T, class Config, GroupSpan Span>
__global__ void __launch_bounds__(Config::threads) w4a16_gemm_kernel(const __grid_constant__ GemmParams p) {
  using Storage = GemmSharedStorage<Config, Span>;
  Storage& smem = rt::shared_storage<Storage>();

  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_row = (warp / Config::warps_n) * Config::warp_m;  // within the block tile
  const int warp_col = (warp % Config::warps_n) * Config::warp_n;
  const int n0 = static_cast<int>(blockIdx.x) * Config::block_n;
  const int m0 = static_cast<int>(blockIdx.y) * Config::block_m;
  const int split = static_cast<int>(blockIdx.z);

  TileSources<Config> src;
  SLIMSERVE_INT4_UNROLL
  for (int i = 0; i < TileSources<Config>::a_per_thread; ++i) {
    const int row = m0 + (static_cast<int>(threadIdx.x) + i * Config::threads) / 8;
    src.a_row[i] = row < p.m ? p.a + static_cast<std::int64_t>(row) * p.k : nullptr;
  }
  src.a_row_fallback = p.a;
  src.b = p.b;
  src.scales = p.scales;
  src.zeros = p.zeros;
  src.n = p.n;
  src.k_begin = split * p.k_per_split;
  src.k_end = detail::min_int(p.k, src.k_begin + p.k_per_split);
  src.group_shift = p.group_shift;
  const DenseColumns columns{n0 / gemm_layout::tile_n, p.n / gemm_layout::tile_n};

  // [m16_per_warp, 2 * n16_per_warp, 4]: the mma accumulator fragments
  WarpAccumulators<Config> acc = {};
  w4a16_mainloop<T, Config, Span>(smem, src, columns, warp_row, warp_col, acc);

  // Epilogue. Accumulator fragment: c0, c1 at (row g, cols 2t, 2t+1); c2, c3 at row g + 8.
  SLIMSERVE_INT4_UNROLL
  for (int i = 0; i < Config::m16_per_warp; ++i) {
    SLIMSERVE_INT4_UNROLL
    for (int j = 0; j < 2 * Config::n16_per_warp; ++j) {
      const int col = n0 + warp_col + j * 8 + (lane % 4) * 2;
      if (col >= p.n) continue;
      SLIMSERVE_INT4_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int row = m0 + warp_row + i * 16 + lane / 4 + half * 8;
        if (row >= p.m) continue;
        const float v0 = acc[i][j][2 * half];
        const float v1 = acc[i][j][2 * half + 1];
        if (p.splits > 1) {
          float* out = p.partials + (static_cast<std::int64_t>(split) * p.m + row) * p.n + col;
          out[0] = v0;
          out[1] = v1;
        } else {
          const float b0 = p.bias != nullptr ? to_float(T::from_bits(p.bias[col])) : 0.0f;
          const float b1 = p.bias != nullptr ? to_float(T::from_bits(p.bias[col + 1])) : 0.0f;
          std::uint16_t* out = p.c + static_cast<std::int64_t>(row) * p.n + col;
          out[0] = from_float<T>(v0 + b0).bits;
          out[1] = from_float<T>(v1 + b1).bits;
        }
      }
    }
  }
}

/// Sums the split-K partials in split order (deterministic), adds the bias, rounds to T.
template <class T>
__global__ void splitk_reduce_kernel(const float* __restrict__ partials,  // [splits, m, n]
                                     const std::uint16_t* __restrict__ bias,  // [n] or null
                                     std::uint16_t* __restrict__ c,           // [m, n]
                                     std::int64_t m, std::int64_t n, int splits) {
  const std::int64_t count = m * n;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += partials[s * count + i];
    if (bias != nullptr) sum += to_float(T::from_bits(bias[i % n]));
    c[i] = from_float<T>(sum).bits;
  }
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
