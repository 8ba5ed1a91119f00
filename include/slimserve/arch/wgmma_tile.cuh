#pragma once
/// \file
/// \brief A 16-bit matrix in shared memory in the 128-byte-swizzled canonical wgmma layout, and
/// the descriptors that read it as a K-major or as an MN-major operand.
///
///   WgmmaTile128B<Rows, Cols>: matrix [Rows][Cols] of 16-bit values (Rows % 8 == 0,
///   Cols % 64 == 0), stored as Cols/64 column blocks ("atoms") of Rows x 128 bytes; inside a
///   block, row r is 128 bytes at (r/8)*1024 + (r%8)*128 and its 16-byte chunks are permuted
///   by the 128B swizzle (chunk ^= r % 8). The tile must start on a 1024-byte boundary.
///
/// The same bytes serve both operand majors, which is what attention needs from one staged
/// K/V (or MLA latent) tile:
///   - K-major (rows = M or N, cols = K): k_major_descriptor(k_step) covers columns
///     [16 k_step, 16 k_step + 16) of every row (SBO = 1024 between 8-row groups; LBO unused);
///   - MN-major (rows = K, cols = N): mn_major_descriptor(row_step, col0) covers rows
///     [16 row_step, +16) and columns from col0 (a multiple of 64) on (LBO = one column block,
///     SBO = 1024 between 8-row groups).

#include <cstdint>

#include "slimserve/arch/wgmma.cuh"
#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace arch {

template <int Rows, int Cols>
struct WgmmaTile128B {
  static_assert(Rows % 8 == 0 && Rows > 0, "rows come in core-matrix groups of 8");
  static_assert(Cols % 64 == 0 && Cols > 0, "columns come in 128-byte swizzle atoms of 64");
  static constexpr int rows = Rows;
  static constexpr int cols = Cols;
  static constexpr std::uint32_t row_bytes = 128;
  static constexpr std::uint32_t group_bytes = 8 * row_bytes;  // SBO: 8 rows, one pattern
  static constexpr std::uint32_t block_bytes = Rows * row_bytes;  // one 64-column block
  static constexpr std::uint32_t bytes = (Cols / 64) * block_bytes;
  static constexpr std::uint32_t alignment = 1024;

  /// Byte offset of the 16-byte chunk holding columns [8 chunk, 8 chunk + 8) of `row`.
  SLIMSERVE_HOST_DEVICE static constexpr std::uint32_t chunk_offset(int row, int chunk) {
    const auto r = static_cast<std::uint32_t>(row);
    const auto c = static_cast<std::uint32_t>(chunk);
    return (c / 8) * block_bytes + (r / 8) * group_bytes + (r % 8) * row_bytes +
           (((c % 8) ^ (r % 8)) << 4);
  }
  /// Byte offset of element (row, col).
  SLIMSERVE_HOST_DEVICE static constexpr std::uint32_t element_offset(int row, int col) {
    return chunk_offset(row, col / 8) + static_cast<std::uint32_t>(col % 8) * 2;
  }

  /// K-major operand (A: rows = M = 64; B: rows = N), K columns [16 k_step, 16 k_step + 16).
  SLIMSERVE_HOST_DEVICE static constexpr std::uint64_t k_major_descriptor(std::uint32_t tile_address,
                                                                        int k_step) {
    const auto k = static_cast<std::uint32_t>(16 * k_step);
    return make_wgmma_descriptor(tile_address + (k / 64) * block_bytes + (k % 64) * 2, 16,
                                 group_bytes, WgmmaSwizzle::bytes128);
  }
  /// k_major_descriptor(a, k) == k_major_descriptor(a, 0) + k_major_step(k): build the base
  /// once, add constants in unrolled loops (the start address field cannot carry: shared
  /// addresses stay below 256 KB). Add as plain 64-bit integers: with the base in a uniform
  /// register pair, ptxas forms each wgmma's descriptor with one UIADD3.64; adding to the low
  /// word only made it rebuild the constant high word with a UMOV for every wgmma.
  SLIMSERVE_HOST_DEVICE static constexpr std::uint64_t k_major_step(int k_step) {
    const auto k = static_cast<std::uint32_t>(16 * k_step);
    return ((k / 64) * block_bytes + (k % 64) * 2) >> 4;
  }
  /// mn_major_descriptor(a, r, c) == mn_major_descriptor(a, 0, 0) + mn_major_step(r, c).
  SLIMSERVE_HOST_DEVICE static constexpr std::uint64_t mn_major_step(int row_step, int col0) {
    return (static_cast<std::uint32_t>(col0 / 64) * block_bytes +
            static_cast<std::uint32_t>(row_step) * 2 * group_bytes) >> 4;
  }
  /// MN-major B (rows = K, cols = N): K rows [16 row_step, +16), N columns from col0 on.
  SLIMSERVE_HOST_DEVICE static constexpr std::uint64_t mn_major_descriptor(std::uint32_t tile_address,
                                                                         int row_step, int col0) {
    return make_wgmma_descriptor(
        tile_address + static_cast<std::uint32_t>(col0 / 64) * block_bytes +
            static_cast<std::uint32_t>(row_step) * 2 * group_bytes,
        block_bytes, group_bytes, WgmmaSwizzle::bytes128);
  }
};

}  // namespace arch
SLIMSERVE_NAMESPACE_END
