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

#include "slimserve/arch/l2_cache.cuh"
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

/// The dense kernel's tile sources: rows m0.., the weight's columns, one K slice.
template <class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE TileSources<Config> dense_tile_sources(const GemmParams& p,
                                                                             int m0, int k_begin,
                                                                             int k_end) {
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
  src.k_begin = k_begin;
  src.k_end = k_end;
  src.group_shift = p.group_shift;
  return src;
}

/// Calls f(i, j, half, tile_row, tile_col, row, col) for each pair of accumulators this thread
/// holds inside C: the mma fragment's c0, c1 sit at (row g, cols 2t, 2t+1), c2, c3 at row g + 8.
/// One walk for every epilogue (store, partials, in-place reduction), so they agree on layout.
template <class Config, class F>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void for_each_accumulator_pair(const GemmParams& p, int m0, int n0,
                                                                      F&& f) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_row = (warp / Config::warps_n) * Config::warp_m;
  const int warp_col = (warp % Config::warps_n) * Config::warp_n;
  SLIMSERVE_INT4_UNROLL
  for (int i = 0; i < Config::m16_per_warp; ++i) {
    SLIMSERVE_INT4_UNROLL
    for (int j = 0; j < 2 * Config::n16_per_warp; ++j) {
      const int tile_col = warp_col + j * 8 + (lane % 4) * 2;
      const int col = n0 + tile_col;
      if (col >= p.n) continue;
      SLIMSERVE_INT4_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int tile_row = warp_row + i * 16 + lane / 4 + half * 8;
        const int row = m0 + tile_row;
        if (row >= p.m) continue;
        f(i, j, half, tile_row, tile_col, row, col);
      }
    }
  }
}

/// Epilogue: adds the bias and rounds to T (`out` = C), or stores FP32 sums to `partial`
/// ([rows of the block tile][block_n] when `partial_row_stride` is block_n, or C's layout).
template <class T, class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void store_tile(const GemmParams& p,
                                                       const WarpAccumulators<Config>& acc, int m0,
                                                       int n0, float* partial,
                                                       std::int64_t partial_row_stride,
                                                       bool to_partial) {
  for_each_accumulator_pair<Config>(p, m0, n0, [&](int i, int j, int half, int tile_row, int tile_col,
                                                  int row, int col) {
    const float v0 = acc[i][j][2 * half];
    const float v1 = acc[i][j][2 * half + 1];
    if (to_partial) {
      float* out = partial + tile_row * partial_row_stride + tile_col;
      out[0] = v0;
      out[1] = v1;
    } else {
      const float b0 = p.bias != nullptr ? to_float(T::from_bits(p.bias[col])) : 0.0f;
      const float b1 = p.bias != nullptr ? to_float(T::from_bits(p.bias[col + 1])) : 0.0f;
      std::uint16_t* out = p.c + static_cast<std::int64_t>(row) * p.n + col;
      out[0] = from_float<T>(v0 + b0).bits;
      out[1] = from_float<T>(v1 + b1).bits;
    }
  });
}

/// Split-K schedule: grid (N tiles, M tiles, splits); each block one tile over one K slice.
/// Min blocks 1: ptxas may then keep the 256-column tile's per-group sums in registers
/// instead of spilling to fit more blocks per SM (weights stream; one block hides enough).
template <class T, class Config, GroupSpan Span>
__global__ void __launch_bounds__(Config::threads, 1) w4a16_gemm_kernel(const __grid_constant__ GemmParams p) {
  using Storage = GemmSharedStorage<Config, Span>;
  Storage& smem = rt::shared_storage<Storage>();
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int n0 = static_cast<int>(blockIdx.x) * Config::block_n;
  const int m0 = static_cast<int>(blockIdx.y) * Config::block_m;
  const int split = static_cast<int>(blockIdx.z);
  const int k_begin = split * p.k_per_split;
  const TileSources<Config> src =
      dense_tile_sources<Config>(p, m0, k_begin, detail::min_int(p.k, k_begin + p.k_per_split));
  const DenseColumns columns{n0 / gemm_layout::tile_n, p.n / gemm_layout::tile_n};
  WarpAccumulators<Config> acc = {};  // [m16_per_warp, 2 * n16_per_warp, 4]
  w4a16_mainloop<T, Config, Span>(smem, src, columns, (warp / Config::warps_n) * Config::warp_m,
                                  (warp % Config::warps_n) * Config::warp_n, acc);
  // [splits, m, n] partials, or C
  float* partial = p.splits > 1 ? p.partials + (static_cast<std::int64_t>(split) * p.m + m0) * p.n + n0
                                : nullptr;
  store_tile<T, Config>(p, acc, m0, n0, partial, p.n, p.splits > 1);
}

/// Division of a non-negative int by a fixed positive one with a multiply-high, an add and a
/// shift (Granlund-Montgomery, round-up multiplier): a 32-bit `/` by a runtime value is ~35
/// SASS instructions, which the stream-K loop would pay twice per segment. Exact for
/// 0 <= n < 2^31 and 1 <= divisor < 2^31 (tested against `/` in stream_k_reduce_test).
struct FastDivisor {
  int divisor;
  unsigned multiplier;  ///< floor(2^32 * (2^shift - divisor) / divisor) + 1
  unsigned shift;       ///< ceil(log2(divisor))

  static FastDivisor make(int divisor) {
    FastDivisor d{divisor, 0, 0};
    while ((std::uint64_t{1} << d.shift) < static_cast<std::uint64_t>(divisor)) ++d.shift;
    d.multiplier = static_cast<unsigned>(
        ((std::uint64_t{1} << 32) * ((std::uint64_t{1} << d.shift) - static_cast<std::uint64_t>(divisor))) /
            static_cast<std::uint64_t>(divisor) +
        1);
    return d;
  }
  /// n / divisor for 0 <= n < 2^31 (the sum below cannot wrap: the high product is <= n).
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE int divide(int n) const {
    const auto u = static_cast<unsigned>(n);
    return static_cast<int>((__umulhi(u, multiplier) + u) >> shift);
  }
};

/// Stream-K schedule (persistent): the (tile, 64-row step) units of the whole problem, tile
/// after tile, are dealt out in equal contiguous ranges to `blocks` blocks. A block writes a
/// tile it covers completely straight to C; its first and last tiles may be shared with its
/// neighbours. A shared tile is reduced in place by the last of its blocks to finish it (see
/// `reduce_shared_tile`): the others leave their FP32 sums in a slot (two per block: its
/// first and its last tile) and count themselves on the tile's arrival counter.
struct StreamKSchedule {
  int units;            ///< tiles * k_steps (< 2^31, checked by the plan)
  int blocks;
  int k_steps;
  int tiles_n;
  int units_per_block;  ///< units / blocks; the first `remainder` blocks take one more
  int remainder;        ///< units % blocks
  FastDivisor by_k_steps;  ///< unit -> tile
  FastDivisor by_tiles_n;  ///< tile -> M tile
  // 32-bit arithmetic only: a 64-bit division is a call with a stack frame on the GPU.
  SLIMSERVE_HOST_DEVICE int first_unit(int block) const {
    return block * units_per_block + (block < remainder ? block : remainder);
  }
};

/// Stream-K workspace: FP32 slots [2 * blocks][block_m * block_n] (128-byte aligned: they are
/// discarded from L2 by whole lines) and one arrival counter per tile (zeroed by `run_gemm`
/// before the launch).
struct StreamKWorkspace {
  float* partials;
  unsigned* arrivals;  ///< [tiles]
};

/// A segment's FP32 sums into its slot ([block_m][block_n]), kept in L2 (evict-last) until
/// the tile's reducer has read them: they live for one launch only. The policy is made here
/// (one instruction) rather than once per kernel, so no 64-bit register stays live across
/// the mainloop.
template <class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void store_partial_slot(const GemmParams& p,
                                                               const WarpAccumulators<Config>& acc,
                                                               int m0, int n0, float* slot) {
  const std::uint64_t keep = arch::l2_evict_last_policy();
  for_each_accumulator_pair<Config>(p, m0, n0, [&](int i, int j, int half, int tile_row, int tile_col,
                                                  int, int) {
    arch::store_f32x2_l2_hint(slot + tile_row * Config::block_n + tile_col, acc[i][j][2 * half],
                              acc[i][j][2 * half + 1], keep);
  });
}

/// After the reducer has read a tile's slots: drops their L2 lines without a write-back
/// (`discard.global.L2`), so partials that stayed in L2 never reach DRAM. Only the rows
/// inside C (< m - m0) were written; `skipped` (a block index, or -1) never stored its slot.
/// The caller's barrier orders every thread's reads before the discards.
template <class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void discard_tile_slots(const GemmParams& p,
                                                               const StreamKWorkspace& workspace,
                                                               int first, int first_slot, int last,
                                                               int skipped, int m0) {
  constexpr int floats_per_line = arch::l2_line_bytes / static_cast<int>(sizeof(float));
  static_assert(Config::block_n % floats_per_line == 0, "a slot row is whole L2 lines");
  constexpr std::int64_t tile_elements = Config::block_m * Config::block_n;
  const int lines = detail::min_int(Config::block_m, p.m - m0) * (Config::block_n / floats_per_line);
  for (int b = first; b <= last; ++b) {
    if (b == skipped) continue;
    float* slot = workspace.partials +
                  static_cast<std::int64_t>(b == first ? first_slot : 2 * b) * tile_elements;
    for (int line = static_cast<int>(threadIdx.x); line < lines; line += Config::threads) {
      arch::discard_l2_line(slot + line * floats_per_line);
    }
  }
}

/// The epilogue of a block's segment of a tile that several blocks share, without a second
/// launch and without waiting on another block. A block that is not the last to finish the
/// tile stores its FP32 sums in its slot, fences, and counts itself on the tile's counter; the
/// last one (it sees every other block counted, before or after storing) sums the tile's
/// segments in block order, its own from registers, adds the bias and rounds once. The order
/// of the sum is fixed by block index, never by who arrives last: bit-identical run to run.
/// The last block seldom stores at all: the block holding a tile's first steps finishes it at
/// the end of its range, long after the block holding its last steps started with it.
/// The slots are stored L2 evict-last and discarded from L2 once summed: they are meant never
/// to reach DRAM (docs/int4-gemm.md, "Partials in L2").
template <class T, class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void reduce_shared_tile(
    const GemmParams& p, const StreamKSchedule& schedule, const StreamKWorkspace& workspace,
    const WarpAccumulators<Config>& acc, int block, int tile, int m0, int n0) {
  constexpr std::int64_t tile_elements = Config::block_m * Config::block_n;
  // The tile's blocks, first .. last, found by walking from this one (a tile has a few; no
  // division). Every block but the first starts inside the tile, so the tile is its first
  // (slot 2b); the first block's slot is 2b unless it started in an earlier tile.
  const int tile_begin = tile * schedule.k_steps;
  const int tile_end = tile_begin + schedule.k_steps;
  int first = block;
  while (schedule.first_unit(first) > tile_begin) --first;
  int last = block;
  while (last + 1 < schedule.blocks && schedule.first_unit(last + 1) < tile_end) ++last;
  const int first_slot = schedule.first_unit(first) == tile_begin ? 2 * first : 2 * first + 1;
  const int my_slot = block == first ? first_slot : 2 * block;
  const unsigned others = static_cast<unsigned>(last - first);
  unsigned* arrivals = workspace.arrivals + tile;
  const bool leader = threadIdx.x == 0;
  // The decode tile (16 FP32 sums per warp column tile) sums from registers; the wide tile
  // (64 per thread) always stores first and sums from memory, or ptxas spills the sums.
  // Only the decode tile keeps its slots in L2 (evict-last, discarded once summed): the wide
  // tile is issue-bound, so DRAM bytes do not set its time, and the L2 code cost its mainloop
  // ~2% more instructions (ptxas allocates it differently; docs/int4-gemm.md).
  constexpr bool from_registers = Config::m16_per_warp == 1;
  // Every other block has counted itself (and so stored): no need to store this segment.
  bool reduce = from_registers &&
                __syncthreads_or(leader && atomicAdd(arrivals, 0u) == others) != 0;
  const int unstored = reduce ? block : -1;  // the early reducer's own slot holds nothing
  if (!reduce) {
    float* slot = workspace.partials + static_cast<std::int64_t>(my_slot) * tile_elements;
    if constexpr (from_registers) {
      store_partial_slot<Config>(p, acc, m0, n0, slot);
    } else {
      store_tile<T, Config>(p, acc, m0, n0, slot, Config::block_n, true);
    }
    __threadfence();  // the stores are visible before the count
    reduce = __syncthreads_or(leader && atomicAdd(arrivals, 1u) == others) != 0;
    if (!reduce) return;
  }
  __threadfence();  // the others' stores (before their counts) are visible to the loads below
  if constexpr (!from_registers) {
    // Every segment is in its slot: a flat pass over the tile, no accumulator registers live.
    for (int e = static_cast<int>(threadIdx.x); e < Config::block_m * Config::block_n;
         e += Config::threads) {
      const int row = m0 + e / Config::block_n;
      const int col = n0 + e % Config::block_n;
      if (row >= p.m || col >= p.n) continue;
      float sum = 0.0f;
      for (int b = first; b <= last; ++b) {
        sum += __ldcg(workspace.partials +
                      static_cast<std::int64_t>(b == first ? first_slot : 2 * b) * tile_elements + e);
      }
      if (p.bias != nullptr) sum += to_float(T::from_bits(p.bias[col]));
      p.c[static_cast<std::int64_t>(row) * p.n + col] = from_float<T>(sum).bits;
    }
    return;
  }
  for_each_accumulator_pair<Config>(p, m0, n0, [&](int i, int j, int half, int tile_row, int tile_col,
                                                  int row, int col) {
    // sum = segment(first) + ... + segment(last), in block order whoever reduces.
    const float* slot_pair = workspace.partials + tile_row * Config::block_n + tile_col;
    float sum[2] = {0.0f, 0.0f};
    for (int b = first; b <= last; ++b) {
      const float* from =
          slot_pair + static_cast<std::int64_t>(b == first ? first_slot : 2 * b) * tile_elements;
      SLIMSERVE_INT4_UNROLL
      for (int e = 0; e < 2; ++e) {
        sum[e] += b == block ? acc[i][j][2 * half + e] : __ldcg(from + e);
      }
    }
    std::uint16_t* out = p.c + static_cast<std::int64_t>(row) * p.n + col;
    SLIMSERVE_INT4_UNROLL
    for (int e = 0; e < 2; ++e) {
      const float bias = p.bias != nullptr ? to_float(T::from_bits(p.bias[col + e])) : 0.0f;
      out[e] = from_float<T>(sum[e] + bias).bits;
    }
  });
  __syncthreads();  // every thread's loads are done before any line is discarded
  discard_tile_slots<Config>(p, workspace, first, first_slot, last, unstored, m0);
}

/// One segment of a stream-K block: the steps [step_begin, step_end) of one tile.
struct StreamKSegment {
  int tile;
  int step_begin;
  int step_end;
  int m0;
  int n0;
};

/// The segment that starts at `unit` in a block whose range ends at `end`.
template <class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE StreamKSegment stream_k_segment(const StreamKSchedule& schedule,
                                                                       int unit, int end) {
  // The decode tile divides with FastDivisor (two `/` of ~35 instructions each per segment
  // would undo what its L2 partials save); the wide tile keeps `/`: with the multiply-high
  // ptxas allocated its mainloop ~2% worse (sm_90a SASS report).
  constexpr bool fast = Config::m16_per_warp == 1;
  StreamKSegment segment;
  segment.tile = fast ? schedule.by_k_steps.divide(unit) : unit / schedule.k_steps;
  segment.step_begin = unit - segment.tile * schedule.k_steps;
  segment.step_end = detail::min_int(schedule.k_steps, segment.step_begin + (end - unit));
  const int tile_m = fast ? schedule.by_tiles_n.divide(segment.tile) : segment.tile / schedule.tiles_n;
  segment.m0 = tile_m * Config::block_m;
  segment.n0 = (segment.tile - tile_m * schedule.tiles_n) * Config::block_n;
  return segment;
}

/// The copies of a persistent block's whole unit range, one pipeline for all its segments:
/// the copy that reaches the next segment moves the loader to it and issues its first stage,
/// so the next segment's first stages are in flight while the block still computes (and
/// reduces) the current one — the pipeline fills once per block and never drains between
/// segments. Pipeline steps are counted from the block's first unit (one unit per step).
/// Only for the decode tile, whose grid has one row tile (m <= block_m, checked by the
/// launcher): every segment after a block's first starts at step 0 of the next column tile.
template <class Config, GroupSpan Span>
struct StreamKLoader {
  using Loader = detail::StageLoader<Config, Span, detail::contiguous_columns_v<DenseColumns>>;
  using Stage = typename GemmSharedStorage<Config, Span>::Stage;

  int next_segment;  ///< pipeline step where the segment after the one being loaded starts
  int units_left;    ///< units of the block after the segment being loaded
  int first_tile;    ///< first 16-column tile of the segment being loaded
  Loader loader;

  /// Ready to copy `first`, the block's first segment (of `units` in all), from step 0.
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE StreamKLoader(const GemmParams& p,
                                                       const StreamKSegment& first, int units)
      : next_segment(first.step_end - first.step_begin),
        units_left(units - (first.step_end - first.step_begin)),
        first_tile(first.n0 / gemm_layout::tile_n),
        loader(dense_tile_sources<Config>(p, first.m0, first.step_begin * Config::block_k,
                                          detail::min_int(p.k, first.step_end * Config::block_k)),
               DenseColumns{first.n0 / gemm_layout::tile_n, p.n / gemm_layout::tile_n}) {}

  /// Issues pipeline step `step` (> 0, every step in order; step 0 is `load_first`) into
  /// `stage`, or nothing once the block's range is loaded (then every later step lands in
  /// the first branch and finds nothing left: one test per step in all).
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void load(const GemmParams& p,
                                                   const StreamKSchedule& schedule, int step,
                                                   Stage& stage) {
    if (step == next_segment) {  // the loaded segment is done: the next tile starts here
      if (units_left == 0) {
        next_segment = step + 1;
        return;
      }
      const int steps = detail::min_int(schedule.k_steps, units_left);
      units_left -= steps;
      next_segment = step + steps;
      first_tile += Config::n16_per_block;
      loader.advance_to_next_tile(schedule.k_steps, first_tile, p.n / gemm_layout::tile_n,
                                  detail::min_int(p.k, steps * Config::block_k));
      loader.template load<true>(stage);
    } else {
      loader.load(stage);
    }
  }
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void load_first(Stage& stage) {
    loader.template load<true>(stage);
  }
};

/// A segment's epilogue: straight to C when the block covered the whole tile, else the
/// in-place reduction of the shared tile.
template <class T, class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void finish_segment(const GemmParams& p,
                                                           const StreamKSchedule& schedule,
                                                           const StreamKWorkspace& workspace,
                                                           const WarpAccumulators<Config>& acc,
                                                           int block,
                                                           const StreamKSegment& segment) {
  if (segment.step_begin == 0 && segment.step_end == schedule.k_steps) {
    store_tile<T, Config>(p, acc, segment.m0, segment.n0, nullptr, 0, false);
  } else {
    reduce_shared_tile<T, Config>(p, schedule, workspace, acc, block, segment.tile, segment.m0,
                                  segment.n0);
  }
}

/// Min blocks 1, as the split-K kernel: the 64 x 128 group-16 BF16 tile spilled at ptxas's
/// default register target.
///
/// The decode tile runs one cp.async pipeline over the block's whole unit range
/// (`StreamKLoader`): a segment's epilogue runs while the next segment's first
/// `stages - 1` steps are already in flight, so the block waits for DRAM once, at its start,
/// not once per segment (the epilogue touches no shared memory, so the stages in flight are
/// safe). The wide tile (issue-bound; its epilogue a flat pass over the slots) keeps a
/// pipeline per segment: the longer-lived loader cost it registers and ~4% more instructions.
template <class T, class Config, GroupSpan Span>
__global__ void __launch_bounds__(Config::threads, 1) w4a16_gemm_stream_k_kernel(
    const __grid_constant__ GemmParams p, const __grid_constant__ StreamKSchedule schedule,
    const __grid_constant__ StreamKWorkspace workspace) {
  using Storage = GemmSharedStorage<Config, Span>;
  Storage& smem = rt::shared_storage<Storage>();
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_row = (warp / Config::warps_n) * Config::warp_m;
  const int warp_col = (warp % Config::warps_n) * Config::warp_n;
  const int block = static_cast<int>(blockIdx.x);
  const int begin = schedule.first_unit(block);
  const int end = schedule.first_unit(block + 1);
  if constexpr (Config::m16_per_warp == 1) {
    if (begin >= end) return;  // the plan gives every block a unit
    StreamKSegment segment = stream_k_segment<Config>(schedule, begin, end);
    StreamKLoader<Config, Span> copies(p, segment, end - begin);  // one 64-row step per unit
    copies.load_first(smem.stages[0]);
    arch::cp_async_commit();
    // Not unrolled: each copy may start a segment, a large body to repeat stages - 2 times.
    SLIMSERVE_INT4_NO_UNROLL
    for (int s = 1; s < Config::stages - 1; ++s) {
      copies.load(p, schedule, s, smem.stages[s]);
      arch::cp_async_commit();
    }
    auto refill = [&](int step) {
      copies.load(p, schedule, step, smem.stages[detail::stage_index<Config>(step)]);
    };
    const bool has_zeros = p.zeros != nullptr;
    for (int unit = begin; unit < end;) {
      const int steps = segment.step_end - segment.step_begin;
      WarpAccumulators<Config> acc = {};
      detail::consume_slice<T, Config, Span>(smem, unit - begin, steps, segment.step_begin,
                                             p.group_shift, has_zeros, warp_row, warp_col,
                                             refill, acc);
      finish_segment<T, Config>(p, schedule, workspace, acc, block, segment);
      unit += steps;
      if (unit < end) segment = stream_k_segment<Config>(schedule, unit, end);
    }
    arch::cp_async_wait<0>();
  } else {
    for (int unit = begin; unit < end;) {
      const StreamKSegment segment = stream_k_segment<Config>(schedule, unit, end);
      const TileSources<Config> src = dense_tile_sources<Config>(
          p, segment.m0, segment.step_begin * Config::block_k,
          detail::min_int(p.k, segment.step_end * Config::block_k));
      const DenseColumns columns{segment.n0 / gemm_layout::tile_n, p.n / gemm_layout::tile_n};
      __syncthreads();  // the previous tile's last stage has been read by every warp
      WarpAccumulators<Config> acc = {};
      w4a16_mainloop<T, Config, Span>(smem, src, columns, warp_row, warp_col, acc);
      finish_segment<T, Config>(p, schedule, workspace, acc, block, segment);
      unit += segment.step_end - segment.step_begin;
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
