#pragma once
/// \file
/// \brief Element types and tensor views shared by the INT4 quantizer, the checkpoint
/// converters and the safetensors reader/writer.
///
/// A `TensorView` borrows bytes (for example straight out of a memory-mapped .safetensors
/// file, so no alignment is assumed); a `Tensor` owns them. Shapes are row-major, outermost
/// dimension first, as safetensors and PyTorch store them.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

/// Element types a checkpoint may hold (the safetensors dtype names in the comments).
enum class ElementType : std::uint8_t {
  float64,      ///< "F64"
  float32,      ///< "F32"
  float16,      ///< "F16"  IEEE binary16
  bfloat16,     ///< "BF16"
  float8_e4m3,  ///< "F8_E4M3" OCP e4m3fn (max 448, no infinities)
  float8_e5m2,  ///< "F8_E5M2"
  int64,        ///< "I64"
  int32,        ///< "I32"
  int16,        ///< "I16"
  int8,         ///< "I8"
  uint64,       ///< "U64"
  uint32,       ///< "U32"
  uint16,       ///< "U16"
  uint8,        ///< "U8"
  boolean,      ///< "BOOL"
};

constexpr std::size_t element_size(ElementType type) noexcept {
  switch (type) {
    case ElementType::float64: case ElementType::int64: case ElementType::uint64: return 8;
    case ElementType::float32: case ElementType::int32: case ElementType::uint32: return 4;
    case ElementType::float16: case ElementType::bfloat16: case ElementType::int16:
    case ElementType::uint16: return 2;
    case ElementType::float8_e4m3: case ElementType::float8_e5m2: case ElementType::int8:
    case ElementType::uint8: case ElementType::boolean: return 1;
  }
  return 0;
}

/// The safetensors spelling ("BF16", "I32", ...).
constexpr std::string_view safetensors_name(ElementType type) noexcept {
  switch (type) {
    case ElementType::float64: return "F64";
    case ElementType::float32: return "F32";
    case ElementType::float16: return "F16";
    case ElementType::bfloat16: return "BF16";
    case ElementType::float8_e4m3: return "F8_E4M3";
    case ElementType::float8_e5m2: return "F8_E5M2";
    case ElementType::int64: return "I64";
    case ElementType::int32: return "I32";
    case ElementType::int16: return "I16";
    case ElementType::int8: return "I8";
    case ElementType::uint64: return "U64";
    case ElementType::uint32: return "U32";
    case ElementType::uint16: return "U16";
    case ElementType::uint8: return "U8";
    case ElementType::boolean: return "BOOL";
  }
  return "?";
}

constexpr std::optional<ElementType> element_type_from_safetensors_name(std::string_view name) noexcept {
  for (auto type : {ElementType::float64, ElementType::float32, ElementType::float16,
                    ElementType::bfloat16, ElementType::float8_e4m3, ElementType::float8_e5m2,
                    ElementType::int64, ElementType::int32, ElementType::int16, ElementType::int8,
                    ElementType::uint64, ElementType::uint32, ElementType::uint16,
                    ElementType::uint8, ElementType::boolean}) {
    if (safetensors_name(type) == name) return type;
  }
  return std::nullopt;
}

/// Number of elements of a shape (1 for a scalar, shape {}).
inline std::int64_t element_count(std::span<const std::int64_t> shape) noexcept {
  std::int64_t count = 1;
  for (auto extent : shape) count *= extent;
  return count;
}

/// Borrowed, possibly unaligned, row-major tensor bytes.
struct TensorView {
  ElementType type = ElementType::float32;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> bytes;

  std::int64_t numel() const noexcept { return element_count(shape); }
  /// Element i read as T (memcpy: the bytes need not be aligned). T's size must match.
  template <class T>
  T at(std::int64_t i) const noexcept {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    std::memcpy(&value, bytes.data() + static_cast<std::size_t>(i) * sizeof(T), sizeof(T));
    return value;
  }
};

/// Owned row-major tensor bytes (what the exporters produce).
struct Tensor {
  ElementType type = ElementType::float32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> bytes;

  Tensor() = default;
  Tensor(ElementType element_type, std::vector<std::int64_t> tensor_shape)
      : type(element_type),
        shape(std::move(tensor_shape)),
        bytes(static_cast<std::size_t>(element_count(shape)) * element_size(element_type)) {}

  std::int64_t numel() const noexcept { return element_count(shape); }
  TensorView view() const { return TensorView{type, shape, std::span<const std::byte>(bytes)}; }
  template <class T>
  void set(std::int64_t i, T value) noexcept {
    static_assert(std::is_trivially_copyable_v<T>);
    std::memcpy(bytes.data() + static_cast<std::size_t>(i) * sizeof(T), &value, sizeof(T));
  }
  template <class T>
  T at(std::int64_t i) const noexcept {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    std::memcpy(&value, bytes.data() + static_cast<std::size_t>(i) * sizeof(T), sizeof(T));
    return value;
  }
};

}  // namespace int4
SLIMSERVE_NAMESPACE_END
