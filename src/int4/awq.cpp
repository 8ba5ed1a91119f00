// AWQ (AutoAWQ GEMM layout) <-> QuantizedMatrix. AWQ packs along N, with nibble i of a word
// holding column 8c + kAwqNibbleOrder[i]; the interchange packs along K in natural order.

#include "checkpoint_common.hpp"
#include "slimserve/int4/checkpoint_formats.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

Result<QuantizedMatrix> import_awq(const AwqTensorView& tensors, std::int64_t group_size) {
  std::int64_t k = 0, packed_cols = 0;
  SLIMSERVE_RETURN_IF_ERROR(detail::expect_matrix(tensors.qweight, "AWQ qweight",
                                                  {ElementType::int32, ElementType::uint32}, k, packed_cols));
  if (k <= 0 || packed_cols <= 0) {
    return make_status(StatusCode::data_loss, "AWQ qweight is empty: ", detail::shape_string(tensors.qweight.shape));
  }
  const std::int64_t n = packed_cols * 8;
  auto group = detail::resolve_group_size(group_size, k, "AWQ");
  if (!group.ok()) return group.status();
  const std::int64_t groups = k / *group;
  SLIMSERVE_RETURN_IF_ERROR(detail::expect_tensor(
      tensors.scales, "AWQ scales", {ElementType::float16, ElementType::bfloat16, ElementType::float32}, {groups, n}));
  SLIMSERVE_RETURN_IF_ERROR(detail::expect_tensor(tensors.qzeros, "AWQ qzeros",
                                                  {ElementType::int32, ElementType::uint32}, {groups, packed_cols}));

  QuantizedMatrix matrix = detail::empty_matrix(k, n, *group, /*symmetric=*/false);
  SLIMSERVE_RETURN_IF_ERROR(detail::read_scales(tensors.scales, "AWQ scales", false, groups, n, matrix.scales));
  // Codes: AWQ word (r, w) -> 8 columns of row r; interchange word (r / 8, col), nibble r % 8.
  for (std::int64_t r = 0; r < k; ++r) {
    const int shift = static_cast<int>(4 * (r % 8));
    std::uint32_t* dst = matrix.codes.data() + (r / 8) * n;
    for (std::int64_t w = 0; w < packed_cols; ++w) {
      const std::uint32_t word = detail::packed_word(tensors.qweight, r * packed_cols + w);
      for (int i = 0; i < 8; ++i) {
        dst[w * 8 + kAwqNibbleOrder[static_cast<std::size_t>(i)]] |= detail::nibble(word, i) << shift;
      }
    }
  }
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t w = 0; w < packed_cols; ++w) {
      const std::uint32_t word = detail::packed_word(tensors.qzeros, g * packed_cols + w);
      for (int i = 0; i < 8; ++i) {
        matrix.zeros[static_cast<std::size_t>(g * n + w * 8 + kAwqNibbleOrder[static_cast<std::size_t>(i)])] =
            static_cast<std::uint8_t>(detail::nibble(word, i));
      }
    }
  }
  return matrix;
}

Result<AwqTensors> export_awq(const QuantizedMatrix& matrix, ElementType scale_type) {
  SLIMSERVE_RETURN_IF_ERROR(validate(matrix));
  const std::int64_t k = matrix.k, n = matrix.n, groups = matrix.num_groups();
  if (n % 8 != 0) {
    return make_status(StatusCode::invalid_argument, "AWQ packs 8 columns per word: N = ", n,
                       " is not a multiple of 8");
  }
  for (std::int64_t r = 0; r < k && !matrix.row_group.empty(); ++r) {
    if (matrix.group_of_row(r) != r / matrix.group_size) {
      return make_status(StatusCode::invalid_argument, "AWQ has no g_idx: row ", r, " is in group ",
                         matrix.group_of_row(r), ", not ", r / matrix.group_size, " (act-order)");
    }
  }
  const std::int64_t packed_cols = n / 8;
  AwqTensors out;
  auto scales = detail::write_scales(matrix, scale_type, false);
  if (!scales.ok()) return scales.status();
  out.scales = std::move(scales).value();

  out.qweight = Tensor(ElementType::int32, {k, packed_cols});
  for (std::int64_t r = 0; r < k; ++r) {
    for (std::int64_t w = 0; w < packed_cols; ++w) {
      std::uint32_t word = 0;
      for (int i = 0; i < 8; ++i) {
        word |= matrix.code(r, w * 8 + kAwqNibbleOrder[static_cast<std::size_t>(i)]) << (4 * i);
      }
      out.qweight.set(r * packed_cols + w, word);
    }
  }
  out.qzeros = Tensor(ElementType::int32, {groups, packed_cols});
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t w = 0; w < packed_cols; ++w) {
      std::uint32_t word = 0;
      for (int i = 0; i < 8; ++i) {
        const std::uint32_t zero =
            matrix.zeros[static_cast<std::size_t>(g * n + w * 8 + kAwqNibbleOrder[static_cast<std::size_t>(i)])];
        word |= zero << (4 * i);
      }
      out.qzeros.set(g * packed_cols + w, word);
    }
  }
  return out;
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
