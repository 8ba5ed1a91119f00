#pragma once
/// \file
/// \brief Tensor-core fragments of paged K/V tiles: swizzled shared-memory rows, ldmatrix
/// addressing, and the conversion of FP8 fragments to the mma input type in registers.
///
/// A K/V tile in shared memory is [tokens, head_dim] in the stored type, one token per row of
/// `row_chunks` 16-byte chunks (any even number: head_dim 96 and 192 included), with the chunk
/// index XOR-swizzled by the row so that the eight rows an ldmatrix reads fall in different
/// bank groups (`swizzle_chunk`).
///
/// 16-bit caches feed ldmatrix results to mma.m16n8k16 unchanged. FP8 caches are read with the
/// same ldmatrix instructions (pairs of FP8 bytes look like one 16-bit element) and converted
/// once per fragment with `cvt.f16x2.e4m3x2` / `.e5m2x2` (exact: every FP8 value is an fp16
/// value); the FP8 mma input type is therefore fp16. The byte pairs land in a different order
/// than the mma expects, which is absorbed by permutations that cost nothing at run time:
///   - Q·K^T (contraction over head_dim): lane (g, t) of an ldmatrix holds bytes 4t..4t+3 of
///     a 16-byte chunk; the k index kappa of the mma maps to d = 4(kappa%8/2) + 2(kappa/8) +
///     kappa%2 inside the chunk, and the query fragment is loaded with the same map
///     (`fp8_q_column`).
///   - P·V (output columns): ldmatrix.trans gives a lane two adjacent d of two tokens; one prmt
///     splits them into an even-d and an odd-d fragment, so output tile n = 2c + parity holds
///     d = 16c + 2 col + parity (`output_column`).

#include <cstdint>
#include <type_traits>

#include "slimserve/arch/bit_ops.cuh"
#include "slimserve/arch/fp8_convert.cuh"
#include "slimserve/arch/fp8x4_convert.cuh"
#include "slimserve/arch/ldmatrix.cuh"
#include "slimserve/arch/mma.cuh"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/kv/kv_format.hpp"
#include "slimserve/runtime/platform.hpp"

#if defined(__CUDA_ARCH__)
#include "slimserve/formats/detail/device_convert.hpp"
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// XOR swizzle of chunk `chunk` (< Chunks) of `row`, for rows of any even number of 16-byte
/// chunks. The row is cut into aligned groups whose sizes are the powers of two that sum to
/// Chunks, largest first (24 = 16 + 8, 12 = 8 + 4, 6 = 4 + 2); a chunk moves only inside its
/// group, so the map is a permutation of the row. Inside a group of 8 or more, eight
/// consecutive rows send one logical chunk to eight different physical chunks; a smaller
/// group of n spreads them over n. A power-of-two row is one group: the original swizzle.
SLIMSERVE_HOST_DEVICE constexpr int largest_power_of_two_at_most(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

template <int Chunks>
SLIMSERVE_HOST_DEVICE constexpr int swizzle_chunk(int row, int chunk) {
  constexpr int group = largest_power_of_two_at_most(Chunks);
  static_assert(Chunks >= 2 && Chunks % 2 == 0, "rows of an even number of 16-byte chunks");
  const int in_group = group >= 8 ? chunk ^ (row & 7) : chunk ^ ((row / (8 / group)) & (group - 1));
  if constexpr (group == Chunks) {
    return in_group;
  } else {
    return chunk < group ? in_group : group + swizzle_chunk<Chunks - group>(row, chunk - group);
  }
}

/// Every row's chunks map one-to-one onto the row (checked at compile time per geometry).
template <int Chunks>
constexpr bool swizzle_is_permutation() {
  for (int row = 0; row < 16; ++row) {
    bool used[Chunks] = {};
    for (int chunk = 0; chunk < Chunks; ++chunk) {
      const int physical = swizzle_chunk<Chunks>(row, chunk);
      if (physical < 0 || physical >= Chunks || used[physical]) return false;
      used[physical] = true;
    }
  }
  return true;
}

/// Geometry of one K or V tile row (a token's head vector) in shared memory.
template <class KvT, int HeadDim>
struct KvRowGeometry {
  static constexpr int bits = KvFormat<KvT>::bits;  ///< the format's trait (kv/kv_format.hpp)
  /// Bytes of one element of a byte-sized format (sub-byte formats address by chunk_elements).
  static constexpr int element_bytes = bits / 8;
  static constexpr bool fp8 = fp8_format<KvT>;
  static constexpr int row_bytes = HeadDim * bits / 8;  ///< the codes of one head vector
  static constexpr int row_chunks = row_bytes / 16;  ///< 16-byte chunks per row
  static constexpr int chunk_elements = 128 / bits;  ///< elements in one 16-byte chunk
  static_assert(row_bytes % 32 == 0, "rows of an even number of 16-byte chunks: whole chunk pairs");
  static_assert(swizzle_is_permutation<row_chunks>());

  /// Physical chunk of logical `chunk` in `row` (swizzle_chunk).
  SLIMSERVE_HOST_DEVICE static constexpr int swizzle(int row, int chunk) {
    return swizzle_chunk<row_chunks>(row, chunk);
  }
  SLIMSERVE_HOST_DEVICE static constexpr int byte_offset(int row, int chunk) {
    return row * row_bytes + swizzle(row, chunk) * 16;
  }
};

/// The mma input type: the cache's own type for 16-bit caches, fp16 for FP8 and NVFP4 (exact
/// widening; the format trait's mma_input).
template <class KvT>
using mma_input_t = std::conditional_t<fp8_format<KvT> || std::is_same_v<KvT, nvfp4>, fp16, KvT>;

/// D += A * B on one m16n8k16 tile in the mma input type `T`.
template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void mma(float (&d)[4], const std::uint32_t (&a)[4],
                                               const std::uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, bf16>) {
    arch::mma_m16n8k16_bf16(d, a, b, d);
  } else {
    arch::mma_m16n8k16_fp16(d, a, b, d);
  }
}

/// Two floats rounded (RNE) to a packed pair of `T`, `lo` in bits 0..15.
template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE std::uint32_t pack_pair(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, bf16>) {
    return slimserve::detail::hw::float2_to_bf16x2(lo, hi);
  } else {
    return slimserve::detail::hw::float2_to_fp16x2(lo, hi);
  }
#else
  return static_cast<std::uint32_t>(from_float<T>(lo).bits) |
         static_cast<std::uint32_t>(from_float<T>(hi).bits) << 16;
#endif
}

/// 2^x with one MUFU.EX2 (flush-to-zero; -inf gives +0): softmax weights below 2^-126 are 0.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

/// Four FP8 codes (byte 0 first) -> f16x2 of codes 0, 1 (`lo`) and of codes 2, 3 (`hi`),
/// exactly. The upper pair is converted where it lies (F2FP's .H1 operand): one instruction per
/// pair, where converting `x >> 16` spends a shift on it first.
template <class KvT>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void fp8_quad_to_f16x2(std::uint32_t four_codes, std::uint32_t& lo,
                                                              std::uint32_t& hi) {
  if constexpr (std::is_same_v<KvT, fp8_e4m3>) {
    arch::cvt_e4m3x4_to_f16x2x2(four_codes, lo, hi);
  } else {
    arch::cvt_e5m2x4_to_f16x2x2(four_codes, lo, hi);
  }
}

/// Column (d, inside a 16-element k step) of element `e` (0..3 across registers a[0]/a[2] of
/// row g) that query fragment lane t must hold. 16-bit: 2t + e%2 + 8(e/2); FP8: 4t + e.
template <bool Fp8>
SLIMSERVE_HOST_DEVICE constexpr int q_fragment_column(int t, int e) {
  return Fp8 ? 4 * t + e : 2 * t + (e & 1) + 8 * (e >> 1);
}

/// head_dim index held by element i (0..3) of output tile `tile` in lane t.
template <bool Fp8>
SLIMSERVE_HOST_DEVICE constexpr int output_column(int tile, int t, int i) {
  const int col = 2 * t + (i & 1);
  return Fp8 ? 16 * (tile >> 1) + 2 * col + (tile & 1) : 8 * tile + col;
}

/// B fragments of Q·K^T for 16 tokens (rows `row0`..`row0`+15 of the K tile) and the 16-byte
/// chunks `chunk`, `chunk`+1, then the mma into the two score tiles. 16-bit: one k step
/// (k_step = chunk / 2); FP8: two k steps (chunk and chunk + 1).
template <class KvT, int HeadDim>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void qk_chunk_pair(float (&s0)[4], float (&s1)[4],
                                                          const unsigned char* k_tile, int row0,
                                                          int chunk, const std::uint32_t (*q)[4],
                                                          int lane) {
  using Row = KvRowGeometry<KvT, HeadDim>;
  using T = mma_input_t<KvT>;
  const int matrix = lane >> 3;
  const int row = row0 + (matrix >> 1) * 8 + (lane & 7);
  std::uint32_t r[4];
  arch::ldmatrix_x4(r, k_tile + Row::byte_offset(row, chunk + (matrix & 1)));
  if constexpr (Row::fp8) {
    // r[0]: tokens 0-7 x chunk; r[1]: tokens 0-7 x chunk+1; r[2], r[3]: tokens 8-15.
    std::uint32_t b00[2], b01[2], b10[2], b11[2];
    fp8_quad_to_f16x2<KvT>(r[0], b00[0], b00[1]);
    fp8_quad_to_f16x2<KvT>(r[1], b01[0], b01[1]);
    fp8_quad_to_f16x2<KvT>(r[2], b10[0], b10[1]);
    fp8_quad_to_f16x2<KvT>(r[3], b11[0], b11[1]);
    mma<T>(s0, q[chunk], b00);
    mma<T>(s0, q[chunk + 1], b01);
    mma<T>(s1, q[chunk], b10);
    mma<T>(s1, q[chunk + 1], b11);
  } else {
    const std::uint32_t b0[2] = {r[0], r[1]};
    const std::uint32_t b1[2] = {r[2], r[3]};
    mma<T>(s0, q[chunk >> 1], b0);
    mma<T>(s1, q[chunk >> 1], b1);
  }
}

/// P·V for one k step (tokens `row0`..`row0`+15 of the V tile, P fragment `a`) over the chunks
/// `chunk`, `chunk`+1: 16-bit updates output tiles chunk, chunk+1; FP8 updates 2 chunk ..
/// 2 chunk + 3 (even / odd d of each chunk).
template <class KvT, int HeadDim>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void pv_chunk_pair(float (*o)[4], const unsigned char* v_tile,
                                                          int row0, int chunk,
                                                          const std::uint32_t (&a)[4], int lane) {
  using Row = KvRowGeometry<KvT, HeadDim>;
  using T = mma_input_t<KvT>;
  const int matrix = lane >> 3;
  const int row = row0 + (matrix & 1) * 8 + (lane & 7);
  std::uint32_t r[4];
  arch::ldmatrix_x4_trans(r, v_tile + Row::byte_offset(row, chunk + (matrix >> 1)));
  if constexpr (Row::fp8) {
    // r[j]: bytes {V[2t][d], V[2t][d+1], V[2t+1][d], V[2t+1][d+1]}, d = 16 chunk' + 2g;
    // prmt regroups them as {tokens 2t, 2t+1 of d} (low half) and {... of d + 1} (high half).
    const std::uint32_t x0 = arch::prmt(r[0], 0u, 0x3120u);  // tokens 0-7, chunk
    const std::uint32_t x1 = arch::prmt(r[1], 0u, 0x3120u);  // tokens 8-15, chunk
    const std::uint32_t x2 = arch::prmt(r[2], 0u, 0x3120u);  // tokens 0-7, chunk + 1
    const std::uint32_t x3 = arch::prmt(r[3], 0u, 0x3120u);  // tokens 8-15, chunk + 1
    std::uint32_t even0[2], odd0[2], even1[2], odd1[2];
    fp8_quad_to_f16x2<KvT>(x0, even0[0], odd0[0]);
    fp8_quad_to_f16x2<KvT>(x1, even0[1], odd0[1]);
    fp8_quad_to_f16x2<KvT>(x2, even1[0], odd1[0]);
    fp8_quad_to_f16x2<KvT>(x3, even1[1], odd1[1]);
    mma<T>(o[2 * chunk], a, even0);
    mma<T>(o[2 * chunk + 1], a, odd0);
    mma<T>(o[2 * chunk + 2], a, even1);
    mma<T>(o[2 * chunk + 3], a, odd1);
  } else {
    const std::uint32_t b0[2] = {r[0], r[1]};
    const std::uint32_t b1[2] = {r[2], r[3]};
    mma<T>(o[chunk], a, b0);
    mma<T>(o[chunk + 1], a, b1);
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
