#pragma once
/// \file
/// \brief The normalized Walsh-Hadamard transform (formats/hadamard.cuh's y = H x / sqrt(D)) of
/// a head vector held as mma fragments: the 4 lanes of a quad (t = lane % 4) hold one row's D
/// elements, D / 4 each, in the d order of a fragment column map. Used by the paged attention
/// kernel to rotate its query rows for a cache appended with a rotation (attention/rotation.hpp).
///
/// H[i][j] = (-1)^popcount(i & j) factors over the index bits, so the transform is one
/// butterfly per bit of d, in any order: the bits a lane holds by itself are butterflies in
/// registers, the two bits that select the quad lane are __shfl_xor_sync rounds (offsets 1, 2).
/// Every fragment map of the kernel places t at two adjacent bits of d: d = local + (t << Shift)
/// with `local` free of those bits (quad_column_map_ok, asserted below for the query maps), so a
/// lane's values are indexed by `local` with the t bits squeezed out (quad_local_index).

#include "slimserve/attention/kernels/mma_fragments.cuh"
#include "slimserve/attention/kernels/nvfp4_fragments.cuh"
#include "slimserve/config.hpp"
#include "slimserve/formats/hadamard.cuh"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// Index of d in its lane's array of D / 4 values: d without the quad bits Shift, Shift + 1.
template <int Shift>
SLIMSERVE_HOST_DEVICE constexpr int quad_local_index(int d) {
  return (d & ((1 << Shift) - 1)) | ((d >> (Shift + 2)) << Shift);
}

/// Whether Map::column(i, t) (i = 0 .. D/4 - 1: a lane's elements; t = 0..3) is a bijection
/// onto 0..D-1 of the form local(i) + (t << Map::shift), local(i) free of the quad bits.
template <int HeadDim, class Map>
constexpr bool quad_column_map_ok() {
  bool seen[HeadDim] = {};
  for (int i = 0; i < HeadDim / 4; ++i) {
    const int local = Map::column(i, 0);
    if (local < 0 || local >= HeadDim || ((local >> Map::shift) & 3) != 0) return false;
    for (int t = 0; t < 4; ++t) {
      const int d = Map::column(i, t);
      if (d != local + (t << Map::shift) || seen[d]) return false;
      seen[d] = true;
    }
  }
  return true;
}

/// The query fragments' d order (the K fragments', so q.k pairs equal d): element i = 4 s + e
/// of a lane's values of one row is element e of k step s (q_fragment_column, nvfp4_q_column).
template <bool Fp8, bool Nvfp4>
struct QueryFragmentColumns {
  static constexpr int shift = Nvfp4 ? 3 : Fp8 ? 2 : 1;  // d = ... + 8t, 4t, 2t
  SLIMSERVE_HOST_DEVICE static constexpr int column(int i, int t) {
    return Nvfp4 ? nvfp4_q_column(i / 4, t, i % 4) : 16 * (i / 4) + q_fragment_column<Fp8>(t, i % 4);
  }
};
static_assert(quad_column_map_ok<64, QueryFragmentColumns<false, false>>() &&
              quad_column_map_ok<128, QueryFragmentColumns<false, false>>() &&
              quad_column_map_ok<256, QueryFragmentColumns<false, false>>(), "16-bit query map: t at d bits 1, 2");
static_assert(quad_column_map_ok<64, QueryFragmentColumns<true, false>>() &&
              quad_column_map_ok<128, QueryFragmentColumns<true, false>>() &&
              quad_column_map_ok<256, QueryFragmentColumns<true, false>>(), "FP8 query map: t at d bits 2, 3");
static_assert(quad_column_map_ok<64, QueryFragmentColumns<false, true>>() &&
              quad_column_map_ok<128, QueryFragmentColumns<false, true>>() &&
              quad_column_map_ok<256, QueryFragmentColumns<false, true>>(), "NVFP4 query map: t at d bits 3, 4");

/// Rotates one row held by a quad: x[quad_local_index<Shift>(d)] is element d of lane t = lane % 4
/// (d's quad bits equal to t). Every lane of the warp calls it (full-mask shuffles).
template <int HeadDim, int Shift>
  requires hadamard_head_dim<HeadDim>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void quad_hadamard_rotate(float (&x)[HeadDim / 4], int t) {
  constexpr int n = HeadDim / 4;
  // The lane's own bits (every bit of the local index: a relabelling of d's other bits).
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; ++i) {
      if (i & h) continue;
      const float a = x[i], b = x[i + h];
      x[i] = a + b;
      x[i + h] = a - b;
    }
  }
  // The quad bits: lane t ^ offset holds the partner element at the same local index.
  for (int offset = 1; offset < 4; offset *= 2) {
    const bool upper = (t & offset) != 0;  // holds x[d + (offset << Shift)]: gets x[d] - it
    for (int i = 0; i < n; ++i) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, x[i], offset);
      x[i] = upper ? other - x[i] : x[i] + other;
    }
  }
  for (int i = 0; i < n; ++i) x[i] *= hadamard_normalization<HeadDim>;
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
