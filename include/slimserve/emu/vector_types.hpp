#pragma once
/// \file
/// \brief CUDA's built-in vector types (dim3, uint3, float4, ...) with CUDA's alignment.

// Global namespace, as in CUDA.

#define SLIMSERVE_EMU_VECTOR2(name, T, align)                                          \
  struct __attribute__((aligned(align))) name { T x, y; };                            \
  inline constexpr name make_##name(T x, T y) { return name{x, y}; }
#define SLIMSERVE_EMU_VECTOR3(name, T)                                                 \
  struct name { T x, y, z; };                                                          \
  inline constexpr name make_##name(T x, T y, T z) { return name{x, y, z}; }
#define SLIMSERVE_EMU_VECTOR4(name, T, align)                                          \
  struct __attribute__((aligned(align))) name { T x, y, z, w; };                      \
  inline constexpr name make_##name(T x, T y, T z, T w) { return name{x, y, z, w}; }

SLIMSERVE_EMU_VECTOR2(char2, signed char, 2)
SLIMSERVE_EMU_VECTOR2(uchar2, unsigned char, 2)
SLIMSERVE_EMU_VECTOR4(char4, signed char, 4)
SLIMSERVE_EMU_VECTOR4(uchar4, unsigned char, 4)
SLIMSERVE_EMU_VECTOR2(short2, short, 4)
SLIMSERVE_EMU_VECTOR2(ushort2, unsigned short, 4)
SLIMSERVE_EMU_VECTOR4(short4, short, 8)
SLIMSERVE_EMU_VECTOR4(ushort4, unsigned short, 8)
SLIMSERVE_EMU_VECTOR2(int2, int, 8)
SLIMSERVE_EMU_VECTOR3(int3, int)
SLIMSERVE_EMU_VECTOR4(int4, int, 16)
SLIMSERVE_EMU_VECTOR2(uint2, unsigned, 8)
SLIMSERVE_EMU_VECTOR3(uint3, unsigned)
SLIMSERVE_EMU_VECTOR4(uint4, unsigned, 16)
SLIMSERVE_EMU_VECTOR2(float2, float, 8)
SLIMSERVE_EMU_VECTOR3(float3, float)
SLIMSERVE_EMU_VECTOR4(float4, float, 16)
SLIMSERVE_EMU_VECTOR2(longlong2, long long, 16)
SLIMSERVE_EMU_VECTOR2(ulonglong2, unsigned long long, 16)
SLIMSERVE_EMU_VECTOR2(double2, double, 16)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}  // NOLINT: implicit, as in CUDA
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

#undef SLIMSERVE_EMU_VECTOR2
#undef SLIMSERVE_EMU_VECTOR3
#undef SLIMSERVE_EMU_VECTOR4
