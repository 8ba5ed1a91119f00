#pragma once
/// \file
/// \brief Host quantizer: BF16 / FP16 / FP32 / block-scaled FP8 weights -> `int4::QuantizedMatrix`.
///
/// Choices (see docs/int4.md for why):
///  * Symmetric: zero = 8, scale = amax / 7, so +-amax map to codes 15 and 1 and nothing is
///    clipped without a clipping search (code 0, i.e. -8, is never produced by plain
///    rounding). Every element then satisfies |w - dequant(w)| <= scale / 2.
///  * Asymmetric: the group's range is widened to include 0 (lo = min(min, 0), hi =
///    max(max, 0)), scale = (hi - lo) / 15, zero = round(-lo / scale) clamped to 0..15; 0 is
///    exactly representable and the same scale / 2 bound holds.
///  * Rounding is round-to-nearest-even of w / scale + zero, clamped to 0..15.
///  * An all-zero group gets scale 1 and zero 8 (every code equals the zero).
///  * Clipping search (optional): for shrink factors 1, 1 - d, ..., min_shrink the group's
///    range is scaled by the factor, the group is quantized, and the factor with the least
///    squared error is kept (per group and column).
///  * `scale_type`: scales are rounded UP to this type (so the rounded grid still covers the
///    group's range and the scale / 2 bound holds) BEFORE the codes are chosen, so a
///    checkpoint that stores FP16 scales reproduces exactly what was measured.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/int4/quantized_matrix.hpp"
#include "slimserve/int4/tensor.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

/// `QuantizeOptions::group_size` value that asks for one group per output column.
inline constexpr std::int64_t kPerChannel = 0;

/// How a 2-D source weight is laid out in memory.
enum class WeightLayout : std::uint8_t {
  k_by_n,  ///< row-major [K, N] (input features outer), the interchange orientation
  n_by_k,  ///< row-major [N, K] (output features outer): PyTorch nn.Linear.weight
};

struct ClipSearch {
  int steps = 0;             ///< 0 = off; otherwise shrink factors tried besides 1.0
  float min_shrink = 0.5f;   ///< smallest factor tried, in (0, 1)
};

struct QuantizeOptions {
  std::int64_t group_size = 128;  ///< rows (along K) per group, a multiple of 8; or kPerChannel
  bool symmetric = true;
  ClipSearch clip;
  ElementType scale_type = ElementType::float32;  ///< float32, float16 or bfloat16
  int num_threads = 0;  ///< 0 = std::thread::hardware_concurrency()
};

/// Per-block dequantization scales of an FP8 weight (DeepSeek/Kimi `weight_scale_inv`):
/// `scales` is float32 or bfloat16, shape [ceil(rows / block_rows), ceil(cols / block_cols)],
/// where rows x cols is the weight's STORED shape; real value = fp8 value * block scale.
struct BlockScales {
  TensorView scales;
  std::int64_t block_rows = 128;
  std::int64_t block_cols = 128;
};

/// Quantizes a 2-D weight (float32, float16, bfloat16, or float8_e4m3 with `block_scales`).
/// Errors: invalid_argument for a shape K % 8 != 0 or K % group_size != 0, a group size not
/// a multiple of 8, an unsupported element type, a non-finite weight or block scale (the
/// message names the element), or a scale that does not fit `scale_type`.
Result<QuantizedMatrix> quantize(const TensorView& weight, WeightLayout layout,
                                 const QuantizeOptions& options,
                                 const BlockScales* block_scales = nullptr);

/// Checks a QuantizedMatrix against its own conventions: sizes, k % 8, group_size divides k
/// and is a multiple of 8 (or equals k), scales finite and > 0, zeros 0..15 (all 8 when
/// symmetric), row_group empty or [k] with every entry in [0, num_groups).
Status validate(const QuantizedMatrix& matrix);

/// Dequantized weights, row-major [K, N] (float32). Precondition: validate(matrix).ok().
std::vector<float> dequantize(const QuantizedMatrix& matrix);

/// How far a quantized matrix is from the weights it came from.
struct QuantizationError {
  double relative = 0.0;  ///< ||W - dequant(W)||_F / ||W||_F (0 when W is all zeros)
  double max_abs = 0.0;   ///< max |W - dequant(W)|
};

/// Compares `matrix` with the source `weight` (same arguments as `quantize`).
/// invalid_argument when the shapes disagree or the source is not a supported float type.
Result<QuantizationError> measure_error(const TensorView& weight, WeightLayout layout,
                                        const QuantizedMatrix& matrix,
                                        const BlockScales* block_scales = nullptr);

}  // namespace int4
SLIMSERVE_NAMESPACE_END
