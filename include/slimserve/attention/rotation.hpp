#pragma once
/// \file
/// \brief Which head vectors of a paged cache are stored rotated: the normalized Walsh-Hadamard
/// transform y = H x / sqrt(head_dim) (formats/hadamard.cuh), applied by append_kv before
/// quantization and by rotate_heads to the queries (and to the attention output when V is
/// rotated). H / sqrt(D) is orthogonal and its own inverse, so (H q) . (H k) = q . k and the
/// softmax weights are unchanged; an outlier channel is spread over the whole vector, which
/// shrinks the per-block amax a 4-bit format has to cover. Plain C++ (no CUDA header).

#include <cstdint>
#include <string_view>

#include "slimserve/attention/head_dims.hpp"
#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

/// The rotation of a cache's stored head vectors (append_kv's `rotation`).
enum class KvRotation : std::uint8_t {
  none,             ///< K and V stored as given
  keys,             ///< K stored rotated: rotate Q the same way before the score
  keys_and_values,  ///< K and V rotated: also rotate the attention output back afterwards
};

constexpr bool is_valid(KvRotation rotation) noexcept {
  return static_cast<std::uint8_t>(rotation) <= static_cast<std::uint8_t>(KvRotation::keys_and_values);
}
constexpr std::string_view to_string(KvRotation rotation) noexcept {
  switch (rotation) {
    case KvRotation::none: return "none";
    case KvRotation::keys: return "keys";
    case KvRotation::keys_and_values: return "keys_and_values";
  }
  return "unknown";
}
SLIMSERVE_HOST_DEVICE constexpr bool rotates_keys(KvRotation rotation) noexcept {
  return rotation == KvRotation::keys || rotation == KvRotation::keys_and_values;
}
SLIMSERVE_HOST_DEVICE constexpr bool rotates_values(KvRotation rotation) noexcept {
  return rotation == KvRotation::keys_and_values;
}

/// The head dims the rotation is built for: a Walsh-Hadamard transform of a power-of-two
/// length, 8 elements a lane over a whole power-of-two group of lanes (hadamard.cuh).
using RotationHeadDims = HeadDimList<64, 128, 256>;

}  // namespace attention
SLIMSERVE_NAMESPACE_END
