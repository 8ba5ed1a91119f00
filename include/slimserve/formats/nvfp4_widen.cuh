#pragma once
/// \file
/// \brief NVFP4 -> FP16/BF16 in registers, for GPUs without an FP4 conversion (sm_90): eight
/// E2M1 codes of one 32-bit word become four f16x2 or bf16x2 registers, times the block's
/// E4M3 scale, with no memory table.
///
/// How: the half-word of element e must read sign | 000 | e2m1 magnitude | 0..., i.e. its
/// sign on bit 15 and its 3 magnitude bits on bits 11..9 (FP16) or 8..6 (BF16). Then it holds
/// e2m1 * 2^-14 (FP16) or e2m1 * 2^-126 (BF16) exactly: E2M1's subnormal 0.5 lands on the
/// target's subnormal, its normals on normals with the exponent bias short by 14 (126).
///  * per word, two `prmt` + mask gather [e0, e2, e1, e3] and [e4, e6, e5, e7], each code in
///    the high nibble of a byte whose low nibble is zero;
///  * FP16: the sign and magnitude stay inside their byte (bit 7, bits 3..1), so
///    (g | g >> 3) & 0x8E8E8E8E turns each of those words into four finished high bytes; per
///    register i one `prmt` with a zero operand places them: [0, e_2i, 0, e_2i+1];
///  * BF16 (the magnitude crosses into the low byte): per register one `prmt` with a zero
///    operand gives [0, e_2i, 0, e_2i+1] in high nibbles, then (w | w >> 6) & 0x81C081C0;
///  * one packed multiply by the scale operand, block_scale * 2^7 (FP16) or * 2^119 (BF16),
///    restores the bias but 2^-7. The product e2m1 * block_scale * 2^-7 has at most 6
///    significant bits and lies in [2^-17, 21] (or is 0): exact in both formats, so widening
///    is exact. The missing 2^7 goes into the FP32 factor applied after the tensor-core
///    product (`nvfp4_widened_unit * tensor_scale`), never into a 16-bit operand (FP16 has no
///    room for block_scale * 2^14 once the scale exceeds 4).
/// Cost per word (8 elements): FP16 9 + 4 x (PRMT, HMUL2) = 17 instructions; BF16
/// 5 + 4 x (PRMT, SHF, LOP3, HMUL2) = 21.
///
/// Output order is the natural one: register i holds elements 2i (low half) and 2i+1, so
/// four registers are the same 16 bytes a BF16/FP16 cache row would hold.

#include <cstdint>
#include <type_traits>

#include "slimserve/arch/bf16x2_math.cuh"
#include "slimserve/arch/bit_ops.cuh"
#include "slimserve/arch/f16x2_math.cuh"
#include "slimserve/arch/fp8_convert.cuh"
#include "slimserve/config.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/formats/nvfp4.hpp"
#include "slimserve/formats/packed.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN

/// Widened values are e2m1 * block_scale * nvfp4_widened_unit^-1: multiply results computed
/// from them by nvfp4_widened_unit (and the tensor scale).
inline constexpr float nvfp4_widened_unit = 128.0f;

/// The scale operand of two blocks whose E4M3 scales are the low (block 0) and high byte of
/// `scales`: both halves of operand[b] are block b's scale * 2^7 (FP16) or * 2^119 (BF16).
/// A NaN scale (0x7F/0xFF) gives a NaN operand, so its block widens to NaN.
template <half_format T>
__device__ SLIMSERVE_FORCEINLINE void nvfp4_scale_operands(std::uint16_t scales,
                                                           std::uint32_t (&operand)[2]) {
  // e4m3 -> fp16 is exact (sm_89 cvt); * 128 is exact too (at most 448 * 128 = 57344).
  const std::uint32_t halves = arch::mul_rn_f16x2(arch::cvt_e4m3x2_to_f16x2(scales), 0x58005800u);
  if constexpr (std::is_same_v<T, fp16>) {
    operand[0] = arch::prmt(halves, 0u, 0x1010u);
    operand[1] = arch::prmt(halves, 0u, 0x3232u);
  } else {
    // fp16 -> float is exact; * 2^112 exact (at most 57344 * 2^112 < 2^128); one packed
    // conversion to bf16 then rounds nothing (4 significant bits).
    const f32x2 f = to_float2<fp16>(halves);
    operand[0] = from_float2<bf16>({f.x * 0x1p112f, f.x * 0x1p112f});
    operand[1] = from_float2<bf16>({f.y * 0x1p112f, f.y * 0x1p112f});
  }
}

/// Codes in the high nibbles of bytes whose low nibbles are zero -> four finished FP16 high
/// bytes: sign kept on bit 7, magnitude moved to bits 3..1 (sign | 000 | magnitude | 0).
__device__ SLIMSERVE_FORCEINLINE std::uint32_t nvfp4_finish_f16_high_bytes(std::uint32_t high_nibbles) {
  return (high_nibbles | (high_nibbles >> 3)) & 0x8E8E8E8Eu;
}

/// Eight codes (element k in bits 4k..4k+3) -> out[i] = {element 2i, element 2i+1} *
/// block_scale * 2^-7, exactly; `scale` from nvfp4_scale_operands.
template <half_format T>
__device__ SLIMSERVE_FORCEINLINE void nvfp4_widen8(std::uint32_t codes, std::uint32_t scale,
                                                   std::uint32_t (&out)[4]) {
  const std::uint32_t shifted = codes << 4;
  // [e0, e2, e1, e3] and [e4, e6, e5, e7], each code in the high nibble of its byte.
  std::uint32_t gathered[2] = {arch::prmt(shifted, codes, 0x5410u) & 0xF0F0F0F0u,
                               arch::prmt(shifted, codes, 0x7632u) & 0xF0F0F0F0u};
  if constexpr (std::is_same_v<T, fp16>) {
    for (std::uint32_t& g : gathered) g = nvfp4_finish_f16_high_bytes(g);
  }
  for (unsigned i = 0; i < 4; ++i) {
    // [0, e_2i, 0, e_2i+1]: the zero bytes come from the zero operand (bytes 4..7).
    const std::uint32_t w = arch::prmt(gathered[i / 2], 0u, i % 2 == 0 ? 0x2404u : 0x3414u);
    if constexpr (std::is_same_v<T, fp16>) {
      out[i] = arch::mul_rn_f16x2(w, scale);
    } else {
      out[i] = arch::mul_rn_bf16x2((w | (w >> 6)) & 0x81C081C0u, scale);
    }
  }
}

SLIMSERVE_NAMESPACE_END
