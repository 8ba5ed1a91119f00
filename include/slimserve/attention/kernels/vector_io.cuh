#pragma once
/// \file
/// \brief 16-byte vectors of a stored element type and their conversion to FP32 in registers.

#include <cstdint>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "slimserve/formats/float_formats.hpp"
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

/// All elements of a vector of T as floats.
template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void unpack(const Vec16& v, float (&out)[vector_elements<T>]) {
SLIMSERVE_ATTENTION_UNROLL
  for (int i = 0; i < vector_elements<T>; ++i) out[i] = element_to_float<T>(v, i);
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
