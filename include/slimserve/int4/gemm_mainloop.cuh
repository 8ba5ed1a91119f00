#pragma once
/// \file
/// \brief The W4A16 mainloop shared by the dense GEMM and the grouped (MoE) GEMM: a
/// multi-stage cp.async pipeline over 64-row K steps, B fragments read with ldmatrix, scales
/// and zero points turned into dequantization constants once per group, mma.sync m16n8k16
/// with FP32 accumulation.
///
/// What a kernel supplies is where its tile's data lives (`TileSources`): one pointer per A
/// row (rows may be gathered, as MoE tokens are; null rows read as zeros), the weight
/// matrix's base (an expert's, for MoE) and a column map (MoE gate+up interleaves the gate's
/// and the up projection's 16-column tiles). Everything else is the same code.
///
/// Steady-state costs that this file is arranged around (per warp, per 64-row stage):
/// - every address is computed once per tile; a step adds one stride per pointer;
/// - one `ldmatrix.x4` gives a lane its packed words of all four 16-row tiles of one 16-column
///   tile (row r of matrix q = 16 bytes of k-tile q: lane l receives word l of tile q, exactly
///   its fragment word), so B costs one shared load per 16 columns per stage, not four;
/// - the group is a shift (`group_shift`, no division), and the scale/zero constants are made
///   only when a group starts: once per stage or less for groups >= 64, per 32 or 16 rows for
///   groups 32 and 16 (the `GroupSpan` key, a compile-time dispatch key);
/// - the K tail needs no skip: A past the slice end is zero-filled, and a zero times a finite
///   weight adds nothing.

#include <cstddef>
#include <cstdint>
#include <cstring>
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
#define SLIMSERVE_INT4_NO_UNROLL _Pragma("unroll 1")
#else
#define SLIMSERVE_INT4_UNROLL
#define SLIMSERVE_INT4_NO_UNROLL
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

/// How many K rows one set of scale/zero constants covers inside a 64-row stage: groups of
/// 16 and 32 change inside a stage; every larger power of two (and per-channel) at most once
/// per stage. A compile-time key: the reload points are then static.
enum class GroupSpan : std::uint8_t { k16 = 16, k32 = 32, stage = 64 };

constexpr GroupSpan group_span_of(std::int64_t group_size) {
  return group_size == 16 ? GroupSpan::k16 : group_size == 32 ? GroupSpan::k32 : GroupSpan::stage;
}

/// A thread-block tile shape. block_k is fixed at 64 (one stage).
template <int BlockM, int BlockN, int WarpsM, int WarpsN, int Stages, bool EvictFirstB>
struct GemmTileConfig {
  static constexpr int block_m = BlockM;
  static constexpr int block_n = BlockN;
  static constexpr int block_k = 64;
  static constexpr int warps_m = WarpsM;
  static constexpr int warps_n = WarpsN;
  static constexpr int stages = Stages;
  /// Weights read once per launch (one M tile) are marked evict-first in L2.
  static constexpr bool evict_first_b = EvictFirstB;
  static constexpr int threads = WarpsM * WarpsN * 32;
  static constexpr int warp_m = BlockM / WarpsM;
  static constexpr int warp_n = BlockN / WarpsN;
  static constexpr int m16_per_warp = warp_m / 16;
  static constexpr int n16_per_warp = warp_n / 16;
  static constexpr int k16_per_block = block_k / 16;
  static constexpr int n16_per_block = block_n / 16;

  static_assert(warp_m % 16 == 0 && warp_n % 16 == 0, "warp tiles are made of 16x16 tiles");
  static_assert(Stages >= 2, "a pipeline needs at least two stages");
  static_assert(k16_per_block == 4, "one ldmatrix.x4 reads the four k16 tiles of a stage");
};

template <GroupSpan Span>
inline constexpr int scale_rows_per_stage = 64 / static_cast<int>(Span);

/// Where a tile applies the group scales (gemm_layout.hpp, GroupScaling). Per group sum needs
/// a second set of accumulators, so only tiles with one 16-row A tile per warp (the decode
/// tile, the MoE tile) and groups spanning whole stages take it: there it replaces 4 FP16x2
/// multiplies per packed word (a quarter of the dequantization) with 16 FP32 FMAs per warp per
/// group.
template <class Config, GroupSpan Span>
inline constexpr GroupScaling group_scaling_of =
    Span == GroupSpan::stage && Config::m16_per_warp == 1 ? GroupScaling::per_group_sum
                                                          : GroupScaling::per_weight;

/// Shared memory of one thread block; the launch asks for exactly sizeof of this.
template <class Config, GroupSpan Span>
struct GemmSharedStorage {
  static constexpr int scale_rows = scale_rows_per_stage<Span>;
  struct Stage {
    // [block_m, block_k], 16-byte chunks XOR-swizzled by row % 8 so ldmatrix is conflict-free
    alignas(128) std::uint16_t a[Config::block_m * Config::block_k];
    // [block_k/16, block_n/16, 32]: the packed words, in the global order
    alignas(128) std::uint32_t b[Config::k16_per_block * Config::n16_per_block * 32];
    alignas(16) std::uint16_t scales[scale_rows * Config::block_n];  // [scale_rows, block_n]
    alignas(16) std::uint16_t zeros[scale_rows * Config::block_n];   // [scale_rows, block_n]
  };
  Stage stages[Config::stages];
};

/// Where one tile's operands live; built once per tile by the kernel.
template <class Config>
struct TileSources {
  static constexpr int a_chunks = Config::block_m * Config::block_k / 8;
  static constexpr int a_per_thread = a_chunks / Config::threads;
  static_assert(a_chunks % Config::threads == 0, "A chunks spread evenly over the threads");

  /// A row `row` of the tile at column 0 of the matrix; null: the row is absent (zeros).
  const std::uint16_t* a_row[a_per_thread];
  const std::uint16_t* a_row_fallback;  ///< any readable row of A (the address of absent rows)
  const std::uint32_t* b;       ///< the weight matrix's packed words [k/16, n/16, 32]
  const std::uint16_t* scales;  ///< [k/group, n]
  const std::uint16_t* zeros;   ///< [k/group, n] or null (z = 8)
  int n;                        ///< the weight matrix's columns
  int k_begin;                  ///< first row of this tile's K slice (a multiple of 64)
  int k_end;                    ///< one past its last row
  int group_shift;              ///< group = row >> group_shift (31: per-channel)
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

/// acc = A . B (the accumulator's old value ignored: a zero addend, no zeroing instructions).
template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void mma_16816_fresh(float (&acc)[4],
                                                            const std::uint32_t (&a)[4],
                                                            const std::uint32_t (&b)[2]) {
  const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if constexpr (std::is_same_v<T, bf16>) {
    arch::mma_m16n8k16_bf16(acc, a, b, zero);
  } else {
    arch::mma_m16n8k16_fp16(acc, a, b, zero);
  }
}

/// Element offset of (row, col) in a stage's swizzled A tile.
template <class Config>
SLIMSERVE_HOST_DEVICE constexpr int a_tile_offset(int row, int col) {
  const int chunk = (col / 8) ^ (row % 8);
  return row * Config::block_k + chunk * 8 + col % 8;
}

/// Whether a column map keeps the block's 16-column tiles adjacent in the weight matrix
/// (`static constexpr bool contiguous = true`): then a k16 row of the block's B is one run.
template <class ColumnMap>
inline constexpr bool contiguous_columns_v = requires { requires ColumnMap::contiguous; };

/// The thread's share of one stage's copies, with every address computed once per tile.
/// `ColumnMap::tile(v)` maps the block's v-th 16-column tile to a tile of the weight matrix
/// (identity for dense GEMMs), `ColumnMap::valid(v)` says whether it exists.
///
/// B: each thread copies chunks of one k16 row (a quarter of the threads per row), so all
/// its chunks share one row predicate; with `ContiguousB` (dense) they are at static offsets
/// from one pointer, and a step moves one pointer instead of one per chunk.
template <class Config, GroupSpan Span, bool ContiguousB = false>
struct StageLoader {
  using Sources = TileSources<Config>;
  using Stage = typename GemmSharedStorage<Config, Span>::Stage;
  static constexpr int a_per_thread = Sources::a_per_thread;
  static constexpr int b_chunks_per_k16 = Config::n16_per_block * 8;  // 16-byte chunks
  static constexpr int b_chunks = Config::k16_per_block * b_chunks_per_k16;
  static constexpr int b_per_thread = b_chunks / Config::threads;
  static_assert(b_chunks % Config::threads == 0, "B chunks spread evenly over the threads");
  static constexpr int b_threads_per_k16 = Config::threads / Config::k16_per_block;
  static_assert(Config::threads % Config::k16_per_block == 0 &&
                    b_per_thread * b_threads_per_k16 == b_chunks_per_k16,
                "each thread's B chunks lie in one k16 row");
  /// The block's chunk (global order) of the thread's i-th B copy.
  static SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE int b_chunk(int tid, int i) {
    return (tid / b_threads_per_k16) * b_chunks_per_k16 + tid % b_threads_per_k16 +
           i * b_threads_per_k16;
  }
  static constexpr int scale_rows = scale_rows_per_stage<Span>;
  static constexpr int scale_chunks = scale_rows * Config::block_n / 8;  // per tensor
  static_assert(2 * scale_chunks <= Config::threads, "one scale/zero chunk per thread at most");

  const std::uint16_t* a_src[a_per_thread];  // next stage's source (any readable row if absent)
  bool a_present[a_per_thread];
  const std::uint32_t* b_src[b_per_thread];
  bool b_valid[b_per_thread];
  bool b_complete;                           // every b_valid[i]
  std::int64_t b_step;                       // words per 64 rows: 4 * n/16 * 32
  const std::uint16_t* scale_src;            // this thread's scale/zero chunk at group 0, or null
  std::int64_t scale_group_stride;           // n
  const std::uint16_t* dummy_src;            // an address never read (zero-fill copies)
  // GroupSpan::stage: the thread's scale/zero chunk of the group of the last stage loaded,
  // moved by one row when a stage starts a group (groups are consecutive), and its offset in
  // a stage (bytes from the Stage's start).
  const std::uint16_t* scale_next;
  int scale_dst;
  std::uint64_t policy;
  int k_next;                                // row of the next stage to load
  int k_end;
  int group_shift;
  unsigned group_mask;

  template <class ColumnMap>
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE StageLoader(const Sources& src, const ColumnMap& columns) {
    const int tid = static_cast<int>(threadIdx.x);
    SLIMSERVE_INT4_UNROLL
    for (int i = 0; i < a_per_thread; ++i) {
      // An absent row keeps a readable address so the step's increment needs no test; its
      // copies zero-fill and never read.
      const int col = (tid % 8) * 8;
      a_present[i] = src.a_row[i] != nullptr;
      a_src[i] = (a_present[i] ? src.a_row[i] : src.a_row_fallback) + src.k_begin + col;
    }
    const int n16_total = src.n / gemm_layout::tile_n;
    SLIMSERVE_INT4_UNROLL
    for (int i = 0; i < b_per_thread; ++i) {
      const int chunk = b_chunk(tid, i);
      const int k16 = chunk / b_chunks_per_k16;
      const int v = (chunk % b_chunks_per_k16) / 8;  // the block's 16-column tile
      const int word = (chunk % 8) * 4;
      b_valid[i] = columns.valid(v);
      const std::int64_t tile_row = src.k_begin / gemm_layout::tile_k + k16;
      // ContiguousB: only b_src[0] is used, so it must be a real address even when its own
      // chunk is past the matrix's columns (the block's first tile always exists).
      const bool real = b_valid[i] || (ContiguousB && i == 0);
      b_src[i] = src.b + (real ? gemm_layout::packed_word_index(tile_row, columns.tile(v), word,
                                                                 src.n)
                               : 0);
    }
    b_complete = true;
    SLIMSERVE_INT4_UNROLL
    for (int i = 0; i < b_per_thread; ++i) b_complete = b_complete && b_valid[i];
    b_step = static_cast<std::int64_t>(Config::k16_per_block) * n16_total * gemm_layout::words_per_tile;
    scale_src = nullptr;
    if (tid < 2 * scale_chunks) {
      const bool is_zero = tid >= scale_chunks;
      const int index = is_zero ? tid - scale_chunks : tid;
      const int column = (index % (Config::block_n / 8)) * 8;  // within the block
      const int v = column / 16;
      const std::uint16_t* base = is_zero ? src.zeros : src.scales;
      if (base != nullptr && columns.valid(v)) {
        scale_src = base + columns.tile(v) * gemm_layout::tile_n + column % 16;
      }
    }
    scale_group_stride = src.n;
    dummy_src = src.scales;
    scale_dst = 0;
    if (tid < 2 * scale_chunks) {
      const bool is_zero = tid >= scale_chunks;
      const int index = is_zero ? tid - scale_chunks : tid;
      scale_dst = static_cast<int>(is_zero ? offsetof(Stage, zeros) : offsetof(Stage, scales)) +
                  static_cast<int>(sizeof(std::uint16_t)) *
                      ((index / (Config::block_n / 8)) * Config::block_n +
                       (index % (Config::block_n / 8)) * 8);
    }
    // k_begin's group: the first load copies it, every later group start moves one row.
    const std::int64_t first_group = static_cast<std::int64_t>(src.k_begin >> src.group_shift);
    scale_next = scale_src == nullptr ? dummy_src
                                      : scale_src + first_group * scale_group_stride;
    policy = Config::evict_first_b ? arch::l2_evict_first_policy() : 0;
    k_next = src.k_begin;
    k_end = src.k_end;
    group_shift = src.group_shift;
    group_mask = (1u << src.group_shift) - 1u;
  }

  /// Dense column maps with one row tile (a stream-K block of the decode tile): points the
  /// loader, which has just issued the last stage of a tile (k_next past the tile's last
  /// 64-row step, `k_steps` of them), at the next column tile's rows 0 .. k_end - 1. Moves
  /// the pointers by what the layout says instead of recomputing them from the tile's
  /// sources, so the persistent loop needs none of the parameters that builds them.
  /// `first_tile`: the next tile's first 16-column tile; `tiles`: n / 16.
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void advance_to_next_tile(int k_steps, int first_tile,
                                                                   int tiles, int next_k_end) {
    static_assert(ContiguousB, "a dense column map: the next tile's columns follow");
    const int tid = static_cast<int>(threadIdx.x);
    SLIMSERVE_INT4_UNROLL
    for (int i = 0; i < a_per_thread; ++i) a_src[i] -= k_steps * Config::block_k;  // same rows, k 0
    // [k/16, n/16, 32]: back k_steps stages of rows, on by the block's 16-column tiles
    b_src[0] += Config::n16_per_block * gemm_layout::words_per_tile -
                static_cast<std::int64_t>(k_steps) * b_step;
    b_complete = true;
    SLIMSERVE_INT4_UNROLL
    for (int i = 0; i < b_per_thread; ++i) {
      const int v = (b_chunk(tid, i) % b_chunks_per_k16) / 8;
      b_valid[i] = first_tile + v < tiles;
      b_complete = b_complete && b_valid[i];
    }
    if (scale_src != nullptr) {  // null stays null: no zero points, or columns past n
      const int index = tid >= scale_chunks ? tid - scale_chunks : tid;
      const int v = ((index % (Config::block_n / 8)) * 8) / 16;
      scale_src = first_tile + v < tiles ? scale_src + Config::block_n : nullptr;
    }
    scale_next = scale_src == nullptr ? dummy_src : scale_src;  // group 0
    k_next = 0;
    k_end = next_k_end;
  }

  /// Issues the copies of the next stage (rows k_next .. k_next + 63) into `stage`. The last
  /// stage of a slice (which may be short) takes the path that checks rows and columns; the
  /// others check neither (see load_rows). `First`: the slice's first stage (its scale rows
  /// are needed even when it starts inside a group).
  /// Contiguous B: the unchecked path also needs every one of the thread's column chunks
  /// inside the matrix (`b_complete`, false only in a block over the last columns), so its
  /// copies take no predicate at all.
  template <bool First = false>
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void load(Stage& stage) {
    const int rows_left = k_end - k_next;  // > 0
    if (rows_left > Config::block_k && (!ContiguousB || b_complete)) {
      load_rows<false, First>(stage, rows_left);
    } else {
      load_rows<true, First>(stage, rows_left);
    }
    k_next += Config::block_k;
  }

 private:
  template <bool Tail, bool First>
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void load_rows(Stage& stage, int rows_left) {
    const int tid = static_cast<int>(threadIdx.x);
    SLIMSERVE_INT4_UNROLL
    for (int i = 0; i < a_per_thread; ++i) {
      const int row = (tid + i * Config::threads) / 8;
      const int col = (tid % 8) * 8;
      const bool valid = a_present[i] && (!Tail || col < rows_left);
      arch::cp_async_16_zfill(&stage.a[a_tile_offset<Config>(row, col)], a_src[i], valid);
      a_src[i] += Config::block_k;
    }
    const bool b_row_valid =
        !Tail || (tid / b_threads_per_k16) * gemm_layout::tile_k < rows_left;
    SLIMSERVE_INT4_UNROLL
    for (int i = 0; i < b_per_thread; ++i) {
      const int chunk = b_chunk(tid, i);
      const bool valid = (ContiguousB && !Tail) || (b_valid[i] && b_row_valid);  // see load()
      std::uint32_t* dst = &stage.b[chunk * 4];  // the block's chunks in global order
      // Contiguous: chunk i is i * b_threads_per_k16 chunks (16 B each) after chunk 0. An
      // invalid chunk's address is never read (zero-fill), so it may pass the row's end.
      const std::uint32_t* from = ContiguousB ? b_src[0] + i * b_threads_per_k16 * 4 : b_src[i];
      if constexpr (Config::evict_first_b) {
        arch::cp_async_16_zfill_hint(dst, from, valid, policy);
      } else {
        arch::cp_async_16_zfill(dst, from, valid);
      }
      if (!ContiguousB) b_src[i] += b_step;
    }
    if (ContiguousB) b_src[0] += b_step;
    if constexpr (Span == GroupSpan::stage) {
      // One scale/zero row per stage, copied where a group starts (and in the slice's first
      // stage), else zero-filled (never read); the source moves one row per group start.
      if (tid < 2 * scale_chunks) {  // warp-uniform
        const bool starts = (static_cast<unsigned>(k_next) & group_mask) == 0;
        if (starts && !First) scale_next += scale_group_stride;
        const bool valid = (First || starts) && scale_src != nullptr;
        arch::cp_async_16_zfill(reinterpret_cast<unsigned char*>(&stage) + scale_dst, scale_next,
                                valid);
      }
    } else if (tid < 2 * scale_chunks) {
      const bool is_zero = tid >= scale_chunks;
      const int index = is_zero ? tid - scale_chunks : tid;
      const int row = index / (Config::block_n / 8);
      const int column = (index % (Config::block_n / 8)) * 8;
      std::uint16_t* dst = (is_zero ? stage.zeros : stage.scales) + row * Config::block_n + column;
      // The group of this stage's row `row * Span`; rows past k_end and absent columns read
      // zeros (finite, and multiplied only by zero-filled A or never stored).
      const int first_row = k_next + row * static_cast<int>(Span);
      const bool valid = scale_src != nullptr && (!Tail || first_row < k_end);
      const std::int64_t group = static_cast<std::int64_t>(first_row >> group_shift);
      arch::cp_async_16_zfill(dst, valid ? scale_src + group * scale_group_stride : dummy_src,
                              valid);
    }
  }
};

/// The lane's dequantization constants for one 16-column tile of its warp: (column g, g + 8).
struct TileColumns {
  DequantColumn first;
  DequantColumn second;
};

template <class T, class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE TileColumns make_tile_columns(
    const std::uint16_t* scale_row, const std::uint16_t* zero_row, bool has_zeros, int tile_col,
    int lane) {
  // Without zero points the stage's zero rows are zero-filled (StageLoader): read them
  // anyway and let the constant carry z = 8, so no select per column.
  const int col_first = tile_col * 16 + lane / 4;
  TileColumns columns;
  columns.first = make_dequant_column<T>(scale_row[col_first], zero_row[col_first], !has_zeros);
  columns.second =
      make_dequant_column<T>(scale_row[col_first + 8], zero_row[col_first + 8], !has_zeros);
  return columns;
}

}  // namespace detail

/// acc[m16][n8][4]: the warp's mma accumulator fragments.
template <class Config>
using WarpAccumulators = float[Config::m16_per_warp][2 * Config::n16_per_warp][4];

namespace detail {

/// The scales of the lane's accumulator columns, as FP32: [n8 tile][c0 / c1 column]. The
/// fragment's c0, c1 (and c2, c3, eight rows down) are columns 2t, 2t + 1 of the n8 tile.
template <class T, class Config>
using SumScales = float[2 * Config::n16_per_warp][2];

template <class T, class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void load_sum_scales(const std::uint16_t* scale_row,
                                                            int warp_col, int lane,
                                                            SumScales<T, Config>& scales) {
  SLIMSERVE_INT4_UNROLL
  for (int j = 0; j < 2 * Config::n16_per_warp; ++j) {
    const int col = warp_col + j * 8 + (lane % 4) * 2;  // even: one 32-bit load for the pair
    std::uint32_t pair;
    std::memcpy(&pair, &scale_row[col], sizeof(pair));
    if constexpr (std::is_same_v<T, bf16>) {  // BF16 is the top half of an FP32
      scales[j][0] = slimserve::detail::float_from_bits(pair << 16);
      scales[j][1] = slimserve::detail::float_from_bits(pair & 0xFFFF0000u);
    } else {
      scales[j][0] = to_float(T::from_bits(static_cast<std::uint16_t>(pair)));
      scales[j][1] = to_float(T::from_bits(static_cast<std::uint16_t>(pair >> 16)));
    }
  }
}

/// acc += sums * s (one FP32 rounding of the product, one of the sum). The next group's first
/// mma overwrites sums (`mma_16816_fresh`), so they need no zeroing here.
template <class T, class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void fold_group_sums(WarpAccumulators<Config>& acc,
                                                            WarpAccumulators<Config>& sums,
                                                            const SumScales<T, Config>& scales) {
  SLIMSERVE_INT4_UNROLL
  for (int i = 0; i < Config::m16_per_warp; ++i) {
    SLIMSERVE_INT4_UNROLL
    for (int j = 0; j < 2 * Config::n16_per_warp; ++j) {
      SLIMSERVE_INT4_UNROLL
      for (int e = 0; e < 4; ++e) {
        acc[i][j][e] += sums[i][j][e] * scales[j][e % 2];
      }
    }
  }
}

}  // namespace detail

namespace detail {

/// The mma work of one stage: the lane's packed words by one ldmatrix.x4 per 16-column tile,
/// dequantized with `tile_columns` (groups of 16 and 32 remake them at their rows here), into
/// `sums`. Fully unrolled: every shared-memory offset is static.
template <class T, class Config, GroupSpan Span, bool ScaleSums, bool FreshSums = false>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void stage_mma(
    const typename GemmSharedStorage<Config, Span>::Stage& stage, TileColumns (&tile_columns)[Config::n16_per_warp],
    bool has_zeros, int b_lane_word, int warp_row, int warp_col, int lane,
    WarpAccumulators<Config>& sums) {
  // The lane's packed words of this stage: words[j][k16].
  std::uint32_t words[Config::n16_per_warp][4];
  SLIMSERVE_INT4_UNROLL
  for (int j = 0; j < Config::n16_per_warp; ++j) {
    arch::ldmatrix_x4(words[j], &stage.b[b_lane_word + (warp_col / 16 + j) * 32]);
  }

  SLIMSERVE_INT4_UNROLL
  for (int k16 = 0; k16 < Config::k16_per_block; ++k16) {
    if constexpr (Span != GroupSpan::stage) {
      constexpr int k16_per_group = static_cast<int>(Span) / 16;
      if (k16 % k16_per_group == 0) {
        const int row = k16 / k16_per_group;
        SLIMSERVE_INT4_UNROLL
        for (int j = 0; j < Config::n16_per_warp; ++j) {
          tile_columns[j] = make_tile_columns<T, Config>(
              &stage.scales[row * Config::block_n], &stage.zeros[row * Config::block_n],
              has_zeros, warp_col / 16 + j, lane);
        }
      }
    }
    std::uint32_t a_frag[Config::m16_per_warp][4];
    SLIMSERVE_INT4_UNROLL
    for (int i = 0; i < Config::m16_per_warp; ++i) {
      const int row = warp_row + i * 16 + lane % 16;
      const int col = k16 * 16 + (lane / 16) * 8;
      arch::ldmatrix_x4(a_frag[i], &stage.a[a_tile_offset<Config>(row, col)]);
    }
    SLIMSERVE_INT4_UNROLL
    for (int j = 0; j < Config::n16_per_warp; ++j) {
      std::uint32_t b[4];
      if constexpr (ScaleSums) {
        dequantize_word_unscaled<T>(words[j][k16], tile_columns[j].first, tile_columns[j].second, b);
      } else {
        dequantize_word<T>(words[j][k16], tile_columns[j].first, tile_columns[j].second, b);
      }
      const std::uint32_t b_first[2] = {b[0], b[1]};
      const std::uint32_t b_second[2] = {b[2], b[3]};
      SLIMSERVE_INT4_UNROLL
      for (int i = 0; i < Config::m16_per_warp; ++i) {
        if (FreshSums && k16 == 0) {  // a group's first rows: the sums start here
          mma_16816_fresh<T>(sums[i][2 * j], a_frag[i], b_first);
          mma_16816_fresh<T>(sums[i][2 * j + 1], a_frag[i], b_second);
        } else {
          mma_16816<T>(sums[i][2 * j], a_frag[i], b_first);
          mma_16816<T>(sums[i][2 * j + 1], a_frag[i], b_second);
        }
      }
    }
  }
}

/// The stage buffer of pipeline step `step` (>= 0): unsigned, so a power-of-two count is a mask.
template <class Config>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE int stage_index(int step) {
  return static_cast<int>(static_cast<unsigned>(step) % static_cast<unsigned>(Config::stages));
}

/// The start of pipeline step `step` (>= 0, counted over everything the pipeline has
/// consumed): waits for its stage, then lets `refill(step + stages - 1)` refill the stage that
/// every warp finished with (step - 1's) if that step exists.
template <class Config, class Refill>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void begin_step(int step, Refill& refill) {
  arch::cp_async_wait<Config::stages - 2>();
  __syncthreads();  // step's data visible; everyone is done with the stage refilled below
  refill(step + Config::stages - 1);
  arch::cp_async_commit();
}

/// Consumes the `k_steps` 64-row steps of one K slice from a running pipeline and adds the
/// products into `acc` (which the caller zeroes). `pipe_step`: the pipeline step of the
/// slice's first step (its stage is stage_index(pipe_step)); `first_step`: its 64-row step in
/// the matrix (where the groups start). `refill(s)` issues pipeline step s's copies into
/// stage_index(s) when step s exists (the slice's own later steps, or, for a persistent
/// block, the next slice's first ones: the pipeline then never drains between slices).
///
/// Groups of 64 rows or more (`GroupSpan::stage`) are an outer loop over the slice's groups
/// around an inner loop over the group's remaining stages: the per-group work (fold of the
/// group sums, scale loads, zero splats) sits in the outer loop with the group's first stage
/// and runs once per group, and the inner loop, the steady state, is the bare stage.
template <class T, class Config, GroupSpan Span, class Refill>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void consume_slice(GemmSharedStorage<Config, Span>& smem,
                                                          int pipe_step, int k_steps,
                                                          int first_step, int group_shift,
                                                          bool has_zeros, int warp_row,
                                                          int warp_col, Refill& refill,
                                                          WarpAccumulators<Config>& acc) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  // ldmatrix row addresses for B: lane l points at row l % 8 (16 bytes) of k-tile l / 8.
  const int b_lane_word = ((lane / 8) * Config::n16_per_block) * 32 + (lane % 8) * 4;

  TileColumns tile_columns[Config::n16_per_warp];
  // Per group sum: the mma adds A . (q - z) into group_sums; at each group's end they are
  // scaled into acc. Per weight: the mma adds A . w into acc directly.
  constexpr bool scale_sums = group_scaling_of<Config, Span> == GroupScaling::per_group_sum;
  WarpAccumulators<Config> group_sums = {};
  SumScales<T, Config> sum_scales = {};
  WarpAccumulators<Config>& sums = *(scale_sums ? &group_sums : &acc);
  if constexpr (Span == GroupSpan::stage) {
    // Groups start on stage boundaries (k_begin and every group size are multiples of 64), so
    // the loop counts in 64-row steps, 32-bit: a group is 1 << step_shift steps (per-channel:
    // 2^25, more than any k < 2^31 has).
    const int step_shift = group_shift - 6;
    int step = 0;
    while (step < k_steps) {
      // One past the group's last step inside the slice (relative to the slice).
      const int group_last = min_int(
          k_steps, ((((first_step + step) >> step_shift) + 1) << step_shift) - first_step);

      begin_step<Config>(pipe_step + step, refill);
      const auto& first = smem.stages[stage_index<Config>(pipe_step + step)];
      if constexpr (scale_sums) {
        load_sum_scales<T, Config>(first.scales, warp_col, lane, sum_scales);
      }
      SLIMSERVE_INT4_UNROLL
      for (int j = 0; j < Config::n16_per_warp; ++j) {
        tile_columns[j] = make_tile_columns<T, Config>(first.scales, first.zeros, has_zeros,
                                                       warp_col / 16 + j, lane);
      }
      stage_mma<T, Config, Span, scale_sums, scale_sums>(first, tile_columns, has_zeros,
                                                         b_lane_word, warp_row, warp_col, lane,
                                                         sums);
      ++step;
      // The steady state: the group's other stages.
      for (; step < group_last; ++step) {
        begin_step<Config>(pipe_step + step, refill);
        stage_mma<T, Config, Span, scale_sums>(smem.stages[stage_index<Config>(pipe_step + step)],
                                               tile_columns, has_zeros, b_lane_word, warp_row,
                                               warp_col, lane, sums);
      }
      // The group's end: its sums, scaled, into acc (every group, so the report counts it).
      if constexpr (scale_sums) fold_group_sums<T, Config>(acc, group_sums, sum_scales);
    }
  } else {
    for (int step = 0; step < k_steps; ++step) {
      begin_step<Config>(pipe_step + step, refill);
      stage_mma<T, Config, Span, scale_sums>(smem.stages[stage_index<Config>(pipe_step + step)],
                                             tile_columns, has_zeros, b_lane_word, warp_row,
                                             warp_col, lane, sums);
    }
  }
}

}  // namespace detail

/// Runs the pipeline over the K slice of `src` and adds the products into `acc` (which the
/// caller zeroes). `warp_row`, `warp_col`: the warp's offset inside the block tile. The
/// pipeline fills at the start and drains at the end (a persistent stream-K block instead
/// keeps one pipeline over all its slices: w4a16_gemm_stream_k_kernel).
template <class T, class Config, GroupSpan Span, class ColumnMap>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void w4a16_mainloop(
    GemmSharedStorage<Config, Span>& smem, const TileSources<Config>& src,
    const ColumnMap& columns, int warp_row, int warp_col, WarpAccumulators<Config>& acc) {
  const int k_steps = (src.k_end - src.k_begin + Config::block_k - 1) / Config::block_k;

  detail::StageLoader<Config, Span, detail::contiguous_columns_v<ColumnMap>> loader(src, columns);
  SLIMSERVE_INT4_UNROLL
  for (int s = 0; s < Config::stages - 1; ++s) {
    if (s == 0 && k_steps > 0) {
      loader.template load<true>(smem.stages[0]);
    } else if (s < k_steps) {
      loader.load(smem.stages[s]);
    }
    arch::cp_async_commit();
  }
  auto refill = [&](int step) {
    if (step < k_steps) loader.load(smem.stages[detail::stage_index<Config>(step)]);
  };
  detail::consume_slice<T, Config, Span>(smem, 0, k_steps, src.k_begin / Config::block_k,
                                         src.group_shift, src.zeros != nullptr, warp_row,
                                         warp_col, refill, acc);
  arch::cp_async_wait<0>();
}

/// The identity column map of a dense GEMM: the block's tile v is weight tile n0/16 + v.
struct DenseColumns {
  static constexpr bool contiguous = true;  ///< adjacent tiles: see StageLoader
  int first_tile;  ///< n0 / 16
  int tiles;       ///< n / 16
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE int tile(int v) const { return first_tile + v; }
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE bool valid(int v) const { return first_tile + v < tiles; }
};

}  // namespace int4
SLIMSERVE_NAMESPACE_END
