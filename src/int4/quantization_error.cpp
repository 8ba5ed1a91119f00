// measure_error: the source decoded row by row (float, FP8 block scales applied) against the
// dequantized matrix, accumulated in double.

#include <algorithm>
#include <cmath>

#include "element_convert.hpp"
#include "slimserve/int4/quantize.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

Result<QuantizationError> measure_error(const TensorView& weight, WeightLayout layout,
                                        const QuantizedMatrix& matrix, const BlockScales* block_scales) {
  SLIMSERVE_RETURN_IF_ERROR(validate(matrix));
  if (weight.shape.size() != 2 || !detail::is_float_type(weight.type)) {
    return make_status(StatusCode::invalid_argument, "measure_error needs a 2-D float weight");
  }
  const std::int64_t rows = weight.shape[0], cols = weight.shape[1];
  const bool k_by_n = layout == WeightLayout::k_by_n;
  if ((k_by_n ? rows : cols) != matrix.k || (k_by_n ? cols : rows) != matrix.n ||
      weight.bytes.size() != static_cast<std::size_t>(rows * cols) * element_size(weight.type)) {
    return make_status(StatusCode::invalid_argument, "weight [", rows, ", ", cols,
                       "] does not match the quantized matrix K = ", matrix.k, ", N = ", matrix.n);
  }
  const bool fp8 = weight.type == ElementType::float8_e4m3;
  std::vector<float> block_scale;
  std::int64_t grid_cols = 0;
  if (fp8) {
    if (block_scales == nullptr) return make_status(StatusCode::invalid_argument, "F8_E4M3 weights need their block scales");
    grid_cols = (cols + block_scales->block_cols - 1) / block_scales->block_cols;
    const std::int64_t grid_rows = (rows + block_scales->block_rows - 1) / block_scales->block_rows;
    if (block_scales->scales.numel() != grid_rows * grid_cols || !detail::is_float_type(block_scales->scales.type)) {
      return make_status(StatusCode::invalid_argument, "block scales do not match the weight");
    }
    block_scale.resize(static_cast<std::size_t>(grid_rows * grid_cols));
    detail::decode_run(block_scales->scales.type, block_scales->scales.bytes.data(), grid_rows * grid_cols,
                       block_scale.data());
  }
  const std::vector<float> deq = dequantize(matrix);
  std::vector<float> row(static_cast<std::size_t>(cols));
  const std::size_t element_bytes = element_size(weight.type);
  double error_sq = 0.0, norm_sq = 0.0, max_abs = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    detail::decode_run(weight.type, weight.bytes.data() + static_cast<std::size_t>(r * cols) * element_bytes, cols,
                       row.data());
    for (std::int64_t c = 0; c < cols; ++c) {
      double w = row[static_cast<std::size_t>(c)];
      if (fp8) {
        w *= block_scale[static_cast<std::size_t>((r / block_scales->block_rows) * grid_cols + c / block_scales->block_cols)];
      }
      const std::int64_t k = k_by_n ? r : c, n = k_by_n ? c : r;
      const double diff = w - static_cast<double>(deq[static_cast<std::size_t>(k * matrix.n + n)]);
      error_sq += diff * diff;
      norm_sq += w * w;
      max_abs = std::max(max_abs, std::fabs(diff));
    }
  }
  return QuantizationError{norm_sq > 0.0 ? std::sqrt(error_sq / norm_sq) : 0.0, max_abs};
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
