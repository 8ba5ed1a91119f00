#pragma once
// Helpers shared by the INT4 host tests: tensors from vectors, and reference element
// encoders written from the format definitions (independent of the library's converters).

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "slimserve/int4/tensor.hpp"

namespace int4_test {

namespace int4 = slimserve::int4;

template <class T>
int4::Tensor make_tensor(int4::ElementType type, std::vector<std::int64_t> shape,
                         const std::vector<T>& values) {
  int4::Tensor tensor(type, std::move(shape));
  REQUIRE(tensor.bytes.size() == values.size() * sizeof(T));
  std::memcpy(tensor.bytes.data(), values.data(), tensor.bytes.size());
  return tensor;
}

/// bfloat16 bits of a float that is exactly a bfloat16 (low 16 bits zero).
inline std::uint16_t exact_bf16_bits(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  REQUIRE((bits & 0xFFFFu) == 0u);
  return static_cast<std::uint16_t>(bits >> 16);
}

/// IEEE half bits of a float that is exactly a half (checked).
inline std::uint16_t exact_fp16_bits(float value) {
  const std::uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  if (std::fabs(value) < 0x1p-14f) {  // zero or subnormal: a multiple of 2^-24
    const double units = std::fabs(static_cast<double>(value)) * 16777216.0;
    REQUIRE(units == std::floor(units));
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(units));
  }
  int exponent = 0;
  const double fraction = std::frexp(static_cast<double>(std::fabs(value)), &exponent);  // [0.5, 1)
  const int biased = exponent - 1 + 15;
  REQUIRE(biased >= 1);
  REQUIRE(biased <= 30);
  const double mantissa = (fraction * 2.0 - 1.0) * 1024.0;
  REQUIRE(mantissa == std::floor(mantissa));
  const auto bits = static_cast<std::uint16_t>((biased << 10) | static_cast<int>(mantissa));
  return static_cast<std::uint16_t>(value < 0 ? (bits | 0x8000) : bits);
}

/// Value of an OCP e4m3fn byte (not NaN), from the definition: bias 7, subnormals at e = 0.
inline double e4m3_value(std::uint8_t bits) {
  const int e = (bits >> 3) & 15;
  const int m = bits & 7;
  const double magnitude = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
  return (bits & 0x80) ? -magnitude : magnitude;
}

}  // namespace int4_test
