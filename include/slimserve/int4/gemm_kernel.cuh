#pragma once
/// \file
/// \brief The W4A16 GEMM kernel: C[M,N] = A[M,K] . dequant(W)[K,N] (+ bias), mma.sync
/// m16n8k16 with FP32 accumulation, a multi-stage cp.async pipeline and split-K.
///
/// One thread block computes a block_m x block_n tile of C over one K slice (split-K: the
/// grid's z). Per 64-row K step a stage holds the A tile, the packed weight words, and the (at
/// most two) rows of scales and zeros that step touches. Each warp owns a warp_m x warp_n
/// sub-tile; per 16 rows of K it loads its A fragments with ldmatrix, one packed word per 16
/// columns, dequantizes that word in registers (dequant.cuh) and issues two mma per m16 tile.
/// With one split the epilogue adds the bias and writes C; with several it writes FP32
/// partial sums and `splitk_reduce_kernel` adds them in a fixed order (deterministic).

#include <cstdint>
#include <type_traits>

#include "slimserve/arch/cp_async.cuh"
#include "slimserve/arch/ldmatrix.cuh"
#include "slimserve/arch/mma.cuh"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/int4/dequant.cuh"
#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/runtime/platform.hpp"
#include "slimserve/runtime/shared_memory.cuh"

// Fragment loops must be unrolled so the accumulators stay in registers (not in a stack
// frame); the emulator's compiler needs no hint.
#if defined(__CUDACC__)
#define SLIMSERVE_INT4_UNROLL _Pragma("unroll")
#else
#define SLIMSERVE_INT4_UNROLL
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

/// A thread-block tile shape. block_k is fixed at 64: with groups that are multiples of 32,
/// a 64-aligned K step touches at most two groups (two scale rows in shared memory).
template <int BlockM, int BlockN, int WarpsM, int WarpsN, int Stages>
struct GemmTileConfig {
  static constexpr int block_m = BlockM;
  static constexpr int block_n = BlockN;
  static constexpr int block_k = 64;
  static constexpr int warps_m = WarpsM;
  static constexpr int warps_n = WarpsN;
  static constexpr int stages = Stages;
  static constexpr int threads = WarpsM * WarpsN * 32;
  static constexpr int warp_m = BlockM / WarpsM;
  static constexpr int warp_n = BlockN / WarpsN;
  static constexpr int m16_per_warp = warp_m / 16;
  static constexpr int n16_per_warp = warp_n / 16;
  static constexpr int k16_per_block = block_k / 16;
  static constexpr int group_rows = 2;  ///< scale rows per stage

  static_assert(warp_m % 16 == 0 && warp_n % 16 == 0, "warp tiles are made of 16x16 tiles");
  static_assert(Stages >= 2, "a pipeline needs at least two stages");
};

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
  int group_size;
  int k_per_split;  ///< a multiple of block_k
  int splits;
};

/// Shared memory of one thread block; the launch asks for exactly sizeof of this.
template <class Config>
struct GemmSharedStorage {
  struct Stage {
    // [block_m, block_k], 16-byte chunks XOR-swizzled by row % 8 so ldmatrix is conflict-free
    alignas(128) std::uint16_t a[Config::block_m * Config::block_k];
    // [block_k/16, block_n/16, 32]: the packed words, in the global order
    alignas(128) std::uint32_t b[Config::k16_per_block * (Config::block_n / 16) * 32];
    alignas(16) std::uint16_t scales[Config::group_rows * Config::block_n];  // [2, block_n]
    alignas(16) std::uint16_t zeros[Config::group_rows * Config::block_n];   // [2, block_n]
  };
  Stage stages[Config::stages];
};

namespace detail {

SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE int min_int(int a, int b) { return a < b ? a : b; }

template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void mma_16816(float (&acc)[4], const std::uint32_t (&a)[4],
                                                      const std::uint32_t (&b)[2]) {
  float out[4];
  if constexpr (std::is_same_v<T, bf16>) {
    arch::mma_m16n8k16_bf16(out, a, b, acc);
  } else {
    arch::mma_m16n8k16_fp16(out, a, b, acc);
  }
  SLIMSERVE_INT4_UNROLL
  for (int i = 0; i < 4; ++i) acc[i] = out[i];
}

/// Element offset of (row, col) in a stage's swizzled A tile.
template <class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE int a_tile_offset(int row, int col) {
  const int chunk = (col / 8) ^ (row % 8);
  return row * Config::block_k + chunk * 8 + col % 8;
}

/// Issues the cp.async copies of K step `k0` (k0 < k_end, a multiple of 64) into `stage`.
template <class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void load_stage(
    typename GemmSharedStorage<Config>::Stage& stage, const GemmParams& p, int m0, int n0, int k0,
    int k_end) {
  const int tid = static_cast<int>(threadIdx.x);
  constexpr int chunks_per_a_row = Config::block_k / 8;  // 16-byte chunks of 8 values
  constexpr int a_chunks = Config::block_m * chunks_per_a_row;
  for (int chunk = tid; chunk < a_chunks; chunk += Config::threads) {
    const int row = chunk / chunks_per_a_row;
    const int col = (chunk % chunks_per_a_row) * 8;
    const bool valid = m0 + row < p.m && k0 + col < k_end;
    const std::uint16_t* src = valid ? p.a + static_cast<std::int64_t>(m0 + row) * p.k + k0 + col : p.a;
    arch::cp_async_16_zfill(&stage.a[a_tile_offset<Config>(row, col)], src, valid);
  }

  // The words of one 16-row K tile and block_n columns are contiguous in global memory.
  constexpr int b_chunks_per_k16 = Config::block_n / 16 * gemm_layout::words_per_tile / 4;
  constexpr int b_chunks = Config::k16_per_block * b_chunks_per_k16;
  const int n16_total = p.n / gemm_layout::tile_n;
  for (int chunk = tid; chunk < b_chunks; chunk += Config::threads) {
    const int k16 = chunk / b_chunks_per_k16;
    const int word = (chunk % b_chunks_per_k16) * 4;
    const int tile_col = n0 / gemm_layout::tile_n + word / gemm_layout::words_per_tile;
    const int tile_row = k0 / gemm_layout::tile_k + k16;
    const bool valid = k0 + k16 * gemm_layout::tile_k < k_end && tile_col < n16_total;
    const std::uint32_t* src =
        valid ? p.b + gemm_layout::packed_word_index(tile_row, tile_col, word % 32, p.n) : p.b;
    arch::cp_async_16_zfill(&stage.b[k16 * (Config::block_n / 16) * 32 + word], src, valid);
  }

  // Scale (and zero) rows of the groups this step touches: g_first .. g_last (at most 2).
  const int g_first = k0 / p.group_size;
  const int g_last = (min_int(k0 + Config::block_k, k_end) - 1) / p.group_size;
  constexpr int chunks_per_scale_row = Config::block_n / 8;
  constexpr int scale_chunks = Config::group_rows * chunks_per_scale_row;
  for (int chunk = tid; chunk < 2 * scale_chunks; chunk += Config::threads) {
    const bool is_zero = chunk >= scale_chunks;
    const int index = is_zero ? chunk - scale_chunks : chunk;
    const int row = index / chunks_per_scale_row;
    const int col = (index % chunks_per_scale_row) * 8;
    const std::uint16_t* base = is_zero ? p.zeros : p.scales;
    if (base == nullptr) continue;  // symmetric: no zeros to load
    const bool valid = g_first + row <= g_last && n0 + col < p.n;
    const std::uint16_t* src =
        valid ? base + gemm_layout::scale_index(g_first + row, n0 + col, p.n) : base;
    std::uint16_t* dst = is_zero ? stage.zeros : stage.scales;
    arch::cp_async_16_zfill(&dst[row * Config::block_n + col], src, valid);
  }
}

}  // namespace detail

template <class T, class Config>
__global__ void __launch_bounds__(Config::threads) w4a16_gemm_kernel(const __grid_constant__ GemmParams p) {
  using Storage = GemmSharedStorage<Config>;
  Storage& smem = rt::shared_storage<Storage>();

  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_row = (warp / Config::warps_n) * Config::warp_m;  // within the block tile
  const int warp_col = (warp % Config::warps_n) * Config::warp_n;
  const int n0 = static_cast<int>(blockIdx.x) * Config::block_n;
  const int m0 = static_cast<int>(blockIdx.y) * Config::block_m;
  const int split = static_cast<int>(blockIdx.z);
  const int k_begin = split * p.k_per_split;
  const int k_end = detail::min_int(p.k, k_begin + p.k_per_split);
  const int k_steps = (k_end - k_begin + Config::block_k - 1) / Config::block_k;

  // [m16_per_warp, 2 * n16_per_warp, 4]: the mma accumulator fragments
  float acc[Config::m16_per_warp][2 * Config::n16_per_warp][4] = {};

  for (int s = 0; s < Config::stages - 1; ++s) {
    if (s < k_steps) {
      detail::load_stage<Config>(smem.stages[s], p, m0, n0, k_begin + s * Config::block_k, k_end);
    }
    arch::cp_async_commit();
  }

  const std::uint16_t symmetric_zero = symmetric_zero_bits<T>();
  for (int step = 0; step < k_steps; ++step) {
    arch::cp_async_wait<Config::stages - 2>();
    __syncthreads();  // step's data visible; everyone is done with the stage refilled below
    const int next = step + Config::stages - 1;
    if (next < k_steps) {
      detail::load_stage<Config>(smem.stages[next % Config::stages], p, m0, n0,
                                 k_begin + next * Config::block_k, k_end);
    }
    arch::cp_async_commit();

    const typename Storage::Stage& stage = smem.stages[step % Config::stages];
    const int k0 = k_begin + step * Config::block_k;
    const int g_first = k0 / p.group_size;
    SLIMSERVE_INT4_UNROLL
    for (int k16 = 0; k16 < Config::k16_per_block; ++k16) {
      const int k = k0 + k16 * 16;
      if (k >= k_end) continue;  // the K tail: skip 16-row tiles past the slice's end
      const int group_row = k / p.group_size - g_first;

      std::uint32_t a_frag[Config::m16_per_warp][4];
      SLIMSERVE_INT4_UNROLL
      for (int i = 0; i < Config::m16_per_warp; ++i) {
        const int row = warp_row + i * 16 + lane % 16;
        const int col = k16 * 16 + (lane / 16) * 8;
        arch::ldmatrix_x4(a_frag[i], &stage.a[detail::a_tile_offset<Config>(row, col)]);
      }
      SLIMSERVE_INT4_UNROLL
      for (int j = 0; j < Config::n16_per_warp; ++j) {
        const int tile_col = (warp_col / 16) + j;  // 16-column tile within the block
        const std::uint32_t word = stage.b[(k16 * (Config::block_n / 16) + tile_col) * 32 + lane];
        const int col_first = tile_col * 16 + lane / 4;  // this lane's B column, first n8 half
        const int col_second = col_first + 8;
        const std::uint16_t* scale_row = &stage.scales[group_row * Config::block_n];
        const std::uint16_t* zero_row = &stage.zeros[group_row * Config::block_n];
        const bool has_zeros = p.zeros != nullptr;
        const DequantColumn first = make_dequant_column<T>(
            scale_row[col_first], has_zeros ? zero_row[col_first] : symmetric_zero);
        const DequantColumn second = make_dequant_column<T>(
            scale_row[col_second], has_zeros ? zero_row[col_second] : symmetric_zero);
        std::uint32_t b[4];
        dequantize_word<T>(word, first, second, b);
        const std::uint32_t b_first[2] = {b[0], b[1]};
        const std::uint32_t b_second[2] = {b[2], b[3]};
        SLIMSERVE_INT4_UNROLL
        for (int i = 0; i < Config::m16_per_warp; ++i) {
          detail::mma_16816<T>(acc[i][2 * j], a_frag[i], b_first);
          detail::mma_16816<T>(acc[i][2 * j + 1], a_frag[i], b_second);
        }
      }
    }
  }
  arch::cp_async_wait<0>();

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
