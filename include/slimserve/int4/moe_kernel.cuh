#pragma once
/// \file
/// \brief Kernels of the grouped (MoE) W4A16 GEMM: routing alignment pieces, the grouped
/// GEMM with its two epilogues, and the deterministic combine. Façade: moe.hpp.

#include <cmath>
#include <cstdint>

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/int4/gemm_mainloop.cuh"
#include "slimserve/int4/moe.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

/// The alignment's outputs (all in the workspace).
struct MoeRoutingView {
  const std::int32_t* topk_ids;  ///< [P]
  std::int32_t* pair_keys;       ///< [P]
  std::int32_t* pair_ids;        ///< [P]
  std::int32_t* sorted_keys;     ///< [P]
  std::int32_t* sorted_pairs;    ///< [P]
  std::int32_t* expert_start;    ///< [E + 1]
  std::int32_t* tile_count;      ///< [E + 1]
  std::int32_t* tile_offset;     ///< [E + 1]
  std::int32_t* tile_expert;     ///< [max_tiles]
  std::int32_t* tile_rows;       ///< [max_tiles * moe_tile_rows]
  MoeRoutingStatusWord* status;  ///< [1] the device-side id check
  int pairs;                     ///< P = T * top_k
  int experts;                   ///< E
  int max_tiles;
};

namespace detail {

SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE int tiles_for_rows(int rows) {
  return (rows + moe_tile_rows - 1) / moe_tile_rows;
}

/// First index in sorted[0, count) whose value is >= value.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE int lower_bound(const std::int32_t* sorted, int count,
                                                       int value) {
  int low = 0;
  int high = count;
  while (low < high) {
    const int mid = (low + high) / 2;
    if (sorted[mid] < value) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low;
}

}  // namespace detail

/// Device method, step 1: keys (the expert, E for an out-of-range id: sorted last and never
/// multiplied) and values (the pair index) for the radix sort.
__global__ void moe_pair_keys_kernel(const MoeRoutingView r) {
  const int stride = static_cast<int>(gridDim.x * blockDim.x);
  for (int p = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); p < r.pairs; p += stride) {
    const std::int32_t id = r.topk_ids[p];
    r.pair_keys[p] = id >= 0 && id < r.experts ? id : r.experts;
    r.pair_ids[p] = p;
  }
}

/// Device method, step 3 (after the sort): where each expert's pairs start in the sorted
/// order, and its row tiles (binary search: no atomics, the same result every run).
__global__ void moe_expert_ranges_kernel(const MoeRoutingView r) {
  const int stride = static_cast<int>(gridDim.x * blockDim.x);
  for (int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); e <= r.experts; e += stride) {
    const int start = detail::lower_bound(r.sorted_keys, r.pairs, e);
    r.expert_start[e] = start;
    const int end = e < r.experts ? detail::lower_bound(r.sorted_keys, r.pairs, e + 1) : start;
    r.tile_count[e] = detail::tiles_for_rows(end - start);  // 0 for the invalid bucket E
  }
}

/// Step 5 (after the scan of tile_count into tile_offset): each tile's expert and rows; rows
/// past an expert's count and tiles past the used ones hold the padding pair P.
/// The first thread also writes the status word: the invalid bucket (key E) holds the pairs
/// with out-of-range ids, after the valid ones and in pair order (the sort is stable).
__global__ void moe_fill_tiles_kernel(const MoeRoutingView r) {
  const int used = r.tile_offset[r.experts];
  const int stride = static_cast<int>(gridDim.x * blockDim.x);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const int valid = r.expert_start[r.experts];
    MoeRoutingStatusWord word{r.pairs - valid, -1, 0, 0};
    if (word.invalid_pairs > 0) {
      word.first_invalid = r.sorted_pairs[valid];
      word.first_id = r.topk_ids[word.first_invalid];
    }
    *r.status = word;
  }
  for (int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); t < r.max_tiles; t += stride) {
    int expert = -1;
    if (t < used) {
      // the last expert whose first tile is <= t (experts with no tiles share offsets)
      expert = detail::lower_bound(r.tile_offset, r.experts + 1, t + 1) - 1;
    }
    r.tile_expert[t] = expert;
    for (int i = 0; i < moe_tile_rows; ++i) {
      std::int32_t pair = r.pairs;
      if (expert >= 0) {
        const int index = (t - r.tile_offset[expert]) * moe_tile_rows + i;
        const int count = r.expert_start[expert + 1] - r.expert_start[expert];
        if (index < count) pair = r.sorted_pairs[r.expert_start[expert] + index];
      }
      r.tile_rows[t * moe_tile_rows + i] = pair;
    }
  }
}

/// The serial method (the emulator's, and a GPU reference for CUB): one thread does what
/// the keys kernel, the radix sort, the ranges kernel and the scan do, with a stable
/// counting sort; the fill kernel then runs as for the device method.
__global__ void moe_align_serial_kernel(const MoeRoutingView r) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  for (int e = 0; e <= r.experts; ++e) r.expert_start[e] = 0;
  for (int p = 0; p < r.pairs; ++p) {  // counts, one entry to the right: a scan makes starts
    const std::int32_t id = r.topk_ids[p];
    const int key = id >= 0 && id < r.experts ? id : r.experts;
    r.pair_keys[p] = key;
    r.pair_ids[p] = p;
    if (key < r.experts) ++r.expert_start[key + 1];
  }
  for (int e = 0; e < r.experts; ++e) r.expert_start[e + 1] += r.expert_start[e];
  // Stable scatter; tile_count serves as the per-expert cursor until it is overwritten below.
  // The invalid bucket (key E) follows the valid pairs, as in the radix-sorted keys.
  for (int e = 0; e < r.experts; ++e) r.tile_count[e] = r.expert_start[e];
  int invalid_cursor = r.expert_start[r.experts];
  for (int p = 0; p < r.pairs; ++p) {
    const int key = r.pair_keys[p];
    const int at = key < r.experts ? r.tile_count[key]++ : invalid_cursor++;
    r.sorted_pairs[at] = p;
    r.sorted_keys[at] = key;
  }
  int offset = 0;
  for (int e = 0; e <= r.experts; ++e) {
    const int count = e < r.experts ? r.expert_start[e + 1] - r.expert_start[e] : 0;
    r.tile_count[e] = detail::tiles_for_rows(count);
    r.tile_offset[e] = offset;
    offset += r.tile_count[e];
  }
}

/// Kernel parameters of the grouped GEMM.
struct MoeGemmParams {
  const std::uint16_t* a;        ///< gate_up: [T, k]; down: [P, k]
  const std::uint32_t* b;        ///< [E][k/16, n/16, 32]
  const std::uint16_t* scales;   ///< [E][k/group, n]
  const std::uint16_t* zeros;    ///< [E][k/group, n] or null
  const float* topk_weights;     ///< [P] (down)
  const std::int32_t* tile_expert;  ///< [max_tiles]
  const std::int32_t* tile_rows;    ///< [max_tiles * 16]
  const std::int32_t* tiles_used;   ///< [1]: tile_offset[E]
  std::uint16_t* c;              ///< gate_up: [P, n/2]
  float* partials;               ///< down: [P, n]
  std::int64_t expert_words;     ///< packed words per expert: k/16 * n/16 * 32
  std::int64_t expert_scales;    ///< scale entries per expert: k/group * n
  int pairs;
  int top_k;
  int k;
  int n;
  int group_shift;
};

/// Column map of the fused gate+up: the block's even 16-column tiles are the gate's, the odd
/// ones the up projection's, of the same intermediate columns (so one lane holds a gate value
/// and its up value in the same registers slots of neighbouring tiles).
struct GateUpColumns {
  int first_tile;   ///< the block's first intermediate tile (blockIdx.x * block_n / 32)
  int half_tiles;   ///< (n / 2) / 16
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE int tile(int v) const {
    return (v % 2 == 0 ? 0 : half_tiles) + first_tile + v / 2;
  }
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE bool valid(int v) const {
    return first_tile + v / 2 < half_tiles;
  }
};

SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE float silu(float x) { return x / (1.0f + expf(-x)); }

/// One block: one row tile (up to 16 pairs of one expert) x one column tile.
template <class T, class Config, GroupSpan Span, MoeEpilogue Epilogue>
__global__ void __launch_bounds__(Config::threads) moe_w4a16_kernel(const __grid_constant__ MoeGemmParams p) {
  static_assert(Config::block_m == moe_tile_rows, "the alignment pads experts to the tile's M");
  static_assert(Config::m16_per_warp == 1 && Config::warps_m == 1, "one m16 row tile per block");
  static_assert(Epilogue != MoeEpilogue::gate_up_silu || Config::n16_per_warp % 2 == 0,
                "gate+up pairs a warp's even and odd 16-column tiles");
  const int tile = static_cast<int>(blockIdx.y);
  if (tile >= *p.tiles_used) return;  // tiles past the routing's: nothing to do
  using Storage = GemmSharedStorage<Config, Span>;
  Storage& smem = rt::shared_storage<Storage>();

  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_col = (warp % Config::warps_n) * Config::warp_n;
  const int expert = p.tile_expert[tile];
  const std::int32_t* rows = p.tile_rows + static_cast<std::int64_t>(tile) * moe_tile_rows;

  TileSources<Config> src;
  SLIMSERVE_INT4_UNROLL
  for (int i = 0; i < TileSources<Config>::a_per_thread; ++i) {
    const int pair = rows[(static_cast<int>(threadIdx.x) + i * Config::threads) / 8];
    const int a_row = Epilogue == MoeEpilogue::gate_up_silu ? pair / p.top_k : pair;
    src.a_row[i] = pair < p.pairs ? p.a + static_cast<std::int64_t>(a_row) * p.k : nullptr;
  }
  src.a_row_fallback = p.a;
  src.b = p.b + expert * p.expert_words;
  src.scales = p.scales + expert * p.expert_scales;
  src.zeros = p.zeros == nullptr ? nullptr : p.zeros + expert * p.expert_scales;
  src.n = p.n;
  src.k_begin = 0;
  src.k_end = p.k;
  src.group_shift = p.group_shift;

  WarpAccumulators<Config> acc = {};
  if constexpr (Epilogue == MoeEpilogue::gate_up_silu) {
    const GateUpColumns columns{static_cast<int>(blockIdx.x) * Config::n16_per_block / 2,
                                p.n / 2 / gemm_layout::tile_n};
    w4a16_mainloop<T, Config, Span>(smem, src, columns, 0, warp_col, acc);
    const int half_n = p.n / 2;
    SLIMSERVE_INT4_UNROLL
    for (int j = 0; j < Config::n16_per_warp; j += 2) {
      const int v = warp_col / 16 + j;  // the gate tile; v + 1 is its up tile
      SLIMSERVE_INT4_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int col = (columns.first_tile + v / 2) * 16 + h * 8 + (lane % 4) * 2;
        if (col >= half_n) continue;
        SLIMSERVE_INT4_UNROLL
        for (int half = 0; half < 2; ++half) {
          const int pair = rows[lane / 4 + half * 8];
          if (pair >= p.pairs) continue;
          std::uint16_t* out = p.c + static_cast<std::int64_t>(pair) * half_n + col;
          SLIMSERVE_INT4_UNROLL
          for (int e = 0; e < 2; ++e) {
            const float gate = acc[0][2 * j + h][2 * half + e];
            const float up = acc[0][2 * (j + 1) + h][2 * half + e];
            out[e] = from_float<T>(silu(gate) * up).bits;
          }
        }
      }
    }
  } else {
    const int n0 = static_cast<int>(blockIdx.x) * Config::block_n;
    const DenseColumns columns{n0 / gemm_layout::tile_n, p.n / gemm_layout::tile_n};
    w4a16_mainloop<T, Config, Span>(smem, src, columns, 0, warp_col, acc);
    SLIMSERVE_INT4_UNROLL
    for (int j = 0; j < 2 * Config::n16_per_warp; ++j) {
      const int col = n0 + warp_col + j * 8 + (lane % 4) * 2;
      if (col >= p.n) continue;
      SLIMSERVE_INT4_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int pair = rows[lane / 4 + half * 8];
        if (pair >= p.pairs) continue;
        const float weight = p.topk_weights[pair];  // the router weight, applied here only
        float* out = p.partials + static_cast<std::int64_t>(pair) * p.n + col;
        out[0] = weight * acc[0][j][2 * half];
        out[1] = weight * acc[0][j][2 * half + 1];
      }
    }
  }
}

/// c[token, j] = round(sum over slots, in slot order, of partials[token * top_k + slot, j]);
/// pairs whose expert id was out of range add nothing.
template <class T>
__global__ void moe_combine_kernel(const float* __restrict__ partials,     // [P, n]
                                   const std::int32_t* __restrict__ topk_ids,  // [P]
                                   std::uint16_t* __restrict__ c,          // [T, n]
                                   std::int64_t tokens, int top_k, std::int64_t n, int experts) {
  const std::int64_t count = tokens * n;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride) {
    const std::int64_t token = i / n;
    const std::int64_t col = i % n;
    float sum = 0.0f;
    for (int slot = 0; slot < top_k; ++slot) {
      const std::int64_t pair = token * top_k + slot;
      const std::int32_t id = topk_ids[pair];
      if (id >= 0 && id < experts) sum += partials[pair * n + col];
    }
    c[i] = from_float<T>(sum).bits;
  }
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
