#pragma once
/// \file
/// \brief NVFP4: E2M1 codes in blocks of 16 elements, one E4M3 scale per block and one FP32
/// scale per tensor. The block rule and the packed layout, as scalar functions usable on the
/// host and on the device (the warp-level quantizer and the register widening build on them:
/// nvfp4_quantize.cuh, nvfp4_widen.cuh).
///
/// Value of element i of block b (decode):
///     x[i] = e2m1(code[i]) * e4m3(block_scale[b]) * tensor_scale
/// `tensor_scale` is the decode-side FP32 scale (as FlashInfer's and SGLang's global KV
/// scale); kernels read it through a device pointer, so a CUDA graph captures the pointer.
///
/// Quantize, per block (every step an FP32 operation rounded to nearest even):
///     amax        = max |x[i]|                     NaN if any x[i] is NaN
///     block_scale = e4m3_rne_satfinite(amax / (6 * tensor_scale))
///     step        = e4m3(block_scale) * tensor_scale   (the block's decode multiplier)
///     code[i]     = e2m1_rne_saturate(x[i] * (1 / step))   multiplier 0 when step is 0, inf
///                                                          or NaN: codes are signed zeros
/// so the largest element lands on +-6 (or next to it: the scale is rounded to nearest, so up
/// to 1/16 of the top code's range may saturate at 6, and 4 is chosen when the quotient is
/// exactly 5, the tie). Edge cases, all decided per block and never trapping:
///  * amax / (6 * tensor_scale) below half the smallest E4M3 subnormal (2^-10) rounds the
///    scale to 0: the block is stored as zeros (choose tensor_scale ~ amax_tensor / 2688 to
///    keep small blocks alive).
///  * +-inf inputs saturate: the scale becomes 448 (E4M3's largest) and the infinite elements
///    become +-6, the finite ones are coded against that scale.
///  * a NaN input makes the block's scale the E4M3 NaN (0x7F): the whole block decodes to NaN
///    (its codes are signed zeros), as FP8 keeps a NaN a NaN.
///  * a tensor scale outside (0, nvfp4_max_tensor_scale] (NaN, inf, <= 0, or so large that a
///    reader's widened unit times it overflows) makes every block's scale NaN: a bad scale is
///    visible in the output instead of silently rescaling it (the host cannot check a value
///    that lives in device memory). Every reader applies the same rule (NaN rows).
///
/// Packed layout: element 2j is the low nibble of byte j, element 2j+1 the high nibble (so a
/// little-endian 32-bit load of 4 bytes holds elements 0..7 with element k in bits 4k..4k+3;
/// the same order as PTX's cvt e2m1x2 pairs and ml_dtypes' packing). A head vector of D
/// elements is D/2 bytes of codes and D/16 scale bytes (72 B at D = 128, against 128 B FP8).

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/formats/fp4.hpp"

SLIMSERVE_NAMESPACE_BEGIN

inline constexpr int nvfp4_block_elements = 16;
inline constexpr int nvfp4_block_code_bytes = nvfp4_block_elements / 2;
/// The KV cache's storage type of NVFP4 codes: one byte holding two E2M1 codes, element 2j in
/// the low nibble (the packed layout above). The block scales live after a head vector's codes.
struct nvfp4 {
  std::uint8_t bits;
};
static_assert(sizeof(nvfp4) == 1);

/// The E4M3 NaN a block's scale becomes for a NaN input or an invalid tensor scale.
inline constexpr std::uint8_t nvfp4_nan_scale_code = 0x7F;

/// The largest power of two a reader's widened codes carry (the tensor-core paths widen
/// e2m1 x e4m3 x 2^-14 into FP16, exact, and fold 2^14 into the tensor scale:
/// nvfp4_fragment_unit).
inline constexpr float nvfp4_max_reader_unit = 16384.0f;
/// The largest tensor scale the format accepts: FLT_MAX / 2^14 (exact, about 2.1e34), so that
/// every reader's tensor scale x unit is finite. One domain for the writer and every reader:
/// a scale the append codes against is a scale every kernel reads with.
inline constexpr float nvfp4_max_tensor_scale = FLT_MAX / nvfp4_max_reader_unit;

/// Whether a tensor scale is in the format's domain (0, nvfp4_max_tensor_scale]; false for NaN.
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr bool nvfp4_tensor_scale_ok(float tensor_scale) {
  return tensor_scale > 0.0f && tensor_scale <= nvfp4_max_tensor_scale;
}

/// The reader's factor tensor_scale x `unit` (a power of two up to nvfp4_max_reader_unit), or
/// NaN for a scale outside the domain: the readers' rows are then NaN, as the append makes such
/// a cache's blocks NaN, never a silent rescale.
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr float nvfp4_checked_tensor_scale(float tensor_scale,
                                                                                      float unit = 1.0f) {
  return nvfp4_tensor_scale_ok(tensor_scale) ? tensor_scale * unit : NAN;
}

/// The block scale from the block's amax (>= 0, or NaN) and the tensor scale.
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr fp8_e4m3 nvfp4_block_scale(
    float amax, float tensor_scale) {
  if (!nvfp4_tensor_scale_ok(tensor_scale) || amax != amax) return fp8_e4m3{nvfp4_nan_scale_code};
  return from_float<fp8_e4m3>(amax / (6.0f * tensor_scale));
}

/// 1 / (block scale * tensor scale), the multiplier codes are computed with; 0 where that
/// step is 0, infinite or NaN (the block's codes are then signed zeros).
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr float nvfp4_code_multiplier(
    fp8_e4m3 block_scale, float tensor_scale) {
  const float step = to_float(block_scale) * tensor_scale;
  return step > 0.0f && step <= FLT_MAX ? 1.0f / step : 0.0f;
}

/// One element's code (low nibble) under a block's multiplier.
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr std::uint32_t nvfp4_code(float x,
                                                                              float multiplier) {
  return from_float<fp4_e2m1>(x * multiplier).bits;
}

/// Element k (0..7) of a 32-bit word of packed codes.
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr fp4_e2m1 nvfp4_code_at(std::uint32_t word,
                                                                            int k) {
  return fp4_e2m1::from_bits(static_cast<std::uint8_t>(word >> (4 * k)));
}

/// Exact e2m1 * e4m3 (at most 6 significant bits: 1.5 x 1.875), times the tensor scale: one FP32 rounding.
SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE constexpr float nvfp4_decode(fp4_e2m1 code,
                                                                        fp8_e4m3 block_scale,
                                                                        float tensor_scale) {
  return to_float(code) * to_float(block_scale) * tensor_scale;
}

SLIMSERVE_NAMESPACE_END
