#pragma once
/// \file
/// \brief Absorbed MLA decode on sm_90a warpgroup MMA (wgmma): 64 packed rows per CTA (one
/// wgmma M), two warpgroups, the latent tile staged once per tile in the 128B-swizzled
/// canonical layout and read by both products. Same parameters, schedule and results as
/// mla_decode_kernel (the mma.sync kernel); the plan picks it only when asked and when a
/// request has at least 64 rows (MlaDecodeProblem::warpgroup_mma).
///
/// Per tile of 64 tokens (`Tile`), warpgroup w owns tokens [32 w, 32 w + 32) in S and latent
/// columns [256 w, 256 w + 256) (groups 2w, 2w+1) in O:
///   P. producer: 4 threads per token; BF16: cp.async of the record straight into the
///      swizzled latent tile of the stage (latent and rope: columns 0..575; two stages); FP8,
///      NVFP4: the codes and scales into their one stage (the next tile's are copied in as
///      soon as this tile's are widened), the BF16 rope into the stage's rope tile (two stages);
///   0. FP8: every thread widens 8 chunks of 16 codes into the one converted fp16 tile with
///      the group scale folded in (code x scale_g / 2^e, 2^e a power of two per token);
///      NVFP4: 4 chunks of 32 codes, each value e2m1 x block scale x 2^-14 (exact in fp16,
///      nvfp4_fragments.cuh) in a parity order within each 8 columns that Q shares, the
///      tensor scale x 2^14 applied to S and O in FP32;
///   1. S for the warpgroup's 32 tokens, in its accumulator registers: one m64n32k16 chain over
///      all 36 k steps (BF16); FP8, NVFP4: one chain for the latent and one (BF16) for the
///      rope, combined as 2^e S_latent + S_rope (NVFP4: tensor scale x 2^14 x S_latent + S_rope)
///      in FP32. N = 32 (not 16) halves the shared-memory
///      reads of Q per token (each k step's 2 KB of Q serves 32 tokens);
///   2. softmax in those registers (FlashAttention-3 style): mask, the row maximum over the
///      thread's 8 tokens and its quad, exchanged with the other warpgroup through 512 bytes
///      of shared memory; P = exp2(S - max), the sum kept per thread (reduced once at the end);
///   3. O = alpha O + P latent[tile, own columns]: the two k steps of the warpgroup's own tokens
///      with P from registers (the S accumulator layout is the A fragment layout: wgmma RS),
///      the other warpgroup's two k steps from the P tile it wrote (wgmma SS); latent MN-major,
///      the same bytes as in step 1.
/// Numerics: 16-bit inputs of mma_input_t<KvT> (fp16 for FP8 and NVFP4, with Q saturated to its range, NaN kept),
/// FP32 accumulation. FP8 unlike the mma.sync kernel: the latent reaches the mma dequantized to
/// fp16 (within 2^-10 of code x scale, relative; see step 0), and P carries 2^e x 2^8.
/// NVFP4 as the mma.sync kernel: an exact widening, P in fp16 as it is.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "slimserve/arch/cp_async.cuh"
#include "slimserve/arch/f16x2_math.cuh"
#include "slimserve/arch/satfinite_pack.cuh"
#include "slimserve/arch/fp8x4_convert.cuh"
#include "slimserve/arch/wgmma.cuh"
#include "slimserve/arch/wgmma_tile.cuh"
#include "slimserve/attention/kernels/mla_decode_kernel.cuh"
#include "slimserve/attention/kernels/mla_latent_rounding.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

template <class KvT>
struct MlaWgmmaTile {
  static constexpr bool fp8 = fp8_format<KvT>;
  /// NVFP4: E2M1 codes, an E4M3 scale per 16 values in the record, the tensor scale per tensor.
  static constexpr bool block_scaled = std::is_same_v<KvT, nvfp4>;
  /// FP8 and NVFP4: the latent reaches the mma widened to fp16 in one tile (step 0); BF16 is
  /// read where it was copied.
  static constexpr bool widened = fp8 || block_scaled;
  static constexpr int rows = 64;
  static constexpr int warpgroups = 2;
  static constexpr int threads = 128 * warpgroups;
  static constexpr int tile_tokens = 64;
  static constexpr int warpgroup_tokens = tile_tokens / warpgroups;  // 32: N of S, two k steps of O
  static constexpr int o_k_steps = warpgroup_tokens / 16;            // 2
  /// BF16: latent stages; FP8, NVFP4: rope and token-bias stages (the raw codes and scales
  /// have one stage: the next tile's are copied in once this tile is widened).
  static constexpr int stages = 2;
  static constexpr int dims = mla_latent_dim + mla_rope_dim;  // 576
  static constexpr int groups = mla_scale_groups;              // 4
  static constexpr int group_k_steps = mla_scale_group / 16;   // 8
  static constexpr int k_steps = dims / 16;                    // 36
  static constexpr int threads_per_token = threads / tile_tokens;  // 4
  using QTile = arch::WgmmaTile128B<rows, dims>;
  /// BF16: latent and rope, cp.async'd per stage; FP8, NVFP4: the latent widened to fp16, one tile.
  using LatentTile = arch::WgmmaTile128B<tile_tokens, widened ? mla_latent_dim : dims>;
  /// FP8, NVFP4: the BF16 rope, cp.async'd per stage straight into its own tile (a BF16 S chain).
  using RopeTile = arch::WgmmaTile128B<tile_tokens, mla_rope_dim>;
  using PTile = arch::WgmmaTile128B<rows, tile_tokens>;  // warpgroup w writes tokens [32 w, 32 w + 32)
  /// FP8: what a token's group scales become (see the widening): 2^e, the largest power of
  /// two not above its largest group scale, [0], and 2^e x per_token_p_headroom [1].
  static constexpr int token_factors = 2;
  // Raw codes of a token (FP8 512, NVFP4 256) and its scale bytes as the record holds them:
  // FP8 per-token-group floats (4 x 4), NVFP4 E4M3 block scales (32).
  static constexpr int code_bytes = block_scaled ? mla_latent_dim / 2 : mla_latent_dim;
  static constexpr int token_scale_bytes =
      fp8 ? groups * 4 : (block_scaled ? mla_latent_dim / nvfp4_block_elements : 0);
  static_assert(groups == 4 && threads_per_token == 4 && warpgroup_tokens == 32 && o_k_steps == 2);
  /// Where 16-byte chunk `chunk` of `token`'s raw codes sits in its raw row. NVFP4: at
  /// chunk ^ 2 (token % 4), because each quarter-warp of the widening reads chunks 2 b, 2 b + 1
  /// of 4 consecutive tokens (see there): the XOR gives its 8 lanes 8 different 16-byte bank
  /// groups. FP8: in place (a quarter-warp reads chunk positions 8 q .. 8 q + 7, 4 of each of
  /// two tokens: rows are 512 bytes, so the position alone sets the bank group).
  SLIMSERVE_HOST_DEVICE static constexpr int raw_chunk(int token, int chunk) {
    return block_scaled ? chunk ^ (2 * (token % 4)) : chunk;
  }
  /// The widening's thread map: the token and the 16-byte raw chunk (FP8 16 codes, NVFP4 32)
  /// that lane `lane` of warp `warp` widens in unit `unit` (0 .. widen_units - 1), each
  /// (token, chunk) once. A quarter-warp (the 8 lanes one 16-byte shared access serves
  /// together) must reach 8 different 16-byte bank groups when it loads raw chunks and when it
  /// stores the fp16 chunks into the swizzled tile (why each map: the widening step in the
  /// kernel).
  /// FP8: lane i of quarter-warp q, chunk 8 q + i, of token 2 w + 16 (u / 2) + (i / 4 xor u % 2).
  /// NVFP4: lane i of quarter-warp q, token 4 (w + 8 (u / 2)) + i / 2, chunk
  /// 2 (q + 4 (u % 2)) + i % 2.
  static constexpr int widen_units = block_scaled ? 4 : 8;
  SLIMSERVE_HOST_DEVICE static constexpr int widen_token(int warp, int lane, int unit) {
    return block_scaled ? 4 * (warp + (threads / 32) * (unit / 2)) + (lane % 8) / 2
                        : 2 * warp + 16 * (unit / 2) + (((lane / 4) % 2) ^ (unit % 2));
  }
  SLIMSERVE_HOST_DEVICE static constexpr int widen_chunk(int lane, int unit) {
    return block_scaled ? 2 * (lane / 8 + 4 * (unit % 2)) + lane % 2 : lane;
  }

  // Shared memory, carved by byte offsets (the tiles need 1024-byte alignment, more than a
  // struct can ask of the dynamic shared memory base).
  static constexpr std::uint32_t q_offset = 0;
  static constexpr std::uint32_t latent_offset = q_offset + QTile::bytes;
  static constexpr int latent_tiles = widened ? 1 : stages;
  static constexpr std::uint32_t p_offset = latent_offset + latent_tiles * LatentTile::bytes;
  /// P tile: the other warpgroup's k step of P (FP8: P x 2^e(token) x 2^8, one copy for
  /// every group, the group scales being folded into the widened latent; NVFP4: P itself).
  static constexpr int p_tiles = 1;
  static constexpr std::uint32_t raw_offset = p_offset + p_tiles * PTile::bytes;
  static constexpr std::uint32_t raw_bytes = widened ? tile_tokens * code_bytes : 0;  // one stage
  static constexpr std::uint32_t rope_offset = raw_offset + raw_bytes;
  static constexpr int rope_tiles = widened ? stages : 0;
  /// [tokens][token_scale_bytes], one stage with the codes.
  static constexpr std::uint32_t scales_offset = rope_offset + rope_tiles * RopeTile::bytes;
  /// Per stage and token: 0 when the token is readable, -inf past the range or on a bad page.
  static constexpr std::uint32_t token_bias_offset = scales_offset + tile_tokens * token_scale_bytes;
  /// FP8, per token of the tile being consumed: token_factors floats (written by the widening).
  static constexpr std::uint32_t token_factor_offset = token_bias_offset + stages * tile_tokens * 4;
  /// Per warpgroup and row: the tile's maximum (exchanged every tile), the final sum.
  static constexpr std::uint32_t stats_offset = token_factor_offset + (fp8 ? tile_tokens * token_factors * 4 : 0);
  static constexpr std::uint32_t shared_bytes = stats_offset + 2 * warpgroups * rows * 4;
  static_assert(shared_bytes <= 227 * 1024, "over the per-CTA shared memory limit");
  static_assert(latent_offset % 1024 == 0 && p_offset % 1024 == 0 && raw_offset % 1024 == 0 &&
                rope_offset % 1024 == 0);
};

/// One wgmma.mma_async with both operands in shared memory, in the 16-bit type T.
template <class T, int N, arch::WgmmaMajor BMajor = arch::WgmmaMajor::k>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void mla_wgmma_ss(float (&d)[N / 2], std::uint64_t desc_a,
                                                         std::uint64_t desc_b, bool accumulate) {
  if constexpr (std::is_same_v<T, bf16>) {
    arch::wgmma_mma_ss_bf16<N, arch::WgmmaMajor::k, BMajor>(d, desc_a, desc_b, accumulate);
  } else {
    arch::wgmma_mma_ss_fp16<N, arch::WgmmaMajor::k, BMajor>(d, desc_a, desc_b, accumulate);
  }
}
/// The same with A (K-major) from registers.
template <class T, int N, arch::WgmmaMajor BMajor = arch::WgmmaMajor::k>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void mla_wgmma_rs(float (&d)[N / 2], const std::uint32_t (&a)[4],
                                                         std::uint64_t desc_b, bool accumulate) {
  if constexpr (std::is_same_v<T, bf16>) {
    arch::wgmma_mma_rs_bf16<N, BMajor>(d, a, desc_b, accumulate);
  } else {
    arch::wgmma_mma_rs_fp16<N, BMajor>(d, a, desc_b, accumulate);
  }
}

template <class KvT>
__global__ void __launch_bounds__(MlaWgmmaTile<KvT>::threads)
    mla_wgmma_decode_kernel(const MlaDecodeParams p) {
  using Tile = MlaWgmmaTile<KvT>;
  using MmaT = mma_input_t<KvT>;
  using QTile = typename Tile::QTile;
  using LatentTile = typename Tile::LatentTile;
  using PTile = typename Tile::PTile;
  using RopeTile = typename Tile::RopeTile;
  constexpr bool fp8 = Tile::fp8;
  constexpr bool block_scaled = Tile::block_scaled;
  constexpr bool widened = Tile::widened;
  unsigned char* smem = rt::dynamic_shared_memory();
  float* tile_scales = reinterpret_cast<float*>(smem + Tile::scales_offset);  // FP8: [tokens][groups]
  float* stage_bias = reinterpret_cast<float*>(smem + Tile::token_bias_offset);  // [stages][tokens]
  float* tile_max = reinterpret_cast<float*>(smem + Tile::stats_offset);  // [warpgroups][rows]
  float* final_sum = tile_max + Tile::warpgroups * Tile::rows;             // [warpgroups][rows]
  const std::uint32_t smem_base = arch::wgmma_shared_address(smem);

  const int tid = static_cast<int>(threadIdx.x);
  // Warp-uniform (a shuffle from lane 0), so descriptor arithmetic stays in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int other_wg = 1 - wg;
  const int w = (tid / 32) % 4;  // warp within the warpgroup: rows 16 w ..
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  // The thread's accumulator rows (16 w + g, + 8) and, in S, tokens token0 + 8 c + {0, 1}, c = 0..3.
  const int rows_of_thread[2] = {16 * w + g, 16 * w + g + 8};
  const int token0 = Tile::warpgroup_tokens * wg + 2 * t;

  // Where the thread's P pairs of token block c (tokens token0 + 8 c) land in the P tile (row
  // rows_of_thread[0]; the second row is 8 rows, one 1024-byte swizzle pattern, further).
  std::uint32_t p_store_offset[Tile::warpgroup_tokens / 8];
SLIMSERVE_ATTENTION_UNROLL
  for (int c = 0; c < Tile::warpgroup_tokens / 8; ++c) {
    p_store_offset[c] = PTile::element_offset(rows_of_thread[0], token0 + 8 * c);
  }
  static_assert(PTile::group_bytes == 1024, "rows r and r + 8 share the swizzle, one pattern apart");

  const MlaWork work = mla_work<Tile::rows, Tile::tile_tokens>(p);
  if (work.aborted) {
    mla_write_aborted_rows<bf16>(p, work, tid, Tile::threads);
    return;
  }
  const std::int64_t tile_row0 = work.tile_row0;
  const std::int64_t valid_rows = work.valid_rows;

  // Q tile [64 rows][576] in the mma input type (FP8 and NVFP4 caches: the latent part fp16,
  // saturated to its range with NaN kept; the rope part BF16).
  {
    const bf16* q = static_cast<const bf16*>(p.q);
    constexpr int chunks = Tile::dims / 8;
    for (int i = tid; i < Tile::rows * chunks; i += Tile::threads) {
      const int r = i / chunks;
      const int chunk = i % chunks;
      const std::int64_t packed = tile_row0 + r;
      std::uint32_t words[4] = {0u, 0u, 0u, 0u};
      if (packed < valid_rows) {
        const std::int64_t base = (work.first_token + packed / p.num_heads) * p.q_token_stride +
                                  (packed % p.num_heads) * p.q_head_stride + 8 * chunk;
        const Vec16 raw = load16(q + base);  // 8 bf16 (q rows and strides are 16-byte aligned)
        if (std::is_same_v<MmaT, bf16> || chunk >= mla_latent_dim / 8) {
          // BF16 as it is (the rope part always: FP8 caches keep a BF16 rope, a BF16 chain).
          std::memcpy(words, raw.word, sizeof words);
        } else {
          float v[8];
SLIMSERVE_ATTENTION_UNROLL
          for (int e = 0; e < 8; ++e) {
            v[e] = to_float(bf16::from_bits(static_cast<std::uint16_t>(raw.word[e / 2] >> (16 * (e % 2)))));
          }
SLIMSERVE_ATTENTION_UNROLL
          for (int e = 0; e < 4; ++e) {
            // the chunk's positions 2e, 2e + 1 (mla_latent_column: NVFP4's parity order), into
            // fp16 operands: saturated to the fp16 range, NaN kept (cvt.rn.satfinite)
            words[e] = arch::pack_satfinite<MmaT>(v[mla_latent_column<KvT>(2 * e)], v[mla_latent_column<KvT>(2 * e + 1)]);
          }
        }
      }
      Vec16 chunk_value;
      std::memcpy(chunk_value.word, words, sizeof words);
      store16(smem + Tile::q_offset + QTile::chunk_offset(r, chunk), chunk_value);
    }
  }

  // Group scales exist only for FP8 latents: a compile-time false for BF16 and NVFP4.
  const bool group_scales = fp8 && p.scale_mode == MlaScaleMode::per_token_group;
  // NVFP4: the factor of the latent part of S and of the output, the tensor scale x 2^14 (the
  // widened values carry 2^-14, nvfp4_fragments.cuh); NaN when the tensor scale (or that
  // product) is not finite and > 0.
  float static_scale = p.scale_mode == MlaScaleMode::per_tensor ? *p.latent_scale : 1.0f;
  if constexpr (block_scaled) static_scale = nvfp4_checked_tensor_scale(static_scale, nvfp4_fragment_unit);

  // Latent columns [256 wg, 256 wg + 256) (groups 2 wg, 2 wg + 1): D of m64n256, o_acc[64 j + i]
  // the m64n128 element i of group 2 wg + j.
  float o_acc[128];
SLIMSERVE_ATTENTION_UNROLL
  for (int j = 0; j < 2; ++j) {
SLIMSERVE_ATTENTION_UNROLL
    for (int i = 0; i < 64; ++i) o_acc[64 * j + i] = 0.0f;
  }

  // Softmax state of the thread's two rows, the same in both warpgroups; the sum is this
  // thread's share (its tokens), reduced once at the end.
  std::int64_t query_position[2];
  float run_max[2] = {-INFINITY, -INFINITY};
  float run_sum[2] = {0.0f, 0.0f};
SLIMSERVE_ATTENTION_UNROLL
  for (int h = 0; h < 2; ++h) query_position[h] = work.query_position(p, tile_row0 + rows_of_thread[h]);
  // Tiles ending at or before this position need no causal mask (the CTA's first row sees the least).
  const std::int64_t unmasked_end = work.query_position(p, tile_row0);

  const int producer_token = tid / Tile::threads_per_token;
  const int producer_sub = tid % Tile::threads_per_token;
  // Producer: threads_per_token (4) threads per token, each forming the token's record address
  // once per tile. stage: the latent (BF16) or rope and bias (FP8, NVFP4) stage; the codes and
  // scales go to their one stage.
  auto produce = [&](std::int32_t i, int stage) {
    bool ok = false;
    const unsigned char* record =
        mla_token_record(p, work, work.kv_begin + static_cast<std::int64_t>(i) * Tile::tile_tokens + producer_token, ok);
    constexpr int tpt = Tile::threads_per_token;
    if constexpr (widened) {
      unsigned char* raw = smem + Tile::raw_offset + producer_token * Tile::code_bytes;
      constexpr int code_chunks = Tile::code_bytes / 16;  // FP8 32: 8 per thread; NVFP4 16: 4
      static_assert(code_chunks % tpt == 0 && (mla_rope_dim / 8) % tpt == 0);
      // NVFP4: Tile::raw_chunk(token, sub + 4 k) is raw_chunk(token, sub) + 4 k for even k and
      // raw_chunk(token, sub + 4) + 4 (k - 1) for odd k (the XOR reaches bits 1-2 only): two
      // bases. FP8: in place, one base.
      const int placed[2] = {Tile::raw_chunk(producer_token, producer_sub),
                             block_scaled ? Tile::raw_chunk(producer_token, producer_sub + tpt) : producer_sub};
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < code_chunks / tpt; ++k) {
        const int chunk = producer_sub + tpt * k;
        const int at = block_scaled ? placed[k % 2] + tpt * (k - k % 2) : placed[0] + tpt * k;
        arch::cp_async_16_zfill(raw + 16 * at, record + 16 * chunk, ok);
      }
      // Rope chunks sub and sub + 4 (8 BF16 values each) straight into the stage's rope tile.
      unsigned char* rope = smem + Tile::rope_offset + stage * RopeTile::bytes;
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < mla_rope_dim / 8 / tpt; ++k) {
        arch::cp_async_16_zfill(rope + RopeTile::chunk_offset(producer_token, producer_sub + tpt * k),
                                record + p.rope_offset + 16 * (producer_sub + tpt * k), ok);
      }
    } else {
      // Chunk c = sub + 4 h + 8 k of the token's row (h = 0, 1) sits at k column blocks from
      // chunk sub + 4 h: two swizzled bases, constant offsets from each.
      unsigned char* tile = smem + Tile::latent_offset + stage * LatentTile::bytes;
      constexpr int chunks = Tile::dims / 8;  // 72: 18 per thread
      static_assert(chunks % 8 == 0 && tpt == 4);
SLIMSERVE_ATTENTION_UNROLL
      for (int h = 0; h < 2; ++h) {
        unsigned char* base = tile + LatentTile::chunk_offset(producer_token, producer_sub + tpt * h);
SLIMSERVE_ATTENTION_UNROLL
        for (int k = 0; k < chunks / 8; ++k) {
          const int c = producer_sub + tpt * h + 8 * k;
          const unsigned char* source =
              k < mla_latent_dim / 64 ? record + 16 * c : record + p.rope_offset + 16 * (c - mla_latent_dim / 8);
          arch::cp_async_16_zfill(base + k * LatentTile::block_bytes, source, ok);
        }
      }
    }
    if constexpr (block_scaled) {
      // The token's 32 block scales (right after its codes in the record), 16 bytes each by
      // threads 0 and 1 of the token.
      static_assert(Tile::token_scale_bytes == 2 * 16);
      if (producer_sub < 2) {
        arch::cp_async_16_zfill(smem + Tile::scales_offset + producer_token * Tile::token_scale_bytes + 16 * producer_sub,
                                record + mla_latent_dim / 2 + 16 * producer_sub, ok);
      }
    }
    if (producer_sub == 0) {
      if (group_scales) {
        arch::cp_async_16_zfill(tile_scales + producer_token * Tile::groups, record + p.scales_offset, ok);
      }
      stage_bias[stage * Tile::tile_tokens + producer_token] = ok ? 0.0f : -INFINITY;
    }
  };

  // after_widen: FP8, NVFP4, called once the stage's codes and scales are widened and free (it
  // copies the next tile's in); BF16 copies before consume.
  auto consume = [&](int stage, std::int32_t tile_index, auto&& after_widen) {
    const std::int64_t tile_begin = work.kv_begin + static_cast<std::int64_t>(tile_index) * Tile::tile_tokens;
    const float* token_bias = stage_bias + stage * Tile::tile_tokens;
    // Uniform across the CTA; the shuffle from lane 0 tells the compiler so, which keeps the
    // descriptors in uniform registers (no per-wgmma moves into them).
    const std::uint32_t latent_tile = __shfl_sync(
        0xffffffffu, smem_base + Tile::latent_offset + (widened ? 0u : static_cast<std::uint32_t>(stage) * LatentTile::bytes),
        0);
    if constexpr (block_scaled) {
      // 0. NVFP4: widen the stage's codes (each once) into the converted tile, each value
      //    e2m1 x block scale x 2^-14, exactly (fp16 subnormals included, nvfp4_fragments.cuh),
      //    in the parity order of `mla_latent_column`; the tensor scale x 2^14 is static_scale,
      //    applied to the latent part of S and to the output in FP32.
      //    A thread widens 32-code chunks c (blocks 2c, 2c + 1; fp16 chunks 4c .. 4c + 3 of the
      //    row). Lane i of quarter-warp q of warp w, in unit u, takes token
      //    4 (w + 8 (u / 2)) + i / 2 and chunk 2 (q + 4 (u % 2)) + i % 2: a quarter-warp (the
      //    lanes one 16-byte shared access serves together) spans 4 tokens and 2 chunks, so
      //    its stores land on 8 different bank groups of the swizzled tile (row % 8 differs),
      //    where 8 chunks of one token hit 2 (4-way conflicts); its raw loads do too through
      //    Tile::raw_chunk. Every address is a per-thread base plus a constant.
      const unsigned char* raw = smem + Tile::raw_offset;
      const unsigned char* block_scales = smem + Tile::scales_offset;
      unsigned char* tile = smem + Tile::latent_offset;
      constexpr int code_chunks = Tile::code_bytes / 16;  // 16 chunks of 32 codes per token
      static_assert(code_chunks == 16 && Tile::tile_tokens == 4 * (Tile::threads / 32) * (Tile::widen_units / 2) &&
                        Tile::token_scale_bytes == 2 * code_chunks,
                    "each (token, chunk) exactly once: 4 tokens x 2 chunks per quarter-warp");
      const int warp = tid / 32;
      // Unit u moves unit 0's token by 32 (u / 2) and its chunk by 8 (u % 2), chunk0 < 8: the
      // raw chunk (an XOR of bits 1-2) moves by 8 too, the tile's by a whole column block x 4
      // and by 4 row groups. So every address is one of the bases below plus a constant.
      const int widen_token0 = Tile::widen_token(warp, lane, 0);
      const int widen_chunk0 = Tile::widen_chunk(lane, 0);
      static_assert(Tile::widen_units == 4);
      const unsigned char* raw_base = raw + widen_token0 * Tile::code_bytes + 16 * Tile::raw_chunk(widen_token0, widen_chunk0);
      const unsigned char* scale_base = block_scales + widen_token0 * Tile::token_scale_bytes + 2 * widen_chunk0;
      std::uint32_t store_base[4];
SLIMSERVE_ATTENTION_UNROLL
      for (int word = 0; word < 4; ++word) store_base[word] = LatentTile::chunk_offset(widen_token0, 4 * widen_chunk0 + word);
SLIMSERVE_ATTENTION_UNROLL
      for (int unit = 0; unit < Tile::widen_units; ++unit) {
        constexpr int token_step = 32, chunk_step = 8;
        const int token_shift = token_step * (unit / 2), chunk_shift = chunk_step * (unit % 2);
        const Vec16 codes = load16(raw_base + token_shift * Tile::code_bytes + 16 * chunk_shift);
        std::uint16_t scale_pair = 0;  // blocks 2c (low byte) and 2c + 1
        std::memcpy(&scale_pair, scale_base + token_shift * Tile::token_scale_bytes + 2 * chunk_shift, sizeof(scale_pair));
        // chunk_offset(widen_token0 + token_shift, 4 (widen_chunk0 + chunk_shift) + word), as a constant step:
        const std::uint32_t tile_shift = LatentTile::chunk_offset(token_shift, 4 * chunk_shift);
        nvfp4_widen32_parity(codes, scale_pair, [&](int word, const Vec16& wide) {  // values 32 c + 8 word ..
          store16(tile + store_base[word] + tile_shift, wide);
        });
      }
      arch::fence_proxy_async_shared();  // also covers the rope tile this thread cp.async'd
      __syncthreads();
      after_widen();  // every thread is past its codes and scales: the next tile's may come
    } else if constexpr (fp8) {
      // 0. Widen the stage's codes (each once) into the converted tile, the group scale folded
      //    in: latent = code x scale_g = 2^e x (code x m_g), 2^e a power of two per token and
      //    m_g = scale_g / 2^e (exact); m_g is rounded to fp16, then code x m_g (so each value
      //    is within 2^-10 of code x scale_g, relative, as dequantizing to fp16 would leave it;
      //    FlashMLA dequantizes to BF16, 2^-8); 2^e scales S (FP32, exact) and P. e is the
      //    exponent of the token's largest group scale, so m_g < 2 and |code x m_g| < 896,
      //    clamped to [-22, 7] so that P x 2^e x 2^8 stays in fp16's normal range (2^-14 ..
      //    2^15 for P = 1; below 2^-22 a token's m_g < 1 instead, losing precision only under
      //    2^-36, where the latent is negligible); a clamped token carries m_g up to 146 (a group
      //    scale up to 2^7 x 146 ~ 1.9e4, i.e. |latent| up to 8.3e6, before code x m_g would
      //    pass fp16's 65504). One S chain for the latent, one P copy for all groups.
      //    Lane i of quarter-warp q of warp w, in unit u, widens the 16-code chunk c = 8 q + i
      //    (fp16 chunks 2c, 2c + 1; scale group q) of token 2 w + 16 (u / 2) + e, e = i / 4 xor
      //    u % 2 (Tile::widen_token): a quarter-warp spans two tokens of different parity, 4
      //    chunks each, so its stores land on 8 different bank groups of the swizzled tile
      //    (the even chunks 2c of one token reach only 4: 2-way conflicts), and its raw loads,
      //    8 consecutive chunk positions, on 8 too. Every address is one of two per-thread
      //    bases (e's two values) plus a constant.
      const unsigned char* raw = smem + Tile::raw_offset;
      unsigned char* tile = smem + Tile::latent_offset;
      constexpr int code_chunks = Tile::code_bytes / 16;  // 32 chunks of 16 codes per token
      constexpr int units = Tile::widen_units;  // 8
      constexpr int warps = Tile::threads / 32;
      static_assert(code_chunks == 32 && units == 8 && Tile::groups == 4 && code_chunks / Tile::groups == 8 &&
                        Tile::tile_tokens == 2 * warps * (units / 2),
                    "each (token, chunk) once: two tokens x 4 chunks per quarter-warp, group = lane / 8");
      const int warp = tid / 32;
      // A warp's 8 tokens by slot j: token 2 w + 16 (j / 2) + j % 2. Lane 8 g + j derives the
      // factor of (slot j, group g); the widening fetches it by slot within its 8-lane segment.
      std::uint32_t group_factor = 0;  // f16x2 (m, m)
      {
        const int slot = lane % 8;
        const int prep_token = 2 * warp + 16 * (slot / 2) + slot % 2;
        const int prep_group = lane / 8;
        const float scale = group_scales ? tile_scales[prep_token * Tile::groups + prep_group] : static_scale;
        float token_max = fmaxf(scale, __shfl_xor_sync(0xffffffffu, scale, 8));
        token_max = fmaxf(token_max, __shfl_xor_sync(0xffffffffu, token_max, 16));
        // 2^e from the exponent field, clamped as above.
        const ClampedPowerOfTwo<mla_min_token_exponent, mla_max_token_exponent> e(token_max);
        const float power = e.power;
        const float m = scale * e.inverse;
        group_factor = pack_pair<fp16>(m, m);
        if (lane < 8) {  // group 0's lane of each slot: the token's factors for S and P
          float* factors = reinterpret_cast<float*>(smem + Tile::token_factor_offset) + prep_token * Tile::token_factors;
          factors[0] = power;
          factors[1] = power * per_token_p_headroom;
        }
      }
      // Unit u: token widen_token(w, lane, u % 2) + 16 (u / 2), 16 rows on (the swizzle, row % 8,
      // unchanged): bases for u % 2, constant steps for u / 2.
      const int parity = (lane / 4) % 2;  // e for even units; odd units take 1 - parity
      const unsigned char* raw_base[2];
      std::uint32_t store_base[2][2];
SLIMSERVE_ATTENTION_UNROLL
      for (int s = 0; s < 2; ++s) {
        const int token = Tile::widen_token(warp, lane, s), c = Tile::widen_chunk(lane, s);
        raw_base[s] = raw + token * Tile::code_bytes + 16 * c;
        store_base[s][0] = LatentTile::chunk_offset(token, 2 * c);
        store_base[s][1] = LatentTile::chunk_offset(token, 2 * c + 1);
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int unit = 0; unit < units; ++unit) {
        constexpr int token_step = 16;
        const int s = unit % 2, token_shift = token_step * (unit / 2);
        const std::uint32_t factor = __shfl_sync(0xffffffffu, group_factor, 2 * (unit / 2) + (parity ^ s), 8);
        const Vec16 codes = load16(raw_base[s] + token_shift * Tile::code_bytes);
        Vec16 wide[2];
SLIMSERVE_ATTENTION_UNROLL
        for (int k = 0; k < 4; ++k) {
          // Both pairs of the word converted in place (the upper one read as the register's
          // upper half, not shifted down first: 4 instructions per unit fewer).
          std::uint32_t pair[2];
          if constexpr (std::is_same_v<KvT, fp8_e4m3>) {
            arch::cvt_e4m3x4_to_f16x2x2(codes.word[k], pair[0], pair[1]);
          } else {
            arch::cvt_e5m2x4_to_f16x2x2(codes.word[k], pair[0], pair[1]);
          }
SLIMSERVE_ATTENTION_UNROLL
          for (int half = 0; half < 2; ++half) {
            wide[k / 2].word[2 * (k % 2) + half] = arch::mul_rn_f16x2(pair[half], factor);
          }
        }
        // chunk_offset(token + token_shift, ..) - chunk_offset(token, ..): whole rows.
        const std::uint32_t tile_shift = LatentTile::chunk_offset(token_shift, 0);
        store16(tile + store_base[s][0] + tile_shift, wide[0]);
        store16(tile + store_base[s][1] + tile_shift, wide[1]);
      }
      arch::fence_proxy_async_shared();  // also covers the rope tile this thread cp.async'd
      __syncthreads();
      after_widen();  // every thread is past its codes and scales: the next tile's may come
    }

    // 1. S[64 rows, the warpgroup's 32 tokens] in registers (m64n32: each Q k step read from
    //    shared memory serves 32 tokens). d[i]: row rows_of_thread[(i/2)%2], token token0 +
    //    8 (i/4) + i%2. BF16: one chain; FP8, NVFP4: the (scaled) latent, and the rope.
    constexpr int chains = widened ? 2 : 1;
    constexpr int n = Tile::warpgroup_tokens;  // 32
    constexpr int s_regs = n / 2;              // 16
    float s_acc[chains][s_regs];
    {
      const std::uint64_t q_desc = QTile::k_major_descriptor(smem_base + Tile::q_offset, 0);
      const std::uint64_t b_desc = LatentTile::k_major_descriptor(
          latent_tile + (n / 8) * LatentTile::group_bytes * static_cast<std::uint32_t>(wg), 0);
      arch::wgmma_fence();
      constexpr int latent_steps = widened ? mla_latent_dim / 16 : Tile::k_steps;
      // Descriptor steps as plain 64-bit adds (a step never carries out of the 14-bit start
      // address: shared addresses stay below 256 KB): ptxas keeps each base in a uniform
      // register pair and forms each wgmma's descriptor with one UIADD3.64. Adding to the low
      // 32-bit word only (a helper this kernel used before) made it rebuild the latent
      // descriptor's constant high word for every wgmma — three uniform instructions per S
      // wgmma instead of two.
      // (BF16 442 -> 409, FP8 558 -> 527 warp-instructions per warp and tile.)
SLIMSERVE_ATTENTION_UNROLL
      for (int step = 0; step < latent_steps; ++step) {
        mla_wgmma_ss<MmaT, n>(s_acc[0], q_desc + QTile::k_major_step(step),
                               b_desc + LatentTile::k_major_step(step), step != 0);
      }
      if constexpr (widened) {
        // The rope: BF16 Q columns 512..575 against the stage's BF16 rope tile, chain 1.
        const std::uint32_t rope_tile = __shfl_sync(
            0xffffffffu, smem_base + Tile::rope_offset + static_cast<std::uint32_t>(stage) * RopeTile::bytes, 0);
        const std::uint64_t rope_desc = RopeTile::k_major_descriptor(
            rope_tile + (n / 8) * RopeTile::group_bytes * static_cast<std::uint32_t>(wg), 0);
SLIMSERVE_ATTENTION_UNROLL
        for (int step = 0; step < mla_rope_dim / 16; ++step) {
          mla_wgmma_ss<bf16, n>(s_acc[1],
                                 q_desc + QTile::k_major_step(latent_steps + step),
                                 rope_desc + RopeTile::k_major_step(step), step != 0);
        }
      }
      arch::wgmma_commit_group();
      arch::wgmma_wait_group<0>();
    }
    float s[s_regs];
    // The thread's tokens: token0 + 8 (k / 2) + k % 2, k = 0..7; element i of S holds token
    // k = 2 (i / 4) + i % 2 of row (i / 2) % 2.
    constexpr int thread_tokens = s_regs / 2;  // 8
    // FP8: the thread's tokens' factors (2^e, 2^e x headroom), tokens 2 pair, 2 pair + 1 in one load.
    // token_factor[Tile::token_factors * k + f]: factor f of the thread's token k.
    [[maybe_unused]] float token_factor[thread_tokens * Tile::token_factors];
    if constexpr (fp8) {
      const float* factors = reinterpret_cast<const float*>(smem + Tile::token_factor_offset);
SLIMSERVE_ATTENTION_UNROLL
      for (int pair = 0; pair < thread_tokens / 2; ++pair) {
        const Vec16 v = load16(factors + (token0 + 8 * pair) * Tile::token_factors);
        static_assert(sizeof v.word == 2 * Tile::token_factors * sizeof(float));
        std::memcpy(token_factor + 2 * Tile::token_factors * pair, v.word, sizeof v.word);
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < s_regs; ++i) {
        s[i] = fmaf(s_acc[0][i], token_factor[Tile::token_factors * (2 * (i / 4) + i % 2)], s_acc[1][i]);
      }
    } else if constexpr (block_scaled) {
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < s_regs; ++i) s[i] = fmaf(s_acc[0][i], static_scale, s_acc[1][i]);
    } else {
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < s_regs; ++i) s[i] = s_acc[0][i];
    }

    // 2. Mask (token in range and on a valid page; causal only where a row can be short of
    //    the tile's end), the row maximum across both warpgroups, exp2.
    float row_tile_max[2] = {-INFINITY, -INFINITY};
    {
      float bias[thread_tokens];
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < thread_tokens; ++k) bias[k] = token_bias[token0 + 8 * (k / 2) + k % 2];
      // Row h sees the tile's tokens up to visible_end[h] (inclusive, tile-relative): all of
      // them unless the tile reaches past the first row's query position. Only such tiles
      // (a request's last, or a chunk's last few) compare positions: a CTA-uniform branch, so
      // every other tile adds the bias alone (one instruction per score, not three).
      if (tile_begin + Tile::tile_tokens - 1 > unmasked_end) {
        int visible_end[2];
SLIMSERVE_ATTENTION_UNROLL
        for (int h = 0; h < 2; ++h) {
          const std::int64_t end = query_position[h] - tile_begin;
          visible_end[h] = end < -1 ? -1 : (end > Tile::tile_tokens ? Tile::tile_tokens : static_cast<int>(end));
        }
SLIMSERVE_ATTENTION_UNROLL
        for (int i = 0; i < s_regs; ++i) {
          const int h = (i / 2) % 2;
          const int k = 2 * (i / 4) + i % 2;
          s[i] = token0 + 8 * (i / 4) + i % 2 <= visible_end[h] ? s[i] + bias[k] : -INFINITY;
        }
      } else {
SLIMSERVE_ATTENTION_UNROLL
        for (int i = 0; i < s_regs; ++i) s[i] += bias[2 * (i / 4) + i % 2];
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < s_regs; ++i) row_tile_max[(i / 2) % 2] = fmaxf(row_tile_max[(i / 2) % 2], s[i]);
SLIMSERVE_ATTENTION_UNROLL
      for (int h = 0; h < 2; ++h) {
        row_tile_max[h] = fmaxf(row_tile_max[h], __shfl_xor_sync(0xffffffffu, row_tile_max[h], 1));
        row_tile_max[h] = fmaxf(row_tile_max[h], __shfl_xor_sync(0xffffffffu, row_tile_max[h], 2));
        if (t == 0) tile_max[wg * Tile::rows + rows_of_thread[h]] = row_tile_max[h];
      }
    }
    __syncthreads();
    float alpha[2];
    float base[2];
SLIMSERVE_ATTENTION_UNROLL
    for (int h = 0; h < 2; ++h) {
      // max(S) x score_scale (> 0) is the maximum of the scaled scores; fmaxf is exact and
      // commutative, so both warpgroups compute the same running maximum.
      const float other = tile_max[other_wg * Tile::rows + rows_of_thread[h]];
      const float new_max = fmaxf(run_max[h], fmaxf(row_tile_max[h], other) * p.score_scale);
      base[h] = new_max == -INFINITY ? 0.0f : new_max;
      alpha[h] = fast_exp2(run_max[h] - base[h]);  // 0 before the first visible token
      run_max[h] = new_max;
    }
    float weight[s_regs];
    float sum[2] = {0.0f, 0.0f};
SLIMSERVE_ATTENTION_UNROLL
    for (int i = 0; i < s_regs; ++i) {
      const int h = (i / 2) % 2;
      weight[i] = fast_exp2(fmaf(s[i], p.score_scale, -base[h]));  // masked: exp2(-inf) = 0
      sum[h] += weight[i];
    }
SLIMSERVE_ATTENTION_UNROLL
    for (int h = 0; h < 2; ++h) run_sum[h] = run_sum[h] * alpha[h] + sum[h];

    // P as A fragments, one set of 4 per k step of 16 tokens (p_own[ks][k]: rows_of_thread[k
    // % 2], tokens token0 + 16 ks + 8 (k / 2) + {0, 1}: the m64n32 accumulator's columns
    // [16 ks, 16 ks + 16) are the A fragment of k step ks): the own k steps from registers; the
    // other warpgroup's through the P tile. FP8: P x 2^e(token) x 2^8 (the latent tile holds
    // code x m_g; the headroom keeps small 2^e x P out of fp16 subnormals and is undone at the end).
    std::uint32_t p_own[Tile::o_k_steps][4];
    // Where pair q = 4 ks + k lands in the P tile: row rows_of_thread[q % 2], tokens token0 + 8 (q / 2).
    auto p_offset = [&](int q) { return p_store_offset[q / 2] + (q % 2) * PTile::group_bytes; };
SLIMSERVE_ATTENTION_UNROLL
    for (int q = 0; q < thread_tokens; ++q) {
      float p0 = weight[2 * q];
      float p1 = weight[2 * q + 1];
      if constexpr (fp8) {
        p0 *= token_factor[Tile::token_factors * (2 * (q / 2)) + 1];
        p1 *= token_factor[Tile::token_factors * (2 * (q / 2) + 1) + 1];
      }
      p_own[q / 4][q % 4] = pack_pair<MmaT>(p0, p1);
      store4(smem + Tile::p_offset + p_offset(q), p_own[q / 4][q % 4]);
    }
    arch::fence_proxy_async_shared();
    __syncthreads();

    // 3. O[:, groups 2 wg, 2 wg + 1] = alpha O + P . latent[tile, group columns].
    {
      // Once the row maxima settle every alpha is 1: skip the 128 multiplies (warp vote).
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
SLIMSERVE_ATTENTION_UNROLL
        for (int j = 0; j < 2; ++j) {
SLIMSERVE_ATTENTION_UNROLL
          for (int i = 0; i < 64; ++i) o_acc[64 * j + i] *= alpha[(i / 2) % 2];
        }
      }
      const std::uint64_t v_desc = LatentTile::mn_major_descriptor(latent_tile, 0, 0);
      arch::wgmma_fence();
      // One m64n256 per k step over the warpgroup's 256 columns (two m64n128 would read each
      // P k step of the SS form twice and need twice the descriptors).
      const std::uint64_t p_desc = PTile::k_major_descriptor(smem_base + Tile::p_offset, 0);
      const int column0 = 2 * mla_scale_group * wg;
SLIMSERVE_ATTENTION_UNROLL
      for (int ks = 0; ks < Tile::o_k_steps; ++ks) {
        const int own_step = Tile::o_k_steps * wg + ks;
        const int other_step = Tile::o_k_steps * other_wg + ks;
        mla_wgmma_rs<MmaT, 256, arch::WgmmaMajor::mn>(
            o_acc, p_own[ks], v_desc + LatentTile::mn_major_step(own_step, column0), true);
        mla_wgmma_ss<MmaT, 256, arch::WgmmaMajor::mn>(o_acc, p_desc + PTile::k_major_step(other_step),
                                                      v_desc + LatentTile::mn_major_step(other_step, column0), true);
      }
      arch::wgmma_commit_group();
      arch::wgmma_wait_group<0>();
    }
  };

  // Two stages: tile i + 1 is copied while tile i is consumed (BF16: from the loop top; FP8,
  // NVFP4: once tile i's codes are widened, the codes and scales having one stage), and the wait at
  // the loop top is for everything in flight.
  static_assert(Tile::stages == 2);
  if (work.num_tiles > 0) produce(0, 0);
  arch::cp_async_commit();
  for (std::int32_t i = 0; i < work.num_tiles; ++i) {
    const int stage = i % 2;
    arch::cp_async_wait<0>();
    // BF16: the copies are read by wgmma next. FP8, NVFP4: the widening's fence, after this barrier,
    // covers the rope tile (each thread fences after its own copies completed).
    if constexpr (!Tile::widened) arch::fence_proxy_async_shared();
    __syncthreads();  // tile i visible to all; tile i - 1 consumed by all
    auto produce_next = [&] {
      if (i + 1 < work.num_tiles) produce(i + 1, 1 - stage);
      arch::cp_async_commit();
    };
    if constexpr (Tile::widened) {
      consume(stage, i, produce_next);
    } else {
      produce_next();
      consume(stage, i, [] {});
    }
  }
  arch::cp_async_wait<0>();

  // Epilogue: each row's sum over its quad and both warpgroups.
SLIMSERVE_ATTENTION_UNROLL
  for (int h = 0; h < 2; ++h) {
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 1);
    run_sum[h] += __shfl_xor_sync(0xffffffffu, run_sum[h], 2);
    if (t == 0) final_sum[wg * Tile::rows + rows_of_thread[h]] = run_sum[h];
  }
  __syncthreads();
  const float out_scale = fp8 ? 1.0f / per_token_p_headroom : static_scale;  // FP8: P carried 2^8
  // NVFP4 with a tensor scale that is not finite and > 0: NaN rows and lse, as the mma.sync
  // kernel gives (its NaN scores would otherwise read as rows that see no token).
  const bool invalid_scale = block_scaled && static_scale != static_scale;
SLIMSERVE_ATTENTION_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int r = rows_of_thread[half];
    const std::int64_t packed = tile_row0 + r;
    const float sum = final_sum[r] + final_sum[Tile::rows + r];  // the same order in both warpgroups
    if (wg == 0 && t == 0) {
      mla_write_row_lse(p, work, r, invalid_scale ? NAN : run_max[half], invalid_scale ? NAN : sum);
    }
    const bool empty = sum == 0.0f;  // a NaN sum (a NaN key read) is not empty: NaN row and lse
    const float norm = invalid_scale ? NAN : (empty ? 0.0f : out_scale / sum);
    if (!p.split_kv && packed >= valid_rows) continue;
    float* po = p.split_kv ? p.partial_o + work.partial_row(r) * mla_latent_dim : nullptr;
    bf16* o = nullptr;
    if (!p.split_kv) {
      const std::int64_t token = work.first_token + packed / p.num_heads;
      const std::int64_t head = packed % p.num_heads;
      o = static_cast<bf16*>(p.o) + token * p.o_token_stride + head * p.o_head_stride;
    }
SLIMSERVE_ATTENTION_UNROLL
    for (int j = 0; j < 2; ++j) {
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < 64; ++i) {
        if (((i / 2) % 2) != half) continue;
        // 2t + i % 2 < 8: only the chunk's position is reordered (a constant per i and t pair)
        const int column = mla_scale_group * (2 * wg + j) + 8 * (i / 4) + mla_latent_column<KvT>(2 * t + i % 2);
        if (p.split_kv) {
          po[column] = o_acc[64 * j + i] * norm;
        } else {
          o[column] = from_float<bf16>(o_acc[64 * j + i] * norm);
        }
      }
    }
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
