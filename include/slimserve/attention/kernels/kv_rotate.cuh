#pragma once
/// \file
/// \brief The cache writers' rotation step: K (and V) head vectors rotated in registers right
/// after they are loaded, before any amax or scale is computed from them, so the rotated
/// values are what every format quantizes (attention/rotation.hpp says why).

#include "slimserve/attention/rotation.hpp"
#include "slimserve/config.hpp"
#include "slimserve/formats/hadamard.cuh"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// Every thread of the warp calls it: hadamard_rotate shuffles across the head vector's
/// head_dim / 8 lanes (a power of two for RotationHeadDims: the writers' lane group exactly),
/// lanes that loaded nothing holding zeros. KvRotation::none compiles to nothing.
template <KvRotation Rotation, int HeadDim>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void rotate_loaded_head_vectors(float (&k)[8], float (&v)[8]) {
  if constexpr (rotates_keys(Rotation)) {
    static_assert(hadamard_head_dim<HeadDim>, "rotation: head_dim 64, 128 or 256 (RotationHeadDims)");
    hadamard_rotate<HeadDim>(k);
    if constexpr (rotates_values(Rotation)) hadamard_rotate<HeadDim>(v);
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
