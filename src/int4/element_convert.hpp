#pragma once
// Internal: the one place that turns checkpoint elements into float and back. Everything
// else in the INT4 host code converts through decode_run / round_to / encode_float.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/int4/tensor.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4::detail {

// Element conversions come from the project's numeric formats (round-to-nearest-even,
// branch-free decodes that vectorize); these wrappers only adapt raw bits.
inline float bf16_bits_to_float(std::uint16_t bits) noexcept { return to_float(bf16::from_bits(bits)); }
/// FP16 -> float with masks instead of branches, so decode loops vectorize (the formats'
/// scalar fp16 decode does not, on the host); exhaustively equal to to_float(fp16), see the
/// INT4 tests.
inline float fp16_bits_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t magnitude = bits & 0x7FFFu;
  const std::uint32_t normal = (magnitude << 13) + (112u << 23);  // rebias 15 -> 127
  const std::uint32_t special = normal + (112u << 23);             // exponent 31 -> 255
  const std::uint32_t subnormal =
      std::bit_cast<std::uint32_t>(static_cast<float>(magnitude) * 0x1p-24f);  // exact
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(magnitude >= 0x7C00u);
  const std::uint32_t is_normal = 0u - static_cast<std::uint32_t>(magnitude >= 0x0400u);
  const std::uint32_t body = (special & is_special) | (normal & is_normal & ~is_special) |
                             (subnormal & ~is_normal);
  return std::bit_cast<float>(sign | body);
}
inline float e4m3_bits_to_float(std::uint8_t bits) noexcept { return to_float(fp8_e4m3::from_bits(bits)); }
inline float e5m2_bits_to_float(std::uint8_t bits) noexcept { return to_float(fp8_e5m2::from_bits(bits)); }
inline std::uint16_t float_to_bf16_bits(float value) noexcept { return from_float<bf16>(value).bits; }
inline std::uint16_t float_to_fp16_bits(float value) noexcept { return from_float<fp16>(value).bits; }

/// True for the types the quantizer and the scale readers accept as real numbers.
constexpr bool is_float_type(ElementType type) noexcept {
  return type == ElementType::float32 || type == ElementType::float16 ||
         type == ElementType::bfloat16 || type == ElementType::float8_e4m3 ||
         type == ElementType::float8_e5m2 || type == ElementType::float64;
}

/// `count` elements of format T at `src` (any alignment) as float, one scalar conversion
/// each. (Per-run calls of the formats' bulk `dequantize` cost ~10 us each here, far more than
/// the 32..128-element runs themselves.)
template <class T>
void decode_format_run(const std::byte* src, std::int64_t count, float* dst) noexcept {
  for (std::int64_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, src + static_cast<std::size_t>(i) * sizeof(T), sizeof(T));
    dst[i] = to_float(value);
  }
}

/// Converts `count` contiguous elements starting at `src` (any alignment) to float.
/// Precondition: is_float_type(type).
inline void decode_run(ElementType type, const std::byte* src, std::int64_t count,
                       float* dst) noexcept {
  switch (type) {
    case ElementType::float32:
      std::memcpy(dst, src, static_cast<std::size_t>(count) * sizeof(float));
      return;
    case ElementType::bfloat16: decode_format_run<bf16>(src, count, dst); return;
    case ElementType::float16:
      for (std::int64_t i = 0; i < count; ++i) {
        std::uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        dst[i] = fp16_bits_to_float(bits);
      }
      return;
    case ElementType::float8_e4m3: {
      static const auto table = [] {  // a 256-entry lookup beats the per-element decode
        struct Table { float value[256]; } t{};
        for (int b = 0; b < 256; ++b) t.value[b] = to_float(fp8_e4m3::from_bits(static_cast<std::uint8_t>(b)));
        return t;
      }();
      for (std::int64_t i = 0; i < count; ++i) dst[i] = table.value[static_cast<std::uint8_t>(src[i])];
      return;
    }
    case ElementType::float8_e5m2: decode_format_run<fp8_e5m2>(src, count, dst); return;
    case ElementType::float64:
      for (std::int64_t i = 0; i < count; ++i) {
        double value;
        std::memcpy(&value, src + 8 * i, 8);
        dst[i] = static_cast<float>(value);
      }
      return;
    default:
      return;
  }
}

/// Element i of a float-typed view as float.
inline float element_as_float(const TensorView& view, std::int64_t i) noexcept {
  float value = 0.0f;
  const std::size_t size = element_size(view.type);
  decode_run(view.type, view.bytes.data() + static_cast<std::size_t>(i) * size, 1, &value);
  return value;
}

/// `value` rounded to the nearest value of `type` (float32, float16 or bfloat16), as float.
inline float round_to(ElementType type, float value) noexcept {
  switch (type) {
    case ElementType::float16: return fp16_bits_to_float(float_to_fp16_bits(value));
    case ElementType::bfloat16: return bf16_bits_to_float(float_to_bf16_bits(value));
    default: return value;
  }
}

/// The smallest value of `type` (float32, float16 or bfloat16) that is >= `value` (> 0).
inline float round_up_to(ElementType type, float value) noexcept {
  switch (type) {
    case ElementType::float16: {
      std::uint16_t bits = float_to_fp16_bits(value);
      if (fp16_bits_to_float(bits) < value) ++bits;  // positive halves order like their bits
      return fp16_bits_to_float(bits);
    }
    case ElementType::bfloat16: {
      std::uint16_t bits = float_to_bf16_bits(value);
      if (bf16_bits_to_float(bits) < value) ++bits;
      return bf16_bits_to_float(bits);
    }
    default: return value;
  }
}

/// Stores `value` as element i of a float32/float16/bfloat16 tensor.
inline void encode_float(Tensor& tensor, std::int64_t i, float value) noexcept {
  switch (tensor.type) {
    case ElementType::float16: tensor.set(i, float_to_fp16_bits(value)); return;
    case ElementType::bfloat16: tensor.set(i, float_to_bf16_bits(value)); return;
    default: tensor.set(i, value); return;
  }
}

}  // namespace int4::detail
SLIMSERVE_NAMESPACE_END
