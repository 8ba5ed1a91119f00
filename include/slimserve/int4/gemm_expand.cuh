#pragma once
/// \file
/// \brief The expansion path's kernels: packed INT4 -> dense W in the activation type, and a
/// plain tiled dense GEMM (FP32 accumulation) used where cuBLASLt is not available (the CPU
/// emulator). On the GPU the dense GEMM is cuBLASLt.

#include <cstdint>
#include <type_traits>

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/int4/dequant.cuh"
#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/runtime/platform.hpp"
#include "slimserve/runtime/shared_memory.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

/// One thread per packed word: dequantizes its 8 codes with the GEMM's own register routine
/// (so the dense copy is bit-identical to what the fused kernel multiplies with) and stores
/// them at their (row, column) in W. A 16-row tile never straddles a group.
template <class T>
__global__ void dequantize_to_dense_kernel(const std::uint32_t* __restrict__ packed,  // [k/16, n/16, 32]
                                           const std::uint16_t* __restrict__ scales,  // [k/g, n]
                                           const std::uint16_t* __restrict__ zeros,   // [k/g, n] or null
                                           std::uint16_t* __restrict__ dense,         // [k, n]
                                           std::int64_t k, std::int64_t n, std::int64_t group_size) {
  const std::int64_t words = k / 8 * n;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < words; index += stride) {
    const int lane = static_cast<int>(index % gemm_layout::words_per_tile);
    const std::int64_t tile = index / gemm_layout::words_per_tile;
    const std::int64_t tile_row = tile / (n / gemm_layout::tile_n);
    const std::int64_t tile_col = tile % (n / gemm_layout::tile_n);
    const std::int64_t group = tile_row * gemm_layout::tile_k / group_size;
    const std::int64_t col_first = tile_col * gemm_layout::tile_n + lane / 4;
    const std::int64_t col_second = col_first + 8;
    auto column = [&](std::int64_t col) {
      const std::int64_t at = gemm_layout::scale_index(group, col, n);
      return make_dequant_column<T>(scales[at], zeros != nullptr ? zeros[at] : symmetric_zero_bits<T>());
    };
    std::uint32_t b[4];
    dequantize_word<T>(packed[index], column(col_first), column(col_second), b);
    for (int nibble = 0; nibble < gemm_layout::codes_per_word; ++nibble) {
      const gemm_layout::TileCoord at = gemm_layout::code_position(lane, nibble);
      const std::int64_t row = tile_row * gemm_layout::tile_k + at.k;
      const std::int64_t col = tile_col * gemm_layout::tile_n + at.n;
      dense[row * n + col] = static_cast<std::uint16_t>(b[nibble % 4] >> (16 * (nibble / 4)));
    }
  }
}

/// Tile shape of the fallback dense GEMM: 64 x 64 outputs per 256-thread block, 4 x 4 each.
struct DenseGemmTile {
  static constexpr int block_m = 64;
  static constexpr int block_n = 64;
  static constexpr int block_k = 16;
  static constexpr int threads = 256;
  static constexpr int thread_m = 4;
  static constexpr int thread_n = 4;
};

struct DenseGemmSharedStorage {
  float a[DenseGemmTile::block_m][DenseGemmTile::block_k + 1];  // +1: no bank conflicts
  float w[DenseGemmTile::block_k][DenseGemmTile::block_n];
};

/// C[m, n] = A[m, k] . W[k, n] (+ bias), FP32 accumulation, one rounding to T at the end.
template <class T>
__global__ void __launch_bounds__(DenseGemmTile::threads)
    dense_gemm_kernel(const std::uint16_t* __restrict__ a,     // [m, k]
                      const std::uint16_t* __restrict__ w,     // [k, n]
                      const std::uint16_t* __restrict__ bias,  // [n] or null
                      std::uint16_t* __restrict__ c,           // [m, n]
                      std::int64_t m, std::int64_t n, std::int64_t k) {
  using Tile = DenseGemmTile;
  DenseGemmSharedStorage& smem = rt::shared_storage<DenseGemmSharedStorage>();
  const int tid = static_cast<int>(threadIdx.x);
  const std::int64_t m0 = static_cast<std::int64_t>(blockIdx.y) * Tile::block_m;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * Tile::block_n;
  const int row0 = (tid / (Tile::block_n / Tile::thread_n)) * Tile::thread_m;
  const int col0 = (tid % (Tile::block_n / Tile::thread_n)) * Tile::thread_n;
  float acc[Tile::thread_m][Tile::thread_n] = {};
  for (std::int64_t k0 = 0; k0 < k; k0 += Tile::block_k) {
    for (int i = tid; i < Tile::block_m * Tile::block_k; i += Tile::threads) {
      const int r = i / Tile::block_k;
      const int kk = i % Tile::block_k;
      const bool valid = m0 + r < m && k0 + kk < k;
      smem.a[r][kk] = valid ? to_float(T::from_bits(a[(m0 + r) * k + k0 + kk])) : 0.0f;
    }
    for (int i = tid; i < Tile::block_k * Tile::block_n; i += Tile::threads) {
      const int kk = i / Tile::block_n;
      const int col = i % Tile::block_n;
      const bool valid = k0 + kk < k && n0 + col < n;
      smem.w[kk][col] = valid ? to_float(T::from_bits(w[(k0 + kk) * n + n0 + col])) : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < Tile::block_k; ++kk) {
      for (int i = 0; i < Tile::thread_m; ++i) {
        for (int j = 0; j < Tile::thread_n; ++j) {
          acc[i][j] += smem.a[row0 + i][kk] * smem.w[kk][col0 + j];
        }
      }
    }
    __syncthreads();
  }
  for (int i = 0; i < Tile::thread_m; ++i) {
    const std::int64_t row = m0 + row0 + i;
    if (row >= m) continue;
    for (int j = 0; j < Tile::thread_n; ++j) {
      const std::int64_t col = n0 + col0 + j;
      if (col >= n) continue;
      const float b = bias != nullptr ? to_float(T::from_bits(bias[col])) : 0.0f;
      c[row * n + col] = from_float<T>(acc[i][j] + b).bits;
    }
  }
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
