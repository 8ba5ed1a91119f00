#pragma once
/// \file
/// \brief The plain (interchange) form of an INT4-quantized weight matrix.
///
/// Every importer (GPTQ, AWQ, compressed-tensors) produces this form and every exporter reads
/// it; the GEMM kernels never read it directly: `int4::repack_for_gemm` turns it into the
/// kernel's own layout. Keeping one unambiguous form in the middle means each checkpoint format
/// needs one converter, and a format's quirks (AWQ's nibble interleave, GPTQ v1's zero-point
/// offset) stay inside its converter.
///
/// Conventions (W is [K, N]: K input features, N output features; y = x · W):
///  * `codes` holds unsigned 4-bit codes q in 0..15, 8 per uint32 along K:
///    nibble j (bits 4j..4j+3) of `codes[(k / 8) * N + n]` is q(k, n) for k % 8 == j.
///  * groups run along K: group g covers rows [g * group_size, (g + 1) * group_size).
///    `group_size == K` means one group per column (per-channel).
///  * `scales[g * N + n]` (FP32, finite, > 0) and `zeros[g * N + n]` (0..15).
///    Symmetric quantization stores zero = 8 everywhere.
///  * dequantized value: W(k, n) = (q(k, n) - zero(g, n)) * scale(g, n), g = group_of_row(k).
///  * `group_of_row` is k / group_size, unless `row_group` is non-empty (GPTQ act-order /
///    g_idx): then it is row_group[k].

#include <cstdint>
#include <vector>

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

struct QuantizedMatrix {
  std::int64_t k = 0;           ///< rows (input features); a multiple of 8
  std::int64_t n = 0;           ///< columns (output features)
  std::int64_t group_size = 0;  ///< rows per group; divides k (k itself for per-channel)
  bool symmetric = true;        ///< zeros are all 8

  std::vector<std::uint32_t> codes;  ///< [k / 8, n], 8 nibbles along k per word
  std::vector<float> scales;         ///< [k / group_size, n]
  std::vector<std::uint8_t> zeros;   ///< [k / group_size, n], each 0..15
  std::vector<std::int32_t> row_group;  ///< empty, or [k]: group of each row (act-order)

  std::int64_t num_groups() const { return group_size == 0 ? 0 : k / group_size; }
  std::int64_t group_of_row(std::int64_t row) const {
    return row_group.empty() ? row / group_size : row_group[static_cast<std::size_t>(row)];
  }
  std::uint32_t code(std::int64_t row, std::int64_t col) const {
    const std::uint32_t word = codes[static_cast<std::size_t>((row / 8) * n + col)];
    return (word >> (4 * (row % 8))) & 0xFu;
  }
  float dequantized(std::int64_t row, std::int64_t col) const {
    const auto g = static_cast<std::size_t>(group_of_row(row) * n + col);
    return (static_cast<float>(code(row, col)) - static_cast<float>(zeros[g])) * scales[g];
  }
};

}  // namespace int4
SLIMSERVE_NAMESPACE_END
