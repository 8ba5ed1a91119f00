#pragma once
/// \file
/// \brief NVFP4 quantization of a head vector spread over lanes the way the append and
/// attention kernels hold it: 8 consecutive elements per lane (one 16-byte BF16/FP16 load),
/// lane l of a head vector holding elements 8l..8l+7, so the lane pair (2k, 2k+1) holds
/// block k. The pair agrees on the block's amax with one shuffle; every lane then codes its
/// own 8 elements into one 32-bit word (formats/nvfp4.hpp's rule and layout).

#include <cmath>
#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/formats/nvfp4.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN

/// What a lane produces: its 8 codes (element k in bits 4k..4k+3; the word goes to byte
/// offset 4 * lane of the head vector's codes) and its block's scale (both lanes of the pair
/// hold it; the even lane stores it, at scale index lane / 2).
struct Nvfp4LaneCodes {
  std::uint32_t codes;
  fp8_e4m3 scale;
};

namespace detail {
/// max that keeps a NaN (from either side); a >= 0 or NaN, b >= 0 or NaN.
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE float nan_keeping_max(float a, float b) {
  return (a != a || a > b) ? a : b;
}
}  // namespace detail

/// `mask` names the lanes taking part (both lanes of every pair must be in it).
__device__ SLIMSERVE_FORCEINLINE Nvfp4LaneCodes nvfp4_quantize_lane(const float (&v)[8],
                                                                   float tensor_scale,
                                                                   unsigned mask = 0xFFFFFFFFu) {
  float amax = 0.0f;
  for (int k = 0; k < 8; ++k) amax = detail::nan_keeping_max(amax, fabsf(v[k]));
  amax = detail::nan_keeping_max(amax, __shfl_xor_sync(mask, amax, 1));
  const fp8_e4m3 scale = nvfp4_block_scale(amax, tensor_scale);
  const float multiplier = nvfp4_code_multiplier(scale, tensor_scale);
  std::uint32_t codes = 0;
  for (int k = 0; k < 8; ++k) codes |= nvfp4_code(v[k], multiplier) << (4 * k);
  return {codes, scale};
}

SLIMSERVE_NAMESPACE_END
