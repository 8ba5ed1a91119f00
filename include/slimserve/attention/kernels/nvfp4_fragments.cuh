#pragma once
/// \file
/// \brief Tensor-core fragments of NVFP4 K/V tiles for paged attention: how a stage holds an
/// NVFP4 head vector, and the B operands of Q·K^T and P·V widened in registers with their
/// block scales (formats/nvfp4_widen.cuh), FP16 mma operands.
///
/// Staging. A head vector (head_dim / 2 code bytes, then head_dim / 16 E4M3 block scales) is
/// head_dim * 9 / 16 bytes: 36, 72, 108, 144 at head_dim 64, 128, 192, 256, so vectors in a page
/// are only 4-, 8-, 4- or 16-byte aligned. A stage copies each vector in `piece_bytes` pieces
/// (the largest cp.async size that divides the vector): the code pieces go into the swizzled
/// 16-byte chunk rows of mma_fragments.cuh (a chunk holds 32 codes, two k steps), the scale
/// pieces into a small [tokens, head_dim / 16] byte array of their own.
///
/// Widening (`nvfp4_parity_bytes`): a word's eight codes become two words of finished FP16 high
/// bytes (nvfp4_widen.cuh), the even codes' and the odd codes', in 7 instructions; one `prmt`
/// with a zero operand then places any two bytes of one of them as an f16x2 and one HMUL2
/// scales it: 15 instructions per word, where nvfp4_widen8's natural order {e_2i, e_2i+1} (a
/// byte from each word) costs 17. Both products below take the pairs the parity words give.
///
/// Q·K^T (contraction over d). ldmatrix of a code tile gives lane (g, t) bytes 4t..4t+3 of a
/// chunk of token g: codes d = 32 c + 8t .. 8t+7, all in block 2c + t/2, so one scale per
/// register word. The word becomes four f16x2: {8t, 8t+2}, {8t+4, 8t+6} are the B fragment of
/// k step 2c and {8t+1, 8t+3}, {8t+5, 8t+7} that of k step 2c+1. The query fragments are
/// loaded with the same map (`nvfp4_q_column`), so q·k is unchanged.
///
/// P·V (contraction over tokens). ldmatrix.trans gives lane (g, t) the 16-bit unit g (codes
/// d = 32c + 4g .. 4g+3) of tokens 2t and 2t+1. The widening takes the nibbles in the order
/// {token 2t, token 2t+1} per d (nibbles j and j + 4: the same parity), so register j is the B
/// fragment of output column d = 32c + 4g + j; its halves carry the two tokens' scales of block
/// 2c + g/4. Output tile n = 4c + j holds d = 32c + 4 col + j (`nvfp4_output_column`).
///
/// Scale operands are the E4M3 block scales converted to fp16 and nothing more: a widened code
/// is e2m1 * 2^-14 (nvfp4_widen.cuh), so the product is e2m1 * block_scale * 2^-14, a multiple
/// of 2^-24 (e2m1 is a multiple of 2^-1, E4M3 of 2^-9) of magnitude <= 6 * 448 * 2^-14 < 0.17:
/// exact in fp16, subnormals included, without the 2^7 multiply nvfp4_scale_operands spends
/// (one HMUL2 per two scales saved). The kernel multiplies scores and outputs by
/// nvfp4_fragment_unit * tensor_scale in FP32.

#include <cstdint>

#include "slimserve/arch/bit_ops.cuh"
#include "slimserve/arch/f16x2_math.cuh"
#include "slimserve/arch/fp8_convert.cuh"
#include "slimserve/arch/fp8x4_convert.cuh"
#include "slimserve/arch/ldmatrix.cuh"
#include "slimserve/attention/kernels/mma_fragments.cuh"
#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/formats/nvfp4.hpp"
#include "slimserve/formats/nvfp4_widen.cuh"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// Byte geometry of one NVFP4 head vector as a stage copies it.
template <int HeadDim>
struct Nvfp4VectorGeometry {
  static constexpr int code_bytes = HeadDim / 2;
  static constexpr int scale_bytes = HeadDim / nvfp4_block_elements;  ///< one E4M3 per block
  static constexpr int scale_words = scale_bytes / 4;
  static constexpr int vector_bytes = code_bytes + scale_bytes;
  /// The largest cp.async size that keeps every vector of a page aligned.
  static constexpr int piece_bytes = vector_bytes % 16 == 0 ? 16 : (vector_bytes % 8 == 0 ? 8 : 4);
  static constexpr int pieces = vector_bytes / piece_bytes;  ///< per vector (9 at 64/128/256)
  static constexpr int code_pieces = code_bytes / piece_bytes;
  static_assert(vector_bytes % 4 == 0 && scale_bytes % 4 == 0, "4-byte pieces (head_dim 96 is refused)");
  static_assert(code_bytes % piece_bytes == 0, "a piece is all codes or all scales");
};

/// d of element e (0..3, as q_fragment_column) of the query fragment of k step `step` in lane t:
/// the even codes of the lane's eight in the even step, the odd ones in the odd step.
SLIMSERVE_HOST_DEVICE constexpr int nvfp4_q_column(int step, int t, int e) {
  return 32 * (step >> 1) + 8 * t + 2 * e + (step & 1);
}

/// d held by element i (0..3) of output tile `tile` in lane t.
SLIMSERVE_HOST_DEVICE constexpr int nvfp4_output_column(int tile, int t, int i) {
  return 32 * (tile >> 2) + 4 * (2 * t + (i & 1)) + (tile & 3);
}

/// The finished FP16 high bytes (sign | 000 | magnitude | 0, nvfp4_widen.cuh) of the eight codes
/// of `codes` (code k in bits 4k..4k+3): parity[0] = [e0, e2, e4, e6], parity[1] = [e1, e3, e5,
/// e7]: each parity's codes masked into high nibbles, then finished.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void nvfp4_parity_bytes(std::uint32_t codes, std::uint32_t (&parity)[2]) {
  parity[0] = nvfp4_finish_f16_high_bytes((codes << 4) & 0xF0F0F0F0u);
  parity[1] = nvfp4_finish_f16_high_bytes(codes & 0xF0F0F0F0u);
}

/// One f16x2 of two finished bytes (`selector`: [zero, byte, zero, byte]) times `scale`: exact.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE std::uint32_t nvfp4_place_pair(std::uint32_t bytes, std::uint32_t selector,
                                                                      std::uint32_t scale) {
  return arch::mul_rn_f16x2(arch::prmt(bytes, 0u, selector), scale);
}
inline constexpr std::uint32_t nvfp4_bytes_0_1 = 0x1404u;  // [0, byte 0, 0, byte 1]
inline constexpr std::uint32_t nvfp4_bytes_2_3 = 0x3424u;
inline constexpr std::uint32_t nvfp4_bytes_0_2 = 0x2404u;
inline constexpr std::uint32_t nvfp4_bytes_1_3 = 0x3414u;

/// Eight codes of one token (a lane's K word) -> out = {e0, e2}, {e4, e6}, {e1, e3}, {e5, e7}
/// times the scale halves, exactly: the B fragments of an even and an odd k step
/// (nvfp4_q_column).
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void nvfp4_widen8_parity_pairs(std::uint32_t codes, std::uint32_t scale,
                                                                     std::uint32_t (&out)[4]) {
  std::uint32_t parity[2];
  nvfp4_parity_bytes(codes, parity);
  out[0] = nvfp4_place_pair(parity[0], nvfp4_bytes_0_1, scale);
  out[1] = nvfp4_place_pair(parity[0], nvfp4_bytes_2_3, scale);
  out[2] = nvfp4_place_pair(parity[1], nvfp4_bytes_0_1, scale);
  out[3] = nvfp4_place_pair(parity[1], nvfp4_bytes_2_3, scale);
}

/// Which of the word's eight codes position p (0..7) of nvfp4_widen8_parity_pairs' output
/// holds (register p / 2, half p % 2): 0, 2, 4, 6, 1, 3, 5, 7.
SLIMSERVE_HOST_DEVICE constexpr int nvfp4_parity_code(int position) { return 2 * (position % 4) + position / 4; }

/// The scale operands of nvfp4_widen8_parity_pairs for two blocks: both halves of operand[b]
/// are the E4M3 scale of block b (byte b of `scale_pair`) in fp16, exactly.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void nvfp4_block_scale_operands(std::uint16_t scale_pair,
                                                                      std::uint32_t (&operand)[2]) {
  const std::uint32_t halves = arch::cvt_e4m3x2_to_f16x2(scale_pair);
  operand[0] = arch::prmt(halves, 0u, 0x1010u);
  operand[1] = arch::prmt(halves, 0u, 0x3232u);
}

/// A 16-byte chunk of 32 codes (blocks b, b + 1; `scale_pair`'s low byte block b's scale)
/// -> four 16-byte chunks of fp16, each e2m1 x block scale x 2^-14 in the parity order:
/// store_chunk(word, chunk) for word 0..3 (codes 8 word .. 8 word + 7), each right after it
/// is widened (4 live registers, not 16).
template <class StoreChunk>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void nvfp4_widen32_parity(const Vec16& codes, std::uint16_t scale_pair,
                                                                StoreChunk&& store_chunk) {
  std::uint32_t operand[2];
  nvfp4_block_scale_operands(scale_pair, operand);
SLIMSERVE_ATTENTION_UNROLL
  for (int word = 0; word < 4; ++word) {
    Vec16 wide;
    nvfp4_widen8_parity_pairs(codes.word[word], operand[word / 2], wide.word);
    store_chunk(word, wide);
  }
}

/// Two tokens' 4 codes (nibbles 0..3 token a, 4..7 token b) taken per d: out[j] = {a_j, b_j}
/// times the scale halves, exactly (nibbles j and j + 4 have the same parity).
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void nvfp4_widen8_token_pairs(std::uint32_t codes, std::uint32_t scale,
                                                                    std::uint32_t (&out)[4]) {
  std::uint32_t parity[2];
  nvfp4_parity_bytes(codes, parity);
  out[0] = nvfp4_place_pair(parity[0], nvfp4_bytes_0_2, scale);  // nibbles 0, 4
  out[1] = nvfp4_place_pair(parity[1], nvfp4_bytes_0_2, scale);  // 1, 5
  out[2] = nvfp4_place_pair(parity[0], nvfp4_bytes_1_3, scale);  // 2, 6
  out[3] = nvfp4_place_pair(parity[1], nvfp4_bytes_1_3, scale);  // 3, 7
}

/// The factor of every product of widened fragments: 2^14 (see above).
inline constexpr float nvfp4_fragment_unit = 16384.0f;
static_assert(nvfp4_fragment_unit <= nvfp4_max_reader_unit, "the tensor-scale domain (formats/nvfp4.hpp) must cover this unit");

/// Two f16x2 scale operands from four E4M3 codes (bytes 0..1 -> operand 0, 2..3 -> operand 1):
/// exact (E4M3 is a subset of fp16); a NaN code stays NaN.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void nvfp4_scale_pairs(std::uint32_t four_codes, std::uint32_t (&operand)[2]) {
  arch::cvt_e4m3x4_to_f16x2x2(four_codes, operand[0], operand[1]);
}

/// The 4-byte scale word `word` (blocks 4w..4w+3) of a token's scale row in the stage.
template <int HeadDim>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE std::uint32_t nvfp4_scale_word(const unsigned char* scales, int token, int word) {
  return reinterpret_cast<const std::uint32_t*>(scales + token * Nvfp4VectorGeometry<HeadDim>::scale_bytes)[word];
}

/// Q·K^T for 16 tokens (rows row0.. of the code tile) and chunks `chunk`, `chunk`+1 (chunk
/// even: k steps 2 chunk .. 2 chunk + 3): s0 gets tokens 0-7, s1 tokens 8-15. `k_scales` is
/// the stage's [tokens, head_dim / 16] scale array.
template <int HeadDim>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void nvfp4_qk_chunk_pair(float (&s0)[4], float (&s1)[4], const unsigned char* k_tile,
                                                               const unsigned char* k_scales, int row0, int chunk,
                                                               const std::uint32_t (*q)[4], int lane) {
  using Row = KvRowGeometry<nvfp4, HeadDim>;
  const int matrix = lane >> 3;
  const int g = lane >> 2;
  const int t = lane & 3;
  std::uint32_t r[4];
  arch::ldmatrix_x4(r, k_tile + Row::byte_offset(row0 + (matrix >> 1) * 8 + (lane & 7), chunk + (matrix & 1)));
  // r[0]: tokens 0-7 x chunk; r[1]: tokens 0-7 x chunk+1; r[2], r[3]: tokens 8-15. Lane t's
  // codes are in block 2 chunk' + t/2: bytes t/2 (chunk) and 2 + t/2 (chunk + 1) of the
  // token's scale word chunk / 2, each repeated into both halves of its operand.
  const std::uint32_t h = static_cast<std::uint32_t>(t >> 1);
  const std::uint32_t dup = h * 0x1111u + 0x2200u;  // bytes [h, h, 2+h, 2+h]
  std::uint32_t scale_lo[2], scale_hi[2];
  nvfp4_scale_pairs(arch::prmt(nvfp4_scale_word<HeadDim>(k_scales, row0 + g, chunk / 2), 0u, dup), scale_lo);
  nvfp4_scale_pairs(arch::prmt(nvfp4_scale_word<HeadDim>(k_scales, row0 + 8 + g, chunk / 2), 0u, dup), scale_hi);
  // Each word widened right before its two mma (4 live registers, not 16).
SLIMSERVE_ATTENTION_UNROLL
  for (int i = 0; i < 4; ++i) {  // r[i]: chunk + (i & 1), tokens 8 (i >> 1) ..
    const int step = 2 * (chunk + (i & 1));  // k steps step and step + 1
    std::uint32_t w[4];
    nvfp4_widen8_parity_pairs(r[i], (i >> 1) == 0 ? scale_lo[i & 1] : scale_hi[i & 1], w);
    const std::uint32_t b_lo[2] = {w[0], w[1]}, b_hi[2] = {w[2], w[3]};
    mma<fp16>((i >> 1) == 0 ? s0 : s1, q[step], b_lo);
    mma<fp16>((i >> 1) == 0 ? s0 : s1, q[step + 1], b_hi);
  }
}

/// P·V for one k step (tokens row0..row0+15, P fragment `a`) over chunks `chunk`, `chunk`+1
/// (chunk even): output tiles 4 chunk .. 4 chunk + 7.
template <int HeadDim>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void nvfp4_pv_chunk_pair(float (*o)[4], const unsigned char* v_tile,
                                                               const unsigned char* v_scales, int row0, int chunk,
                                                               const std::uint32_t (&a)[4], int lane) {
  using Row = KvRowGeometry<nvfp4, HeadDim>;
  const int matrix = lane >> 3;
  const int g = lane >> 2;
  const int t = lane & 3;
  std::uint32_t r[4];
  arch::ldmatrix_x4_trans(r, v_tile + Row::byte_offset(row0 + (matrix & 1) * 8 + (lane & 7), chunk + (matrix >> 1)));
  // r[0]: tokens 2t, 2t+1 x chunk; r[1]: tokens 2t+8, 2t+9 x chunk; r[2], r[3]: chunk + 1.
  // Lane g's d are in block 2 chunk' + g/4: byte g/4 (chunk) and 2 + g/4 (chunk + 1) of each
  // token's scale word chunk / 2; operand halves = the two tokens.
  const std::uint32_t h = static_cast<std::uint32_t>(g >> 2);
  const std::uint32_t pick = h * 0x1111u + 0x6240u;  // [a.h, b.h, a.(2+h), b.(2+h)]
  std::uint32_t scale_lo[2], scale_hi[2];  // tokens 2t, 2t+1 and 2t+8, 2t+9; [chunk, chunk + 1]
  nvfp4_scale_pairs(arch::prmt(nvfp4_scale_word<HeadDim>(v_scales, row0 + 2 * t, chunk / 2),
                               nvfp4_scale_word<HeadDim>(v_scales, row0 + 2 * t + 1, chunk / 2), pick),
                    scale_lo);
  nvfp4_scale_pairs(arch::prmt(nvfp4_scale_word<HeadDim>(v_scales, row0 + 8 + 2 * t, chunk / 2),
                               nvfp4_scale_word<HeadDim>(v_scales, row0 + 9 + 2 * t, chunk / 2), pick),
                    scale_hi);
  // One chunk at a time: its two token halves widened, then its four mma (8 live registers).
SLIMSERVE_ATTENTION_UNROLL
  for (int j = 0; j < 2; ++j) {
    std::uint32_t lo[4], hi[4];  // tokens 2t, 2t+1 and 2t+8, 2t+9
    nvfp4_widen8_token_pairs(r[2 * j], scale_lo[j], lo);
    nvfp4_widen8_token_pairs(r[2 * j + 1], scale_hi[j], hi);
SLIMSERVE_ATTENTION_UNROLL
    for (int e = 0; e < 4; ++e) {
      const std::uint32_t b[2] = {lo[e], hi[e]};
      mma<fp16>(o[4 * (chunk + j) + e], a, b);
    }
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
