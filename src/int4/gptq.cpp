// GPTQ <-> QuantizedMatrix. GPTQ's qweight is the interchange `codes` layout word for word;
// the work is in the zero points (v1 stores zero - 1) and in g_idx.

#include <cstring>

#include "checkpoint_common.hpp"
#include "slimserve/int4/checkpoint_formats.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

Result<QuantizedMatrix> import_gptq(const GptqTensorView& tensors, const GptqConfig& config) {
  std::int64_t packed_rows = 0, n = 0;
  SLIMSERVE_RETURN_IF_ERROR(detail::expect_matrix(tensors.qweight, "GPTQ qweight",
                                                  {ElementType::int32, ElementType::uint32}, packed_rows, n));
  if (packed_rows <= 0 || n <= 0) {
    return make_status(StatusCode::data_loss, "GPTQ qweight is empty: ", detail::shape_string(tensors.qweight.shape));
  }
  const std::int64_t k = packed_rows * 8;
  auto group = detail::resolve_group_size(config.group_size, k, "GPTQ");
  if (!group.ok()) return group.status();
  const std::int64_t groups = k / *group;
  const std::int64_t zero_words = (n + 7) / 8;
  SLIMSERVE_RETURN_IF_ERROR(detail::expect_tensor(
      tensors.scales, "GPTQ scales", {ElementType::float16, ElementType::bfloat16, ElementType::float32}, {groups, n}));
  SLIMSERVE_RETURN_IF_ERROR(detail::expect_tensor(tensors.qzeros, "GPTQ qzeros",
                                                  {ElementType::int32, ElementType::uint32}, {groups, zero_words}));

  QuantizedMatrix matrix = detail::empty_matrix(k, n, *group, config.symmetric);
  std::memcpy(matrix.codes.data(), tensors.qweight.bytes.data(), tensors.qweight.bytes.size());
  SLIMSERVE_RETURN_IF_ERROR(detail::read_scales(tensors.scales, "GPTQ scales", false, groups, n, matrix.scales));

  const bool v1 = config.zero_format == GptqZeroFormat::v1_minus_one;
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t c = 0; c < n; ++c) {
      const std::uint32_t stored = detail::nibble(detail::packed_word(tensors.qzeros, g * zero_words + c / 8), c % 8);
      const std::uint32_t zero = v1 ? stored + 1 : stored;
      if (zero > 15) {
        return make_status(StatusCode::data_loss, "GPTQ v1 qzeros[", g, ", ", c / 8, "] nibble ", c % 8,
                           " is 15, i.e. zero point 16, outside 0..15 (v1 cannot store a zero point of 0)");
      }
      if (config.symmetric && zero != 8) {
        const char* hint = v1 && zero == 9 ? "; stored 8 means the file uses gptq_v2 zero points"
                           : !v1 && zero == 7 ? "; stored 7 means the file uses GPTQ v1 zero points"
                                              : "";
        return make_status(StatusCode::data_loss, "GPTQ config says sym but group ", g, ", column ", c,
                           " has zero point ", zero, " (stored ", stored, ", ", v1 ? "v1" : "v2",
                           " convention), not 8", hint);
      }
      matrix.zeros[static_cast<std::size_t>(g * n + c)] = static_cast<std::uint8_t>(zero);
    }
  }
  if (tensors.g_idx) {
    SLIMSERVE_RETURN_IF_ERROR(detail::read_g_idx(*tensors.g_idx, "GPTQ g_idx", config.desc_act, matrix));
  }
  return matrix;
}

Result<GptqTensors> export_gptq(const QuantizedMatrix& matrix, GptqZeroFormat zero_format, ElementType scale_type) {
  SLIMSERVE_RETURN_IF_ERROR(validate(matrix));
  const std::int64_t k = matrix.k, n = matrix.n, groups = matrix.num_groups();
  const std::int64_t zero_words = (n + 7) / 8;
  const bool v1 = zero_format == GptqZeroFormat::v1_minus_one;

  GptqTensors out;
  auto scales = detail::write_scales(matrix, scale_type, false);
  if (!scales.ok()) return scales.status();
  out.scales = std::move(scales).value();

  out.qweight = Tensor(ElementType::int32, {k / 8, n});
  std::memcpy(out.qweight.bytes.data(), matrix.codes.data(), out.qweight.bytes.size());

  out.qzeros = Tensor(ElementType::int32, {groups, zero_words});
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t w = 0; w < zero_words; ++w) {
      std::uint32_t word = 0;
      for (std::int64_t j = 0; j < 8 && w * 8 + j < n; ++j) {
        const std::uint32_t zero = matrix.zeros[static_cast<std::size_t>(g * n + w * 8 + j)];
        if (v1 && zero == 0) {
          return make_status(StatusCode::invalid_argument, "GPTQ v1 cannot store zero point 0 (group ", g,
                             ", column ", w * 8 + j, "); export as gptq_v2");
        }
        word |= (v1 ? zero - 1 : zero) << (4 * j);
      }
      out.qzeros.set(g * zero_words + w, word);
    }
  }

  out.g_idx = Tensor(ElementType::int32, {k});
  for (std::int64_t r = 0; r < k; ++r) out.g_idx.set(r, static_cast<std::int32_t>(matrix.group_of_row(r)));
  return out;
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
