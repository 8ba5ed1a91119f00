#pragma once
/// \file
/// \brief 16-byte vectors of a stored element type and their conversion to FP32 in registers.

#include <cstdint>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/formats/packed.hpp"
#include "slimserve/runtime/platform.hpp"

/// Full unrolling of short fixed-trip loops, spelled for nvcc/clang and for g++ (emulator).
#if defined(__CUDACC__) || defined(__clang__)
#define SLIMSERVE_ATTENTION_UNROLL _Pragma("unroll")
#else
#define SLIMSERVE_ATTENTION_UNROLL _Pragma("GCC unroll 32")
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// 16 bytes: one vectorized global or shared memory access.
struct alignas(16) Vec16 {
  std::uint32_t word[4];
};

/// Elements of T in one 16-byte vector (8 for BF16/FP16, 16 for FP8).
template <class T>
inline constexpr int vector_elements = 16 / static_cast<int>(sizeof(T));

/// One 16-byte load; `address` must be 16-byte aligned.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE Vec16 load16(const void* address) {
#if defined(__CUDACC__)
  return *static_cast<const Vec16*>(address);
#else
  Vec16 v;
  std::memcpy(&v, address, sizeof(v));
  return v;
#endif
}

SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void store16(void* address, const Vec16& v) {
#if defined(__CUDACC__)
  *static_cast<Vec16*>(address) = v;
#else
  std::memcpy(address, &v, sizeof(v));
#endif
}

/// 8 bytes: the FP8 image of 8 activations.
struct alignas(8) Vec8 {
  std::uint32_t word[2];
};

/// One 8-byte store; `address` must be 8-byte aligned.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void store8(void* address, const Vec8& v) {
#if defined(__CUDACC__)
  *static_cast<Vec8*>(address) = v;
#else
  std::memcpy(address, &v, sizeof(v));
#endif
}

/// One 4-byte load (a packed pair of 16-bit values); `address` must be 4-byte aligned.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE std::uint32_t load4(const void* address) {
#if defined(__CUDACC__)
  return *static_cast<const std::uint32_t*>(address);
#else
  std::uint32_t word;
  std::memcpy(&word, address, sizeof(word));
  return word;
#endif
}

/// One 4-byte store (a packed pair of 16-bit values); `address` must be 4-byte aligned.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void store4(void* address, std::uint32_t word) {
#if defined(__CUDACC__)
  *static_cast<std::uint32_t*>(address) = word;
#else
  std::memcpy(address, &word, sizeof(word));
#endif
}

/// Stores N elements of T (8 or 16 bytes, aligned to their size) with one vector store.
template <class T, int N>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void store_packed(T* address, const T (&elements)[N]) {
  constexpr std::size_t bytes = sizeof(T) * N;
  static_assert(bytes == 8 || bytes == 16, "one 8- or 16-byte store");
  using Packed = std::conditional_t<bytes == 16, Vec16, Vec8>;
  Packed packed;
  std::memcpy(&packed, elements, bytes);
#if defined(__CUDACC__)
  *reinterpret_cast<Packed*>(address) = packed;
#else
  std::memcpy(address, &packed, bytes);
#endif
}

/// Element i of a vector of T, converted to float.
template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE float element_to_float(const Vec16& v, int i) {
  T element;
  std::memcpy(&element, reinterpret_cast<const unsigned char*>(&v) + i * static_cast<int>(sizeof(T)),
              sizeof(T));
  return to_float(element);
}

/// All elements of a vector of T as floats, converted a register word at a time (paired
/// hardware conversions on the GPU; exactly the bits of the scalar `to_float`).
template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void unpack(const Vec16& v, float (&out)[vector_elements<T>]) {
  if constexpr (fp8_format<T>) {
    SLIMSERVE_ATTENTION_UNROLL
    for (int w = 0; w < 4; ++w) {
      const f32x4 f = to_float4<T>(v.word[w]);
      out[4 * w + 0] = f.x;
      out[4 * w + 1] = f.y;
      out[4 * w + 2] = f.z;
      out[4 * w + 3] = f.w;
    }
  } else {
    SLIMSERVE_ATTENTION_UNROLL
    for (int w = 0; w < 4; ++w) {
      const f32x2 f = to_float2<T>(v.word[w]);
      out[2 * w + 0] = f.x;
      out[2 * w + 1] = f.y;
    }
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
