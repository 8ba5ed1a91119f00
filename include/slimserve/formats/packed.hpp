#pragma once
/// \file
/// \brief Register-level conversions kernels use to (de)quantize in registers: four FP8
/// codes in a 32-bit word <-> four floats, two BF16/FP16 values in a 32-bit word <-> two
/// floats. Element 0 is always the lowest byte / half-word (little-endian memory order, so a
/// 32-bit load of four consecutive FP8 codes gives x, y, z, w in order).
///
/// Same bits as the scalar `to_float` / `from_float` on every path (host, emulator, GPU).

#include <concepts>
#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/formats/float_formats.hpp"

SLIMSERVE_NAMESPACE_BEGIN

/// Two floats; same size and alignment as CUDA's float2.
struct alignas(8) f32x2 {
  float x, y;
};
/// Four floats; same size and alignment as CUDA's float4 (one 16-byte access).
struct alignas(16) f32x4 {
  float x, y, z, w;
};

/// Four FP8 codes (byte i = element i) -> four floats, exactly.
template <fp8_format T>
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE f32x4 to_float4(std::uint32_t packed) {
#if defined(SLIMSERVE_HAS_HW_FP8_CVT)
  constexpr bool e4m3 = std::same_as<T, fp8_e4m3>;
  const std::uint32_t h01 = detail::hw::fp8x2_to_fp16x2<e4m3>(static_cast<std::uint16_t>(packed));
  const std::uint32_t h23 = detail::hw::fp8x2_to_fp16x2<e4m3>(static_cast<std::uint16_t>(packed >> 16));
  return {detail::hw::fp16_to_float(static_cast<std::uint16_t>(h01)),
          detail::hw::fp16_to_float(static_cast<std::uint16_t>(h01 >> 16)),
          detail::hw::fp16_to_float(static_cast<std::uint16_t>(h23)),
          detail::hw::fp16_to_float(static_cast<std::uint16_t>(h23 >> 16))};
#else
  return {to_float(T::from_bits(static_cast<std::uint8_t>(packed))),
          to_float(T::from_bits(static_cast<std::uint8_t>(packed >> 8))),
          to_float(T::from_bits(static_cast<std::uint8_t>(packed >> 16))),
          to_float(T::from_bits(static_cast<std::uint8_t>(packed >> 24)))};
#endif
}

/// Four floats -> four FP8 codes (element i in byte i); RNE, saturating like `from_float`.
template <fp8_format T>
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE std::uint32_t from_float4(f32x4 v) {
#if defined(SLIMSERVE_HAS_HW_FP8_CVT)
  constexpr bool e4m3 = std::same_as<T, fp8_e4m3>;
  const std::uint32_t lo = detail::hw::float2_to_fp8x2<e4m3>(v.x, v.y);
  const std::uint32_t hi = detail::hw::float2_to_fp8x2<e4m3>(v.z, v.w);
  return lo | (hi << 16);
#else
  return static_cast<std::uint32_t>(from_float<T>(v.x).bits) |
         (static_cast<std::uint32_t>(from_float<T>(v.y).bits) << 8) |
         (static_cast<std::uint32_t>(from_float<T>(v.z).bits) << 16) |
         (static_cast<std::uint32_t>(from_float<T>(v.w).bits) << 24);
#endif
}

/// Two BF16 or FP16 values (element 0 in bits 0..15) -> two floats, exactly.
template <half_format T>
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE f32x2 to_float2(std::uint32_t packed) {
  if constexpr (std::same_as<T, bf16>) {
    // A shift and a mask: the same on every path.
    return {detail::float_from_bits(packed << 16), detail::float_from_bits(packed & 0xFFFF0000u)};
  } else {
    return {to_float(fp16::from_bits(static_cast<std::uint16_t>(packed))),
            to_float(fp16::from_bits(static_cast<std::uint16_t>(packed >> 16)))};
  }
}

/// Two floats -> two BF16 or FP16 values (element 0 in bits 0..15); RNE like `from_float`.
template <half_format T>
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE std::uint32_t from_float2(f32x2 v) {
#if defined(SLIMSERVE_HAS_HW_BF16_CVT)
  if constexpr (std::same_as<T, bf16>) {
    return detail::hw::float2_to_bf16x2(v.x, v.y);
  } else {
    return detail::hw::float2_to_fp16x2(v.x, v.y);
  }
#else
  return static_cast<std::uint32_t>(from_float<T>(v.x).bits) |
         (static_cast<std::uint32_t>(from_float<T>(v.y).bits) << 16);
#endif
}

SLIMSERVE_NAMESPACE_END
