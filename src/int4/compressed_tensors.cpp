// compressed-tensors `pack-quantized` <-> QuantizedMatrix. weight_packed is [N, K/8] packed
// along K, so each of its words is an interchange word: the conversion is a word transpose.
// Its nibbles are signed codes + 8 = the unsigned codes; zero points likewise.

#include "checkpoint_common.hpp"
#include "slimserve/int4/checkpoint_formats.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {
namespace {

/// K from weight_shape ({N, K}, I32 or I64), checked against weight_packed's [N, ceil(K/8)].
Result<std::int64_t> read_weight_shape(const TensorView& shape, std::int64_t n, std::int64_t packed_k) {
  SLIMSERVE_RETURN_IF_ERROR(detail::expect_tensor(shape, "compressed-tensors weight_shape",
                                                  {ElementType::int32, ElementType::int64}, {2}));
  auto value = [&](std::int64_t i) {
    return shape.type == ElementType::int32 ? std::int64_t{shape.at<std::int32_t>(i)} : shape.at<std::int64_t>(i);
  };
  const std::int64_t rows = value(0), cols = value(1);
  if (rows != n || cols <= 0 || (cols + 7) / 8 != packed_k) {
    return make_status(StatusCode::data_loss, "compressed-tensors weight_shape [", rows, ", ", cols,
                       "] contradicts weight_packed [", n, ", ", packed_k, "] (expected [", n,
                       ", K] with ceil(K / 8) = ", packed_k, ")");
  }
  return cols;
}

/// Zero points (unsigned, 0..15) into matrix.zeros from the packed I32 [ceil(N/8), G] form or
/// the older unpacked I8 [N, G] form.
Status read_zero_points(const TensorView& zp, QuantizedMatrix& matrix) {
  const std::int64_t n = matrix.n, groups = matrix.num_groups();
  if (zp.type == ElementType::int8) {
    SLIMSERVE_RETURN_IF_ERROR(detail::expect_tensor(zp, "compressed-tensors weight_zero_point",
                                                    {ElementType::int8}, {n, groups}));
    for (std::int64_t c = 0; c < n; ++c) {
      for (std::int64_t g = 0; g < groups; ++g) {
        const int value = zp.at<std::int8_t>(c * groups + g);
        if (value < -8 || value > 7) {
          return make_status(StatusCode::data_loss, "compressed-tensors weight_zero_point[", c, ", ", g,
                             "] = ", value, " is outside the int4 range -8..7");
        }
        matrix.zeros[static_cast<std::size_t>(g * n + c)] = static_cast<std::uint8_t>(value + 8);
      }
    }
    return Status::success();
  }
  SLIMSERVE_RETURN_IF_ERROR(detail::expect_tensor(zp, "compressed-tensors weight_zero_point",
                                                  {ElementType::int32, ElementType::uint32},
                                                  {(n + 7) / 8, groups}));
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t c = 0; c < n; ++c) {
      const std::uint32_t word = detail::packed_word(zp, (c / 8) * groups + g);
      matrix.zeros[static_cast<std::size_t>(g * n + c)] = static_cast<std::uint8_t>(detail::nibble(word, c % 8));
    }
  }
  return Status::success();
}

}  // namespace

Result<QuantizedMatrix> import_compressed_tensors(const CompressedTensorsView& tensors,
                                                  const CompressedTensorsConfig& config) {
  std::int64_t n = 0, packed_k = 0;
  SLIMSERVE_RETURN_IF_ERROR(detail::expect_matrix(tensors.weight_packed, "compressed-tensors weight_packed",
                                                  {ElementType::int32, ElementType::uint32}, n, packed_k));
  if (n <= 0 || packed_k <= 0) {
    return make_status(StatusCode::data_loss, "compressed-tensors weight_packed is empty: ",
                       detail::shape_string(tensors.weight_packed.shape));
  }
  std::int64_t k = packed_k * 8;
  if (tensors.weight_shape) {
    auto shape_k = read_weight_shape(*tensors.weight_shape, n, packed_k);
    if (!shape_k.ok()) return shape_k.status();
    k = *shape_k;
  }
  auto group = detail::resolve_group_size(config.group_size, k, "compressed-tensors");
  if (!group.ok()) return group.status();
  const std::int64_t groups = k / *group;
  SLIMSERVE_RETURN_IF_ERROR(detail::expect_tensor(tensors.weight_scale, "compressed-tensors weight_scale",
                                                  {ElementType::float16, ElementType::bfloat16, ElementType::float32},
                                                  {n, groups}));

  QuantizedMatrix matrix = detail::empty_matrix(k, n, *group, config.symmetric);
  for (std::int64_t c = 0; c < n; ++c) {
    for (std::int64_t w = 0; w < packed_k; ++w) {
      matrix.codes[static_cast<std::size_t>(w * n + c)] = detail::packed_word(tensors.weight_packed, c * packed_k + w);
    }
  }
  SLIMSERVE_RETURN_IF_ERROR(
      detail::read_scales(tensors.weight_scale, "compressed-tensors weight_scale", true, groups, n, matrix.scales));

  if (tensors.weight_zero_point) {
    SLIMSERVE_RETURN_IF_ERROR(read_zero_points(*tensors.weight_zero_point, matrix));
    if (config.symmetric) {
      SLIMSERVE_RETURN_IF_ERROR(detail::check_symmetric_zeros(matrix, " (signed zero point must be 0)"));
    }
  } else if (!config.symmetric) {
    return make_status(StatusCode::data_loss,
                       "compressed-tensors config is asymmetric but weight_zero_point is missing");
  } else {
    std::fill(matrix.zeros.begin(), matrix.zeros.end(), std::uint8_t{8});
  }
  if (tensors.weight_g_idx) {
    SLIMSERVE_RETURN_IF_ERROR(
        detail::read_g_idx(*tensors.weight_g_idx, "compressed-tensors weight_g_idx", /*act_order=*/true, matrix));
  }
  return matrix;
}

Result<CompressedTensors> export_compressed_tensors(const QuantizedMatrix& matrix, ElementType scale_type) {
  SLIMSERVE_RETURN_IF_ERROR(validate(matrix));
  const std::int64_t k = matrix.k, n = matrix.n, groups = matrix.num_groups();
  const std::int64_t packed_k = k / 8;
  CompressedTensors out;
  auto scales = detail::write_scales(matrix, scale_type, true);
  if (!scales.ok()) return scales.status();
  out.weight_scale = std::move(scales).value();

  out.weight_packed = Tensor(ElementType::int32, {n, packed_k});
  for (std::int64_t w = 0; w < packed_k; ++w) {
    for (std::int64_t c = 0; c < n; ++c) {
      out.weight_packed.set(c * packed_k + w, matrix.codes[static_cast<std::size_t>(w * n + c)]);
    }
  }
  out.weight_shape = Tensor(ElementType::int64, {2});
  out.weight_shape.set(0, n);
  out.weight_shape.set(1, k);

  out.has_zero_point = !matrix.symmetric;
  if (out.has_zero_point) {
    const std::int64_t zero_rows = (n + 7) / 8;
    out.weight_zero_point = Tensor(ElementType::int32, {zero_rows, groups});
    for (std::int64_t w = 0; w < zero_rows; ++w) {
      for (std::int64_t g = 0; g < groups; ++g) {
        std::uint32_t word = 0;
        for (std::int64_t j = 0; j < 8 && w * 8 + j < n; ++j) {
          word |= std::uint32_t{matrix.zeros[static_cast<std::size_t>(g * n + w * 8 + j)]} << (4 * j);
        }
        out.weight_zero_point.set(w * groups + g, word);
      }
    }
  }
  out.has_g_idx = !matrix.row_group.empty();
  if (out.has_g_idx) {
    out.weight_g_idx = Tensor(ElementType::int32, {k});
    for (std::int64_t r = 0; r < k; ++r) out.weight_g_idx.set(r, matrix.row_group[static_cast<std::size_t>(r)]);
  }
  return out;
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
