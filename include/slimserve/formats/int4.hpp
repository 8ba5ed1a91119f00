#pragma once
/// \file
/// \brief INT4 nibbles: signed (-8..7, two's complement) and unsigned (0..15) 4-bit values,
/// packed 8 to a uint32 or 2 to a byte. Nibble j occupies bits 4j..4j+3 (element 0 lowest),
/// the order slimserve's INT4 interchange form uses.
///
/// Packing keeps the low 4 bits of each value; callers pass values in range (check with
/// `fits_int4` / `fits_uint4` where the input is untrusted). Unpacking a signed nibble
/// sign-extends it.

#include <cstdint>

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN

inline constexpr int int4_min = -8;
inline constexpr int int4_max = 7;
inline constexpr int uint4_max = 15;

SLIMSERVE_HOST_DEVICE constexpr bool fits_int4(int v) { return v >= int4_min && v <= int4_max; }
SLIMSERVE_HOST_DEVICE constexpr bool fits_uint4(int v) { return v >= 0 && v <= uint4_max; }

// ---- one nibble -----------------------------------------------------------------------------

/// The 4-bit pattern of a signed value (two's complement).
SLIMSERVE_HOST_DEVICE constexpr std::uint32_t int4_bits(int v) {
  return static_cast<std::uint32_t>(v) & 0xFu;
}
/// Sign-extends a 4-bit pattern (only the low 4 bits of `nibble` are read).
SLIMSERVE_HOST_DEVICE constexpr int int4_from_bits(std::uint32_t nibble) {
  return static_cast<int>(nibble & 0xFu) - static_cast<int>((nibble & 0x8u) << 1);
}

// ---- 8 per uint32 ---------------------------------------------------------------------------

/// Unsigned nibble j (0..7) of `word`.
SLIMSERVE_HOST_DEVICE constexpr std::uint8_t uint4_at(std::uint32_t word, int j) {
  return static_cast<std::uint8_t>((word >> (4 * j)) & 0xFu);
}
/// Signed nibble j (0..7) of `word`.
SLIMSERVE_HOST_DEVICE constexpr std::int8_t int4_at(std::uint32_t word, int j) {
  return static_cast<std::int8_t>(int4_from_bits(word >> (4 * j)));
}

SLIMSERVE_HOST_DEVICE constexpr std::uint32_t pack_uint4x8(const std::uint8_t (&values)[8]) {
  std::uint32_t word = 0;
  for (int j = 0; j < 8; ++j) word |= (static_cast<std::uint32_t>(values[j]) & 0xFu) << (4 * j);
  return word;
}
SLIMSERVE_HOST_DEVICE constexpr std::uint32_t pack_int4x8(const std::int8_t (&values)[8]) {
  std::uint32_t word = 0;
  for (int j = 0; j < 8; ++j) word |= int4_bits(values[j]) << (4 * j);
  return word;
}
SLIMSERVE_HOST_DEVICE constexpr void unpack_uint4x8(std::uint32_t word, std::uint8_t (&values)[8]) {
  for (int j = 0; j < 8; ++j) values[j] = uint4_at(word, j);
}
SLIMSERVE_HOST_DEVICE constexpr void unpack_int4x8(std::uint32_t word, std::int8_t (&values)[8]) {
  for (int j = 0; j < 8; ++j) values[j] = int4_at(word, j);
}

// ---- 2 per byte -----------------------------------------------------------------------------

/// Element 0 in the low nibble, element 1 in the high nibble.
SLIMSERVE_HOST_DEVICE constexpr std::uint8_t pack_uint4x2(std::uint8_t lo, std::uint8_t hi) {
  return static_cast<std::uint8_t>((lo & 0xFu) | ((hi & 0xFu) << 4));
}
SLIMSERVE_HOST_DEVICE constexpr std::uint8_t pack_int4x2(int lo, int hi) {
  return static_cast<std::uint8_t>(int4_bits(lo) | (int4_bits(hi) << 4));
}
SLIMSERVE_HOST_DEVICE constexpr std::uint8_t uint4_in_byte(std::uint8_t byte, int j) {
  return static_cast<std::uint8_t>((byte >> (4 * j)) & 0xFu);
}
SLIMSERVE_HOST_DEVICE constexpr std::int8_t int4_in_byte(std::uint8_t byte, int j) {
  return static_cast<std::int8_t>(int4_from_bits(static_cast<std::uint32_t>(byte) >> (4 * j)));
}

// ---- signed <-> unsigned (offset binary, zero point 8) -------------------------------------

/// -8..7 -> 0..15 (v + 8): the unsigned code of symmetric quantization with zero point 8.
SLIMSERVE_HOST_DEVICE constexpr std::uint8_t int4_to_offset_uint4(int v) {
  return static_cast<std::uint8_t>(v + 8);
}
/// 0..15 -> -8..7 (q - 8).
SLIMSERVE_HOST_DEVICE constexpr int offset_uint4_to_int4(std::uint32_t q) {
  return static_cast<int>(q & 0xFu) - 8;
}
/// All 8 nibbles of a word at once: flipping bit 3 of each nibble maps two's complement to
/// offset binary and back.
SLIMSERVE_HOST_DEVICE constexpr std::uint32_t flip_int4x8_offset(std::uint32_t word) {
  return word ^ 0x88888888u;
}

SLIMSERVE_NAMESPACE_END
