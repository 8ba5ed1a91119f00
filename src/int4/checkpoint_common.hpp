#pragma once
// Internal: checks and conversions shared by the GPTQ, AWQ and compressed-tensors converters.

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "element_convert.hpp"
#include "slimserve/int4/quantize.hpp"
#include "slimserve/int4/tensor.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4::detail {

inline std::string shape_string(std::span<const std::int64_t> shape) {
  std::ostringstream text;
  text << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) text << (i ? ", " : "") << shape[i];
  text << ']';
  return text.str();
}

/// data_loss unless `tensor` has one of `types`, exactly `shape`, and the bytes for it.
inline Status expect_tensor(const TensorView& tensor, std::string_view name,
                            std::initializer_list<ElementType> types,
                            std::initializer_list<std::int64_t> shape) {
  bool type_ok = false;
  for (auto type : types) type_ok |= tensor.type == type;
  if (!type_ok) {
    std::string allowed;
    for (auto type : types) (allowed += allowed.empty() ? "" : " or ") += safetensors_name(type);
    return make_status(StatusCode::data_loss, name, " has dtype ", safetensors_name(tensor.type),
                       ", expected ", allowed);
  }
  const std::vector<std::int64_t> expected(shape);
  if (tensor.shape != expected) {
    return make_status(StatusCode::data_loss, name, " has shape ", shape_string(tensor.shape),
                       ", expected ", shape_string(expected));
  }
  const auto bytes = static_cast<std::size_t>(tensor.numel()) * element_size(tensor.type);
  if (tensor.bytes.size() != bytes) {
    return make_status(StatusCode::data_loss, name, " holds ", tensor.bytes.size(),
                       " bytes, its shape needs ", bytes);
  }
  return Status::success();
}

/// data_loss unless `tensor` is 2-D with a given dtype; returns through rows/cols.
inline Status expect_matrix(const TensorView& tensor, std::string_view name,
                            std::initializer_list<ElementType> types, std::int64_t& rows,
                            std::int64_t& cols) {
  if (tensor.shape.size() != 2) {
    return make_status(StatusCode::data_loss, name, " has shape ", shape_string(tensor.shape),
                       ", expected 2 dimensions");
  }
  rows = tensor.shape[0];
  cols = tensor.shape[1];
  return expect_tensor(tensor, name, types, {rows, cols});
}

inline std::uint32_t packed_word(const TensorView& tensor, std::int64_t i) noexcept {
  return tensor.at<std::uint32_t>(i);  // I32 and U32 alike: only the bits matter
}

inline std::uint32_t nibble(std::uint32_t word, std::int64_t index) noexcept {
  return (word >> (4 * index)) & 0xFu;
}

/// Group size from a checkpoint config (-1 = per-channel) checked against K.
inline Result<std::int64_t> resolve_group_size(std::int64_t group_size, std::int64_t k,
                                               std::string_view format) {
  const std::int64_t rows = group_size == -1 || group_size == kPerChannel ? k : group_size;
  if (rows <= 0) {
    return make_status(StatusCode::data_loss, format, " group_size ", group_size, " is not positive");
  }
  if (k % 8 != 0 || k % rows != 0 || (rows % 8 != 0 && rows != k)) {
    return make_status(StatusCode::unsupported, format, ": K = ", k, " with group_size ", group_size,
                       " is not representable (K must be a multiple of 8 and of the group size,"
                       " the group size a multiple of 8)");
  }
  return rows;
}

/// Scales from a [rows, cols] float tensor into `out` as [G, N]; `transposed` means the tensor
/// is [N, G]. data_loss for a non-finite or non-positive scale.
inline Status read_scales(const TensorView& tensor, std::string_view name, bool transposed,
                          std::int64_t groups, std::int64_t n, std::vector<float>& out) {
  out.resize(static_cast<std::size_t>(groups * n));
  std::vector<float> raw(out.size());
  decode_run(tensor.type, tensor.bytes.data(), static_cast<std::int64_t>(raw.size()), raw.data());
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t c = 0; c < n; ++c) {
      const float scale = transposed ? raw[c * groups + g] : raw[g * n + c];
      if (!std::isfinite(scale) || !(scale > 0.0f)) {
        return make_status(StatusCode::data_loss, name, "[", transposed ? c : g, ", ",
                           transposed ? g : c, "] = ", scale, " is not a finite positive scale");
      }
      out[g * n + c] = scale;
    }
  }
  return Status::success();
}

/// Checks g_idx (I32 [K], each in [0, G)) and, when it is not k / group_size, stores it as
/// row_group. Without act-order any other mapping contradicts the group size: data_loss.
inline Status read_g_idx(const TensorView& g_idx, std::string_view name, bool act_order,
                         QuantizedMatrix& matrix) {
  SLIMSERVE_RETURN_IF_ERROR(expect_tensor(g_idx, name, {ElementType::int32}, {matrix.k}));
  bool trivial = true;
  std::vector<std::int32_t> rows(static_cast<std::size_t>(matrix.k));
  for (std::int64_t r = 0; r < matrix.k; ++r) {
    const auto group = g_idx.at<std::int32_t>(r);
    if (group < 0 || group >= matrix.num_groups()) {
      return make_status(StatusCode::data_loss, name, "[", r, "] = ", group, " is outside [0, ",
                         matrix.num_groups(), ")");
    }
    if (group != r / matrix.group_size) {
      if (!act_order) {
        return make_status(StatusCode::data_loss, name, "[", r, "] = ", group, " but group_size ",
                           matrix.group_size, " without act-order (desc_act false) puts row ", r,
                           " in group ", r / matrix.group_size);
      }
      trivial = false;
    }
    rows[static_cast<std::size_t>(r)] = group;
  }
  if (!trivial) matrix.row_group = std::move(rows);
  return Status::success();
}

/// A symmetric config promises zero 8 everywhere: anything else is data_loss.
inline Status check_symmetric_zeros(const QuantizedMatrix& matrix, std::string_view hint) {
  for (std::size_t i = 0; i < matrix.zeros.size(); ++i) {
    if (matrix.zeros[i] != 8) {
      return make_status(StatusCode::data_loss, "config says symmetric but the zero point of group ",
                         static_cast<std::int64_t>(i) / matrix.n, ", column ",
                         static_cast<std::int64_t>(i) % matrix.n, " is ", int{matrix.zeros[i]},
                         ", not 8", hint);
    }
  }
  return Status::success();
}

/// Scales as a [G, N] (or [N, G] when transposed) tensor of `type`; invalid_argument when a
/// scale does not survive the conversion (overflow, or underflow to 0).
inline Result<Tensor> write_scales(const QuantizedMatrix& matrix, ElementType type, bool transposed) {
  if (type != ElementType::float32 && type != ElementType::float16 && type != ElementType::bfloat16) {
    return make_status(StatusCode::invalid_argument, "scale type must be F32, F16 or BF16, got ",
                       safetensors_name(type));
  }
  const std::int64_t groups = matrix.num_groups(), n = matrix.n;
  Tensor tensor(type, transposed ? std::vector<std::int64_t>{n, groups} : std::vector<std::int64_t>{groups, n});
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t c = 0; c < n; ++c) {
      const float scale = matrix.scales[static_cast<std::size_t>(g * n + c)];
      const float stored = round_to(type, scale);
      if (!std::isfinite(stored) || !(stored > 0.0f)) {
        return make_status(StatusCode::invalid_argument, "scale ", scale, " (group ", g, ", column ", c,
                           ") is not representable as ", safetensors_name(type));
      }
      encode_float(tensor, transposed ? c * groups + g : g * n + c, scale);
    }
  }
  return tensor;
}

/// A QuantizedMatrix with its shape fields set and its arrays sized.
inline QuantizedMatrix empty_matrix(std::int64_t k, std::int64_t n, std::int64_t group_size, bool symmetric) {
  QuantizedMatrix matrix;
  matrix.k = k;
  matrix.n = n;
  matrix.group_size = group_size;
  matrix.symmetric = symmetric;
  matrix.codes.resize(static_cast<std::size_t>(k / 8 * n));
  matrix.scales.resize(static_cast<std::size_t>(k / group_size * n));
  matrix.zeros.resize(matrix.scales.size());
  return matrix;
}

}  // namespace int4::detail
SLIMSERVE_NAMESPACE_END
