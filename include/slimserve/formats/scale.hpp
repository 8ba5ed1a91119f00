#pragma once
/// \file
/// \brief Quantization scales: validation and amax -> scale, per tensor, per row (or head
/// vector) and per group, on the host.
///
/// Convention: `quantized = from_float<T>(x / scale)` and `x ~= to_float(quantized) * scale`,
/// with `scale = amax / format_max` so the largest magnitude lands on the format's largest
/// finite value. A scale is valid when it is finite and > 0; everything that produces or
/// accepts a scale checks this and says which value was wrong.
///
/// Special cases: an all-zero input (amax == 0) gets scale 1 (any positive scale is exact for
/// zeros); an amax so small that amax / format_max would underflow below the smallest normal
/// float gets the smallest normal float (dividing by it cannot overflow the format then).
/// Non-finite input values (NaN, inf) are rejected: their scale would be meaningless.

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>

#include "slimserve/config.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN

/// ok when `scale` is finite and > 0; otherwise invalid_argument naming the value.
inline Status validate_scale(float scale) {
  if (!std::isfinite(scale) || !(scale > 0.0f)) {
    return make_status(StatusCode::invalid_argument, "scale must be finite and > 0, got ", scale);
  }
  return {};
}

namespace detail {
inline Status check_format_max(float format_max) {
  if (!std::isfinite(format_max) || !(format_max > 0.0f)) {
    return make_status(StatusCode::invalid_argument,
                       "format_max must be finite and > 0, got ", format_max);
  }
  return {};
}
}  // namespace detail

/// Scale that maps `amax` (the largest |x|, finite, >= 0) onto `format_max` (finite, > 0).
inline Result<float> scale_from_amax(float amax, float format_max) {
  SLIMSERVE_RETURN_IF_ERROR(detail::check_format_max(format_max));
  if (!std::isfinite(amax) || amax < 0.0f) {
    return make_status(StatusCode::invalid_argument, "amax must be finite and >= 0, got ", amax);
  }
  if (amax == 0.0f) return 1.0f;
  const float scale = amax / format_max;
  return scale < std::numeric_limits<float>::min() ? std::numeric_limits<float>::min() : scale;
}

/// `scale_from_amax(amax, format_traits<T>::max_finite)`.
template <float_format T>
Result<float> scale_from_amax(float amax) {
  return scale_from_amax(amax, format_traits<T>::max_finite);
}

namespace detail {
/// Largest |x| of `values`; an error naming the first non-finite element (index offset by
/// `first_index` for messages about a slice).
template <class In>
Result<float> checked_amax(std::span<const In> values, std::size_t first_index) {
  float amax = 0.0f;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float v = to_float(values[i]);
    if (!std::isfinite(v)) {
      return make_status(StatusCode::invalid_argument, "element ", first_index + i,
                         " is not finite (", v, "); cannot derive a scale");
    }
    amax = std::fmax(amax, std::fabs(v));
  }
  return amax;
}
/// Largest |x| of values already known to be finite.
template <class In>
float amax_unchecked(std::span<const In> values) {
  float amax = 0.0f;
  for (const In& value : values) amax = std::fmax(amax, std::fabs(to_float(value)));
  return amax;
}
}  // namespace detail

/// Largest |x| of `values` (float, bf16 or fp16); rejects non-finite elements.
template <class In>
Result<float> amax_of(std::span<const In> values) {
  return detail::checked_amax(values, 0);
}

/// One scale for the whole tensor.
template <class In>
Result<float> tensor_scale(std::span<const In> values, float format_max) {
  Result<float> amax = detail::checked_amax(values, 0);
  if (!amax) return amax.status();
  return scale_from_amax(*amax, format_max);
}

/// One scale per contiguous group of `group_size` elements: `values` is
/// [num_groups, group_size] and `scales` is [num_groups]. Per row: group_size = row length;
/// per head vector of a KV tensor [tokens, heads, head_dim]: group_size = head_dim; per
/// group along a row of a [rows, cols] matrix: group_size divides cols and the groups of a
/// row are consecutive. Nothing is written unless every scale is valid.
template <class In>
Status group_scales(std::span<const In> values, std::size_t group_size, float format_max,
                    std::span<float> scales) {
  if (group_size == 0) {
    return make_status(StatusCode::invalid_argument, "group_size must be > 0");
  }
  if (values.size() % group_size != 0) {
    return make_status(StatusCode::invalid_argument, "tensor of ", values.size(),
                       " elements is not a whole number of groups of ", group_size);
  }
  const std::size_t num_groups = values.size() / group_size;
  if (scales.size() != num_groups) {
    return make_status(StatusCode::invalid_argument, "scales holds ", scales.size(),
                       " entries; the tensor has ", num_groups, " groups of ", group_size);
  }
  SLIMSERVE_RETURN_IF_ERROR(detail::check_format_max(format_max));
  // Validate everything before writing anything.
  Result<float> amax_all = detail::checked_amax(values, 0);
  if (!amax_all) return amax_all.status();
  for (std::size_t g = 0; g < num_groups; ++g) {
    const float amax = detail::amax_unchecked(values.subspan(g * group_size, group_size));
    scales[g] = *scale_from_amax(amax, format_max);
  }
  return {};
}

/// One scale per row of a row-major [rows, row_length] tensor (= group_scales per row).
template <class In>
Status row_scales(std::span<const In> values, std::size_t row_length, float format_max,
                  std::span<float> scales) {
  return group_scales(values, row_length, format_max, scales);
}

/// One scale per head of a KV tensor [tokens, num_heads, head_dim] (amax over every token
/// and channel of the head; per-tensor-per-head scaling). `scales` is [num_heads].
template <class In>
Status head_scales(std::span<const In> values, std::size_t num_heads, std::size_t head_dim,
                   float format_max, std::span<float> scales) {
  if (num_heads == 0 || head_dim == 0) {
    return make_status(StatusCode::invalid_argument, "num_heads (", num_heads,
                       ") and head_dim (", head_dim, ") must be > 0");
  }
  const std::size_t token_stride = num_heads * head_dim;
  if (values.size() % token_stride != 0) {
    return make_status(StatusCode::invalid_argument, "tensor of ", values.size(),
                       " elements is not [tokens, ", num_heads, ", ", head_dim, "]");
  }
  if (scales.size() != num_heads) {
    return make_status(StatusCode::invalid_argument, "scales holds ", scales.size(),
                       " entries for ", num_heads, " heads");
  }
  SLIMSERVE_RETURN_IF_ERROR(detail::check_format_max(format_max));
  Result<float> amax_all = detail::checked_amax(values, 0);
  if (!amax_all) return amax_all.status();
  const std::size_t num_tokens = values.size() / token_stride;
  for (std::size_t h = 0; h < num_heads; ++h) {
    float amax = 0.0f;
    for (std::size_t t = 0; t < num_tokens; ++t) {
      amax = std::fmax(amax, detail::amax_unchecked(values.subspan(t * token_stride + h * head_dim, head_dim)));
    }
    scales[h] = *scale_from_amax(amax, format_max);
  }
  return {};
}

SLIMSERVE_NAMESPACE_END
