#pragma once
/// \file
/// \brief The W4A16 GEMM's packed weight layout: which lane owns which nibble, and why.
///
/// The kernel multiplies with `mma.sync.m16n8k16` (row.col). Its B operand (16 rows of K by 8
/// columns of N) lives in registers: lane `l` holds two 32-bit registers b0, b1, each a pair
/// of 16-bit values of ONE column n = l / 4 at consecutive rows:
///     b0 = {B[2t][n], B[2t+1][n]},  b1 = {B[2t+8][n], B[2t+9][n]},  t = l % 4.
/// A warp that covers 16 columns (two n8 tiles) per k16 step therefore needs 4 registers per
/// lane = 8 values = 8 nibbles = exactly one 32-bit word. We store the weights so that this
/// word is what the lane loads (one conflict-free 32-bit shared-memory load per lane per
/// 16x16 tile).
///
/// Inside the word the order is chosen for the magic-number conversion (see dequant.cuh): one
/// `lop3(word >> s, 0x000f000f, magic)` extracts nibbles i and i + 4 into the low and high
/// 16-bit halves of a register, and those two halves must be the (even k, odd k) pair of one
/// b register. So nibble `i + 4 * h` holds b register `i`'s half `h`:
///
///     nibble:    0        1        2        3        4        5        6        7
///     register:  r0.lo    r1.lo    r2.lo    r3.lo    r0.hi    r1.hi    r2.hi    r3.hi
///     row k:     2t       2t+8     2t       2t+8     2t+1     2t+9     2t+1     2t+9
///     column n:  g        g        g+8      g+8      g        g        g+8      g+8
///
/// with g = l / 4, t = l % 4; r0, r1 are b0, b1 of the first n8 tile, r2, r3 of the second.
/// `code_position` / `code_slot` below are that table in code; the packer, the unpacker, the
/// device repack kernel and the tests all use them.
///
/// Buffer order: 16x16 tiles row-major over (K/16, N/16), 32 words per tile in lane order:
///     packed[((tile_k * (N / 16)) + tile_n) * 32 + lane]       // [K/16, N/16, 32] uint32
/// so the words a thread block needs for a K-slice of 16 rows and a run of columns are one
/// contiguous range (16-byte cp.async chunks, coalesced).
///
/// Scales and zero points are stored in the activation type (BF16 or FP16), row-major
/// [K/group_size, N]; zeros hold the zero point z itself (a small integer, exact in both
/// types) and may be absent for symmetric weights (z = 8). The kernel's weight is
///     w = round_T((q - z) * s_T),   s_T = the scale rounded to T,
/// computed exactly that way in registers, so `dequantize_reference` reproduces it bit for bit.

#include <cstdint>
#include <string_view>
#include <vector>

#include "slimserve/activation_dtype.hpp"
#include "slimserve/config.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/int4/quantized_matrix.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

/// The type of the GEMM's activations (A), outputs (C), bias, scales and zeros: the
/// library-wide enum (activation_dtype.hpp); `ActivationType` is the component's historical name.
using ActivationType = slimserve::ActivationDtype;
using ActivationDtype = slimserve::ActivationDtype;
using slimserve::is_valid;
using slimserve::to_string;

namespace gemm_layout {

inline constexpr int tile_k = 16;          ///< rows of K per packed tile (one mma k-step)
inline constexpr int tile_n = 16;          ///< columns of N per packed tile (two mma n8 tiles)
inline constexpr int words_per_tile = 32;  ///< one word per lane of a warp
inline constexpr int codes_per_word = 8;
inline constexpr int symmetric_zero = 8;   ///< zero point used when no zeros are stored

/// A position inside one 16x16 tile.
struct TileCoord {
  int k;  ///< 0..15
  int n;  ///< 0..15
};
/// Where a code lives inside one tile's 32 words.
struct NibbleSlot {
  int lane;    ///< 0..31: the word (and the lane that loads it)
  int nibble;  ///< 0..7: bits 4*nibble .. 4*nibble+3
};

/// The tile position of the code in `nibble` of `lane`'s word (the table in the file comment).
SLIMSERVE_HOST_DEVICE constexpr TileCoord code_position(int lane, int nibble) {
  const int column_in_n8 = lane / 4;  // mma groupID: the B column this lane holds
  const int k_pair = lane % 4;        // mma threadID_in_group: which pair of rows
  const int reg = nibble % 4;         // r0..r3: (n8 tile = reg / 2, b0/b1 = reg % 2)
  const int half = nibble / 4;        // 0: even row (low 16 bits), 1: odd row (high 16 bits)
  return TileCoord{2 * k_pair + half + 8 * (reg % 2), column_in_n8 + 8 * (reg / 2)};
}

/// Inverse of code_position.
SLIMSERVE_HOST_DEVICE constexpr NibbleSlot code_slot(int k, int n) {
  const int reg = (k / 8) + 2 * (n / 8);
  const int half = k % 2;
  const int k_pair = (k % 8) / 2;
  return NibbleSlot{(n % 8) * 4 + k_pair, reg + 4 * half};
}

/// Index of a tile's word for `lane` in the packed buffer of a matrix with `n` columns.
SLIMSERVE_HOST_DEVICE constexpr std::int64_t packed_word_index(std::int64_t tile_row,
                                                               std::int64_t tile_col, int lane,
                                                               std::int64_t n) {
  return (tile_row * (n / tile_n) + tile_col) * words_per_tile + lane;
}

/// Index of the scale (and zero) of group `group`, column `col`: row-major [groups, n].
SLIMSERVE_HOST_DEVICE constexpr std::int64_t scale_index(std::int64_t group, std::int64_t col,
                                                         std::int64_t n) {
  return group * n + col;
}

/// Group sizes the GEMM runs: a power of two >= 16 that divides k (the group of row r is then
/// r >> shift, no division), or k itself (per-channel).
SLIMSERVE_HOST_DEVICE constexpr bool supported_group_size(std::int64_t k, std::int64_t group_size) {
  if (group_size == k && k > 0) return true;
  const bool power_of_two = group_size > 0 && (group_size & (group_size - 1)) == 0;
  return power_of_two && group_size >= 16 && group_size <= k && k % group_size == 0;
}
/// The shift with group = row >> shift; per-channel: 31 (every row of k < 2^31 is group 0).
SLIMSERVE_HOST_DEVICE constexpr int group_shift(std::int64_t k, std::int64_t group_size) {
  if (group_size == k) return 31;
  int shift = 0;
  while ((std::int64_t{1} << shift) < group_size) ++shift;
  return shift;
}

/// Where code (row, col) of a [k, n] matrix lives: word index and nibble.
struct CodeAddress {
  std::int64_t word;
  int nibble;
};
SLIMSERVE_HOST_DEVICE constexpr CodeAddress code_address(std::int64_t row, std::int64_t col,
                                                         std::int64_t n) {
  const NibbleSlot slot = code_slot(static_cast<int>(row % tile_k), static_cast<int>(col % tile_n));
  return CodeAddress{packed_word_index(row / tile_k, col / tile_n, slot.lane, n), slot.nibble};
}

}  // namespace gemm_layout

/// The kernel's weight for code q, zero z and scale bits (of `type`), as `type` bits:
/// round_T((q - z) * s). The product is exact in FP32 (4-bit by 11-bit), so this is the single
/// rounding the kernel's FMA does.
SLIMSERVE_HOST_DEVICE inline std::uint16_t dequantize_reference(ActivationType type,
                                                                std::uint32_t q, std::uint32_t z,
                                                                std::uint16_t scale_bits) {
  const float diff = static_cast<float>(static_cast<int>(q) - static_cast<int>(z));
  if (type == ActivationType::bf16) {
    return from_float<bf16>(diff * to_float(bf16::from_bits(scale_bits))).bits;
  }
  return from_float<fp16>(diff * to_float(fp16::from_bits(scale_bits))).bits;
}

/// Where a fused kernel applies the group scales, which decides the FP64 model its results
/// match (docs/int4-gemm.md, "Numerics").
enum class GroupScaling : std::uint8_t {
  /// Every weight is dequantized to T: w = round_T((q - z) * s). Groups of 16 and 32 (the
  /// scale changes inside a 64-row stage) and the wide tile (its dequantized B is shared by
  /// several 16-row A tiles, so a per-weight multiply is cheaper than a per-sum one).
  per_weight,
  /// The mma multiplies A by q - z (exact in T) and each group's FP32 sum is multiplied by s
  /// once: the model is the exact weight w = (q - z) * s, with no rounding to T.
  per_group_sum,
};

/// The scaling of the decode tile (16 rows per warp) for `group_size` (k: per-channel): per
/// group sum wherever a group spans whole 64-row stages (every size but 16 and 32).
SLIMSERVE_HOST_DEVICE constexpr GroupScaling decode_tile_group_scaling(std::int64_t group_size) {
  return group_size == 16 || group_size == 32 ? GroupScaling::per_weight
                                              : GroupScaling::per_group_sum;
}

/// The FP64 weight a fused kernel with `scaling` multiplies by (the tests' reference model).
inline double model_weight(ActivationType type, GroupScaling scaling, std::uint32_t q,
                           std::uint32_t z, std::uint16_t scale_bits) {
  const float scale = type == ActivationType::bf16 ? to_float(bf16::from_bits(scale_bits))
                                                   : to_float(fp16::from_bits(scale_bits));
  if (scaling == GroupScaling::per_group_sum) {
    return static_cast<double>(static_cast<int>(q) - static_cast<int>(z)) * static_cast<double>(scale);
  }
  const std::uint16_t bits = dequantize_reference(type, q, z, scale_bits);
  return type == ActivationType::bf16 ? static_cast<double>(to_float(bf16::from_bits(bits)))
                                      : static_cast<double>(to_float(fp16::from_bits(bits)));
}

/// Rounds an FP32 value to `type` (round to nearest even) and returns the bits.
SLIMSERVE_HOST_DEVICE inline std::uint16_t to_activation_bits(ActivationType type, float value) {
  return type == ActivationType::bf16 ? from_float<bf16>(value).bits : from_float<fp16>(value).bits;
}
SLIMSERVE_HOST_DEVICE inline float activation_to_float(ActivationType type, std::uint16_t bits) {
  return type == ActivationType::bf16 ? to_float(bf16::from_bits(bits))
                                      : to_float(fp16::from_bits(bits));
}

/// Weights in the GEMM kernel's layout (host copy; upload each vector as it is).
struct GemmWeights {
  std::int64_t k = 0;
  std::int64_t n = 0;
  std::int64_t group_size = 0;  ///< k for per-channel
  ActivationType activation = ActivationType::bf16;
  std::vector<std::uint32_t> packed;  ///< [k/16, n/16, 32], see gemm_layout
  std::vector<std::uint16_t> scales;  ///< [k/group_size, n], bits of `activation`
  std::vector<std::uint16_t> zeros;   ///< [k/group_size, n] z as `activation`; empty: z = 8
  /// Act-order only (else empty), [k]: packed row i is the original row k_order[i]. The GEMM
  /// then needs A with its columns in the same order: A'[:, i] = A[:, k_order[i]].
  std::vector<std::int32_t> k_order;

  std::int64_t num_groups() const { return group_size == 0 ? 0 : k / group_size; }
};

/// Checks that `matrix` is consistent and that the kernel supports its shape: k and n
/// multiples of 16; group_size a power of two >= 16 that divides k, or k (per-channel);
/// act-order groups with exactly group_size rows each.
Status check_gemm_compatible(const QuantizedMatrix& matrix);

/// Interchange form -> kernel layout. Scales are rounded to `activation` (round to nearest
/// even); codes, zeros and the act-order map are kept exactly.
Result<GemmWeights> repack_for_gemm(const QuantizedMatrix& matrix, ActivationType activation);

/// Kernel layout -> interchange form. Round-trips `repack_for_gemm` bit-exactly for codes,
/// zeros, row_group and every scale representable in the activation type.
Result<QuantizedMatrix> unpack_from_gemm(const GemmWeights& weights);

}  // namespace int4
SLIMSERVE_NAMESPACE_END
