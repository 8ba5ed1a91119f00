#pragma once
/// \file
/// \brief The normalized Walsh-Hadamard transform of a head vector (64, 128 or 256 elements)
/// held 8 consecutive elements per lane, lane l of the vector holding elements 8l..8l+7 (the
/// append and decode kernels' layout for 16-bit rows), in registers and warp shuffles.
///
/// y = H x / sqrt(D) with H the Sylvester Hadamard matrix, H[i][j] = (-1)^popcount(i & j).
/// Index bits 0..2 are within a lane (3 rounds of in-register butterflies), bits 3.. are lane
/// bits (log2(D / 8) rounds of __shfl_xor_sync). The transform is orthogonal and its own
/// inverse: rotating q and k leaves q.k unchanged, and rotating twice gives x back.
/// Cost per lane: 24 FADD, 8 shuffles + 8 FADD per lane round, 8 FMUL (D = 128: 4 rounds).

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN

template <int HeadDim>
inline constexpr bool hadamard_head_dim = HeadDim == 64 || HeadDim == 128 || HeadDim == 256;

/// 1 / sqrt(HeadDim), rounded to float (exact for 64 and 256).
template <int HeadDim>
inline constexpr float hadamard_normalization =
    HeadDim == 64 ? 0.125f : HeadDim == 128 ? 0.08838834764831845f : 0.0625f;

/// Rotates the head vector in place. The HeadDim / 8 lanes of a vector must be consecutive
/// and aligned (lane % (HeadDim / 8) is the lane within it) and all named in `mask`.
template <int HeadDim>
  requires hadamard_head_dim<HeadDim>
__device__ SLIMSERVE_FORCEINLINE void hadamard_rotate(float (&v)[8], unsigned mask = 0xFFFFFFFFu) {
  constexpr int lanes = HeadDim / 8;
  for (int h = 1; h < 8; h *= 2) {
    for (int i = 0; i < 8; ++i) {
      if (i & h) continue;
      const float a = v[i], b = v[i + h];
      v[i] = a + b;
      v[i + h] = a - b;
    }
  }
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  for (int offset = 1; offset < lanes; offset *= 2) {
    const bool upper = (lane & offset) != 0;  // holds x[i + offset], gets x[i] - x[i + offset]
    for (int i = 0; i < 8; ++i) {
      const float other = __shfl_xor_sync(mask, v[i], offset);
      v[i] = upper ? other - v[i] : v[i] + other;
    }
  }
  for (int i = 0; i < 8; ++i) v[i] *= hadamard_normalization<HeadDim>;
}

SLIMSERVE_NAMESPACE_END
