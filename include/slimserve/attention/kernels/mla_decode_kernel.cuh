#pragma once
/// \file
/// \brief Absorbed MLA decode on tensor cores over a paged latent cache (BF16, or FP8 e4m3
/// with per-token group or per-tensor scales), with speculative query tokens and split-KV.
///
/// Rows. All heads of a request share one latent, so the mma's M dimension is the request's
/// packed rows r = query_token * num_heads + head; a CTA owns `Tile::rows` = 16 * WarpsM of
/// them (16 or 32). Every latent byte a CTA stages is used by all of its rows.
///
/// Warps. 4 * WarpsM warps: warp (wm, wn) owns m tile wm (16 rows) and latent group wn
/// (values [128 wn, 128 wn + 128), the FP8 scale group) plus rope k step wn (values
/// [16 wn, 16 wn + 16) of the 64). Per tile of `tile_tokens` tokens:
///   P. producer: threads_per_token threads per token look its page up once and queue its
///      16-byte chunks with cp.async at constant offsets (zero-filled past the end and for bad
///      page ids, which are also masked); `stages` buffers in flight;
///   0. FP8 and NVFP4: each thread widens the chunks it queued to one fp16 tile (each value
///      converted once; FP8 group scales: times 2^k(token), see below; NVFP4: times the
///      block's E4M3 scale and 2^-14, exactly, in the parity order of mla_latent_column,
///      nvfp4_fragments.cuh); the rest is the 16-bit path with fp16 mma;
///   1. partial scores S_wn = Q[rows, group wn] . latent[tokens, group wn]^T * group scale
///      + Q[rows, rope wn] . rope[tokens, rope wn]^T (ldmatrix fragments), to shared memory;
///   2. 8 threads per row sum the 4 partials, mask, and run the exp2 online softmax (FP32);
///      they publish P as mma pairs (per scale group: P * scale_g(token) * 2^(8 - k(token)))
///      and the row's rescale factor;
///   3. warp (wm, wn) accumulates O[rows, group wn] = alpha O + P_wn latent[tokens, group wn]
///      (A operand by ldmatrix; the alpha multiply skipped when the warp's alphas are all 1) —
///      the latent is also V, so each warp reads the same 128 columns in both products.
///      128 columns x 16 rows = 64 FP32 accumulators per thread.
///
/// Per-token group scales multiply S (FP32) and P (before rounding, by scale * 2^8 to keep
/// P * scale in the fp16 normal range; undone at the end). Each token's power of two 2^k
/// moves out of its scales into the widened latent (code * 2^k), k = E - 6 for E the exponent
/// of the token's largest group scale, clamped to [-15, 7]: the P copy of that group then
/// carries P * [2^6, 2^7) * 2^8 (never past 2^15, never subnormal for P near 1), and
/// code * 2^k stays exact in fp16 (|code| <= 448 < 2^16 / 2^7; code steps of 2^-9 * 2^-15 =
/// 2^-24, fp16's subnormal step). Group scales up to 2^14 are in range (a P copy of
/// scale * 2^8 overflowed past 256). S uses scale * 2^-k too (same B tile). A per-tensor scale multiplies the
/// latent part of S and the output. Query rows: request b owns [qo_indptr[b], qo_indptr[b+1])
/// (decode: b * query_tokens ...; ragged prefill chunks), causal within them.
///
/// NVFP4 (per_tensor: the tensor scale). A stage holds each group's 64 code bytes per token
/// (4 chunks, the Group geometry) and the token's 32 block scales; a 16-byte code chunk is two
/// 16-value blocks, each of its words 8 values of one block. Widened values are e2m1 x
/// block scale x 2^-14 (exact in fp16, subnormals included, nvfp4_fragments.cuh), each 8
/// columns in the parity order of mla_latent_column, so the tensor scale x 2^14 is the
/// per-tensor factor of S and of the output; a tensor scale that is not finite and > 0 makes
/// that factor NaN, and the rows NaN, as in paged attention.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "slimserve/arch/cp_async.cuh"
#include "slimserve/arch/f16x2_math.cuh"
#include "slimserve/arch/satfinite_pack.cuh"
#include "slimserve/attention/kernels/mla_decode_work.cuh"
#include "slimserve/attention/kernels/mla_latent_rounding.hpp"
#include "slimserve/attention/kernels/mma_fragments.cuh"
#include "slimserve/attention/kernels/nvfp4_fragments.cuh"
#include "slimserve/attention/kernels/paged_attention_kernel.cuh"
#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/attention/mla_cache_view.hpp"
#include "slimserve/formats/nvfp4_widen.cuh"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/runtime/platform.hpp"
#include "slimserve/runtime/shared_memory.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// The latent column that position `position` of a widened latent row holds, in both decode
/// kernels: NVFP4's widening leaves each 8 columns in the parity order (nvfp4_parity_code: 15
/// instructions per 8 codes, where the natural order, nvfp4_widen8, takes 17); the other
/// types keep their own order. Q is loaded in the same order, so S is unchanged; O's
/// accumulator columns come out in it and are written to their own columns.
template <class KvT>
SLIMSERVE_HOST_DEVICE constexpr int mla_latent_column(int position) {
  if constexpr (std::is_same_v<KvT, nvfp4>) {
    return (position & ~7) | nvfp4_parity_code(position & 7);
  } else {
    return position;
  }
}

/// Tile geometry of one instantiation.
template <class KvT, int WarpsM>
struct MlaDecodeTile {
  /// A token's latent, and its rope, are stored in shared memory as 4 group sub-tiles, one per
  /// warp column: group wn is a [tile_tokens, 128] tile (and [tile_tokens, 16] of rope) with its
  /// own swizzle, so a warp addresses only its own columns and its fragments index from 0.
  using Latent = KvRowGeometry<KvT, mla_latent_dim>;      // a whole latent row (16-byte chunks)
  using Group = KvRowGeometry<KvT, mla_scale_group>;      // one group's 128 values
  using Rope = KvRowGeometry<bf16, mla_rope_dim>;         // a whole rope row
  using RopeGroup = KvRowGeometry<bf16, mla_rope_dim / 4>;  // one warp column's 16 rope values
  static constexpr bool fp8 = Latent::fp8;
  /// NVFP4: E4M3 scales per 16 values in the record (the stage copies them beside the codes).
  static constexpr bool block_scaled = std::is_same_v<KvT, nvfp4>;
  /// The mma reads a converted fp16 tile (FP8, NVFP4) rather than the stage.
  static constexpr bool widened = fp8 || block_scaled;
  static constexpr int block_scale_bytes = block_scaled ? mla_latent_dim / nvfp4_block_elements : 0;  // 32
  static constexpr int warps_m = WarpsM;
  static constexpr int warps = 4 * WarpsM;
  static constexpr int threads = 32 * warps;
  static constexpr int rows = 16 * WarpsM;
  static constexpr int tile_tokens = 32;
  static constexpr int stages = 3;
  /// CTAs one SM holds (the launch bound's minimum; mla_decode_resident_ctas says the same to
  /// the plan): the 16-row FP8 CTA (128 threads, ~77 KB) fits twice — its ~240 registers are
  /// under the 256 that two CTAs allow, so the bound costs nothing — and so does NVFP4's
  /// (88 KB against FP8's 110 KB: smaller stages, the same converted tile); others once.
  static constexpr int min_ctas_per_sm = (widened && WarpsM == 1) ? 2 : 1;
  static constexpr int groups = mla_scale_groups;                  // one per warp column
  static constexpr int group_chunks = Group::row_chunks;  // 16-byte chunks of a group
  static constexpr int latent_frags = 8;  // 16-wide k steps per group
  /// The mma reads the latent as 16-bit values: the cache's own for BF16; for FP8 and NVFP4, a
  /// group sub-tile converted once per tile (each value once) into this geometry.
  using MmaGroup = KvRowGeometry<mma_input_t<KvT>, mla_scale_group>;
  static constexpr int mma_group_chunks = MmaGroup::row_chunks;  // 16
  static constexpr int output_tiles = mla_scale_group / 8;  // n8 tiles of a group's O
  static constexpr int threads_per_row = threads / rows;   // 8
  static constexpr int tokens_per_thread = tile_tokens / threads_per_row;  // 4
  static constexpr int p_row_words = tile_tokens / 2 + 4;  // 16 words of pairs + 4 of padding
  static constexpr int threads_per_token = threads / tile_tokens;           // producer: 4 or 8
  static constexpr int chunk_lanes_per_thread = 8 / threads_per_token;     // of the 8 chunk lanes
  static_assert(groups == 4 && threads_per_row == 8 && tile_tokens == 32);
  static_assert(8 % threads_per_token == 0 && (block_scaled || Group::row_chunks % 8 == 0) && Rope::row_chunks == 8);
  static_assert(group_chunks == (fp8 ? 8 : block_scaled ? 4 : 16), "one group: 128 values");
  /// NVFP4: a token's 16 code chunks are 2 per chunk lane (c and c + 8), its 32 scale bytes
  /// 2 chunks (chunk lanes 0 and 1).
  static_assert(!block_scaled || (groups * group_chunks == 16 && block_scale_bytes == 32));
};

/// NVFP4 stages also hold each token's E4M3 block scales (block b: latent values [16 b, 16 b +
/// 16)); for the other formats the base is empty and the stage's layout is unchanged.
template <bool BlockScaled, int Tokens>
struct MlaStageBlockScales {
  alignas(16) std::uint8_t block_scales[Tokens][mla_latent_dim / nvfp4_block_elements];
};
template <int Tokens>
struct MlaStageBlockScales<false, Tokens> {};

template <class KvT, int WarpsM>
struct MlaDecodeSharedStorage {
  using Tile = MlaDecodeTile<KvT, WarpsM>;
  struct Stage : MlaStageBlockScales<Tile::block_scaled, Tile::tile_tokens> {
    alignas(128) unsigned char latent[Tile::groups][Tile::tile_tokens * Tile::Group::row_bytes];
    alignas(128) unsigned char rope[Tile::groups][Tile::tile_tokens * Tile::RopeGroup::row_bytes];
    alignas(16) float scales[Tile::tile_tokens][Tile::groups];  // per_token_group
    std::int32_t token_ok[Tile::tile_tokens];  // inside the range and on a valid page
  };
  Stage stages[Tile::stages];
  /// FP8 and NVFP4: the consumed tile's latent as fp16 group sub-tiles (MmaGroup geometry).
  alignas(128) unsigned char converted[Tile::widened ? Tile::groups : 1]
                                      [Tile::widened ? Tile::tile_tokens * Tile::MmaGroup::row_bytes : 16];
  /// FP8 per-token-group only: the consumed tile's group scales x 2^-k(token) (k: the power of
  /// two its converted latent carries), what S and P multiply by.
  alignas(16) float converted_scales[Tile::fp8 ? Tile::tile_tokens : 1][Tile::groups];
  alignas(16) float s_partial[Tile::groups][Tile::rows][Tile::tile_tokens];  // log2-unscaled partial scores
  /// P as packed mma-input pairs, the A operand of P.V read with ldmatrix: one copy per latent
  /// group, multiplied by that group's per-token scale (per-token-group FP8), else copy 0 only.
  /// Rows padded to 80 bytes so the 8 rows of an ldmatrix phase hit 8 bank groups.
  alignas(16) std::uint32_t p_pairs[Tile::groups][Tile::rows][Tile::p_row_words];
  float alpha[Tile::rows];                                        // rescale of O this tile
  float row_max[Tile::rows];  // final running max (log2 units)
  float row_sum[Tile::rows];  // final running sum
};

template <class KvT, class QT, int WarpsM>
__global__ void __launch_bounds__(MlaDecodeTile<KvT, WarpsM>::threads, MlaDecodeTile<KvT, WarpsM>::min_ctas_per_sm)
    mla_decode_kernel(const MlaDecodeParams p) {
  using Tile = MlaDecodeTile<KvT, WarpsM>;
  using Group = typename Tile::Group;
  using RopeGroup = typename Tile::RopeGroup;
  using MmaT = mma_input_t<KvT>;
  using Smem = MlaDecodeSharedStorage<KvT, WarpsM>;
  using MmaGroup = typename Tile::MmaGroup;
  constexpr bool fp8 = Tile::fp8;
  constexpr bool block_scaled = Tile::block_scaled;
  auto& smem = rt::shared_storage<Smem>();

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int wm = warp % WarpsM;  // m tile
  const int wn = warp / WarpsM;  // latent group / rope k step

  const MlaWork work = mla_work<Tile::rows, Tile::tile_tokens>(p);
  if (work.aborted) {
    mla_write_aborted_rows<QT>(p, work, tid, Tile::threads);
    return;
  }
  const std::int64_t first_token = work.first_token;
  const std::int64_t valid_rows = work.valid_rows;
  const std::int64_t tile_row0 = work.tile_row0;
  const std::int64_t num_tiles = work.num_tiles;
  auto partial_row = [&](int r) { return work.partial_row(r); };

  // Q fragments of m tile wm: latent group wn (8 k steps) and rope k step wn.
  std::uint32_t q_latent[Tile::latent_frags][4];
  std::uint32_t q_rope[1][4];
  {
    const QT* q = static_cast<const QT*>(p.q);
SLIMSERVE_ATTENTION_UNROLL
    for (int half = 0; half < 2; ++half) {
      const std::int64_t packed = tile_row0 + wm * 16 + g + half * 8;
      const bool valid = packed < valid_rows;
      const std::int64_t base = valid ? (first_token + packed / p.num_heads) * p.q_token_stride +
                                            (packed % p.num_heads) * p.q_head_stride
                                      : 0;
SLIMSERVE_ATTENTION_UNROLL
      for (int s = 0; s < Tile::latent_frags; ++s) {
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (valid) {
SLIMSERVE_ATTENTION_UNROLL
          for (int e = 0; e < 4; ++e) {
            // mla_latent_column: the widened NVFP4 rows' parity order (the other types: itself)
            v[e] = activation_to_float<QT>(q, base + mla_latent_column<KvT>(16 * (8 * wn + s) + q_fragment_column<false>(t, e)));
          }
        }
        if constexpr (!std::is_same_v<QT, MmaT>) {
          // into fp16 operands: saturated to the fp16 range, NaN kept (cvt.rn.satfinite)
          q_latent[s][half] = arch::pack_satfinite<MmaT>(v[0], v[1]);
          q_latent[s][2 + half] = arch::pack_satfinite<MmaT>(v[2], v[3]);
        } else {
          q_latent[s][half] = pack_pair<MmaT>(v[0], v[1]);
          q_latent[s][2 + half] = pack_pair<MmaT>(v[2], v[3]);
        }
      }
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (valid) {
SLIMSERVE_ATTENTION_UNROLL
        for (int e = 0; e < 4; ++e) {
          v[e] = activation_to_float<QT>(q, base + mla_latent_dim + 16 * wn + q_fragment_column<false>(t, e));
        }
      }
      q_rope[0][half] = pack_pair<bf16>(v[0], v[1]);
      q_rope[0][2 + half] = pack_pair<bf16>(v[2], v[3]);
    }
  }

  const bool group_scales = p.scale_mode == MlaScaleMode::per_token_group;
  // The per-tensor factor of the latent part of S and of the output. NVFP4: the tensor scale
  // x 2^14 (the widened values carry 2^-14, nvfp4_fragments.cuh); NaN when the tensor scale
  // (or that product) is not finite and > 0.
  float static_scale = p.scale_mode == MlaScaleMode::per_tensor ? *p.latent_scale : 1.0f;
  if constexpr (block_scaled) static_scale = nvfp4_checked_tensor_scale(static_scale, nvfp4_fragment_unit);

  float o_acc[Tile::output_tiles][4];
SLIMSERVE_ATTENTION_UNROLL
  for (int n = 0; n < Tile::output_tiles; ++n) o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.0f;

  // Softmax role: 8 threads per row, 4 tokens each; running state kept by all 8.
  const int soft_row = tid / Tile::threads_per_row;
  const int soft_seg = tid % Tile::threads_per_row;
  const std::int64_t soft_packed = tile_row0 + soft_row;
  const bool soft_valid = soft_packed < valid_rows;
  const std::int64_t soft_query = work.query_position(p, soft_packed);
  float run_max = -INFINITY;
  float run_sum = 0.0f;

  // Producer: threads_per_token threads share a token's record. The page lookup and the
  // record address are computed once per thread and tile; thread `sub` copies the chunks whose
  // logical index within a group is congruent to `sub` (mod threads_per_token), so the swizzled
  // shared-memory offsets differ from one per-thread base by constants only.
  const int producer_token = tid / Tile::threads_per_token;
  const int producer_sub = tid % Tile::threads_per_token;
  auto produce = [&](std::int64_t i) {
    auto& stage = smem.stages[i % Tile::stages];
    bool ok = false;
    const unsigned char* record = mla_token_record(p, work, work.kv_begin + i * Tile::tile_tokens + producer_token, ok);
SLIMSERVE_ATTENTION_UNROLL
    for (int k = 0; k < Tile::chunk_lanes_per_thread; ++k) {
      const int lane_chunk = producer_sub + Tile::threads_per_token * k;  // 0..7
      if constexpr (block_scaled) {
        // Code chunks lane_chunk and lane_chunk + 8 (of 16: 4 a group), and scale chunk
        // lane_chunk (of 2).
SLIMSERVE_ATTENTION_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int c = lane_chunk + 8 * h;
          arch::cp_async_16_zfill(stage.latent[c / Group::row_chunks] + Group::byte_offset(producer_token, c % Group::row_chunks),
                                  record + 16 * c, ok);
        }
        if (lane_chunk < Tile::block_scale_bytes / 16) {
          arch::cp_async_16_zfill(&stage.block_scales[producer_token][16 * lane_chunk],
                                  record + mla_latent_dim / 2 + 16 * lane_chunk, ok);
        }
      } else {
        unsigned char* latent_dst = &stage.latent[0][0] + Group::byte_offset(producer_token, lane_chunk);
        const unsigned char* latent_src = record + 16 * lane_chunk;
SLIMSERVE_ATTENTION_UNROLL
        for (int group = 0; group < Tile::groups; ++group) {
SLIMSERVE_ATTENTION_UNROLL
          for (int h = 0; h < Group::row_chunks / 8; ++h) {
            arch::cp_async_16_zfill(latent_dst + group * sizeof(stage.latent[0]) + 128 * h,
                                    latent_src + group * Group::row_bytes + 128 * h, ok);
          }
        }
      }
      // Rope chunk `lane_chunk` (of 8) is chunk lane_chunk % 2 of warp column lane_chunk / 2.
      arch::cp_async_16_zfill(stage.rope[lane_chunk / RopeGroup::row_chunks] +
                                  RopeGroup::byte_offset(producer_token, lane_chunk % RopeGroup::row_chunks),
                              record + p.rope_offset + 16 * lane_chunk, ok);
    }
    if (producer_sub == 0) {
      if (group_scales) arch::cp_async_16_zfill(&stage.scales[producer_token][0], record + p.scales_offset, ok);
      stage.token_ok[producer_token] = ok;
    }
  };

  // Token `token`'s group scales as S and P use them: FP8, the converted tile's (x 2^-k).
  auto group_scale_of = [&](const auto& stage, int token) -> const float* {
    if constexpr (fp8) {
      return smem.converted_scales[token];
    } else {
      return stage.scales[token];
    }
  };

  auto consume = [&](std::int64_t i) {
    const auto& stage = smem.stages[i % Tile::stages];
    const std::int64_t tile_begin = work.kv_begin + i * Tile::tile_tokens;
    const unsigned char* mma_latent = stage.latent[wn];
    if constexpr (block_scaled) {
      // 0. Each NVFP4 value widened once, by the thread that queued its chunk: 32 codes (two
      // blocks) -> four fp16 chunks of e2m1 x block scale x 2^-14 (parity order). The
      // zero-filled chunks of tokens past the end widen to zeros with NaN-free zero scales;
      // they are masked anyway.
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < Tile::chunk_lanes_per_thread; ++k) {
        const int lane_chunk = producer_sub + Tile::threads_per_token * k;
SLIMSERVE_ATTENTION_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int c = lane_chunk + 8 * h;  // code chunk of the row: values [32 c, 32 c + 32)
          const int group = c / Group::row_chunks;
          const int group_chunk = c % Group::row_chunks;
          const Vec16 codes = load16(stage.latent[group] + Group::byte_offset(producer_token, group_chunk));
          std::uint16_t scale_pair = 0;  // blocks 2c (low byte) and 2c + 1
          std::memcpy(&scale_pair, &stage.block_scales[producer_token][2 * c], sizeof(scale_pair));
          unsigned char* dst = smem.converted[group];
          // word w: values 32 c + 8 w .., in mla_latent_column's order
          nvfp4_widen32_parity(codes, scale_pair, [&](int w, const Vec16& wide) {
            store16(dst + MmaGroup::byte_offset(producer_token, 4 * group_chunk + w), wide);
          });
        }
      }
      __syncthreads();
      mma_latent = smem.converted[wn];
    } else if constexpr (fp8) {
      static_assert(Group::row_chunks == 8, "an FP8 group is one 16-byte chunk per chunk lane");
      // 0. Each FP8 value converted once: thread (producer_token, producer_sub) widens the same
      // 16-byte chunks it queued (16 values -> two fp16 chunks). The previous tile's readers
      // of `converted` (and `converted_scales`) passed the barrier at the top of this iteration.
      // Group scales: the token's 2^k (k = E - 6 clamped to [-15, 7], E the exponent of its
      // largest group scale, from the float's exponent field) multiplies the codes (exact, see
      // the top) and divides the scales S and P use, so P x scale x 2^(8 - k) stays below 2^15
      // and, for the largest group, at least P x 2^14 (the mma sums the same products).
      std::uint32_t widen_factor = 0x3C003C00u;  // fp16 (1, 1)
      if (group_scales) {
        float token_scales[Tile::groups];
        const Vec16 v = load16(&stage.scales[producer_token][0]);
        std::memcpy(token_scales, &v, sizeof(v));
        const float largest = fmaxf(fmaxf(token_scales[0], token_scales[1]), fmaxf(token_scales[2], token_scales[3]));
        const ClampedPowerOfTwo<-9, 13, -6> k(largest);  // 2^k, k = E - 6 in [-15, 7]
        const float power = k.power;
        const float inverse_power = k.inverse;
        widen_factor = pack_pair<fp16>(power, power);
        if (producer_sub == 0) {
          float scaled[Tile::groups];
SLIMSERVE_ATTENTION_UNROLL
          for (int group = 0; group < Tile::groups; ++group) scaled[group] = token_scales[group] * inverse_power;
          Vec16 out;
          std::memcpy(&out, scaled, sizeof(out));
          store16(&smem.converted_scales[producer_token][0], out);
        }
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < Tile::chunk_lanes_per_thread; ++k) {
        const int lane_chunk = producer_sub + Tile::threads_per_token * k;
SLIMSERVE_ATTENTION_UNROLL
        for (int group = 0; group < Tile::groups; ++group) {
          const Vec16 codes = load16(stage.latent[group] + Group::byte_offset(producer_token, lane_chunk));
          Vec16 wide[2];
SLIMSERVE_ATTENTION_UNROLL
          for (int w = 0; w < 4; ++w) {
            std::uint32_t lo, hi;
            fp8_quad_to_f16x2<KvT>(codes.word[w], lo, hi);
            wide[w / 2].word[2 * (w % 2)] = arch::mul_rn_f16x2(lo, widen_factor);
            wide[w / 2].word[2 * (w % 2) + 1] = arch::mul_rn_f16x2(hi, widen_factor);
          }
          unsigned char* dst = smem.converted[group];
          store16(dst + MmaGroup::byte_offset(producer_token, 2 * lane_chunk), wide[0]);
          store16(dst + MmaGroup::byte_offset(producer_token, 2 * lane_chunk + 1), wide[1]);
        }
      }
      __syncthreads();
      mma_latent = smem.converted[wn];
    }
    // 1. Partial scores of group wn for m tile wm: 16 tokens at a time (fewer live registers).
SLIMSERVE_ATTENTION_UNROLL
    for (int m = 0; m < 2; ++m) {
      float s[2][4];
      float r[2][4];
SLIMSERVE_ATTENTION_UNROLL
      for (int n = 0; n < 2; ++n) {
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        r[n][0] = r[n][1] = r[n][2] = r[n][3] = 0.0f;
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int c = 0; c < Tile::mma_group_chunks; c += 2) {
        qk_chunk_pair<MmaT, mla_scale_group>(s[0], s[1], mma_latent, 16 * m, c, q_latent, lane);
      }
      qk_chunk_pair<bf16, mla_rope_dim / 4>(r[0], r[1], stage.rope[wn], 16 * m, 0, q_rope, lane);
SLIMSERVE_ATTENTION_UNROLL
      for (int n = 0; n < 2; ++n) {
        const int token = 16 * m + 8 * n + 2 * t;  // and token + 1
        float scale0 = static_scale;
        float scale1 = static_scale;
        if (group_scales) {
          scale0 = group_scale_of(stage, token)[wn];
          scale1 = group_scale_of(stage, token + 1)[wn];
        }
        const int row = wm * 16 + g;
        const float lo[2] = {fmaf(s[n][0], scale0, r[n][0]), fmaf(s[n][1], scale1, r[n][1])};
        const float hi[2] = {fmaf(s[n][2], scale0, r[n][2]), fmaf(s[n][3], scale1, r[n][3])};
        store_packed(&smem.s_partial[wn][row][token], lo);
        store_packed(&smem.s_partial[wn][row + 8][token], hi);
      }
    }
    __syncthreads();
    // 2. Online softmax: row soft_row, tokens [4 soft_seg, 4 soft_seg + 4). P goes to shared
    // memory as mma pairs, scaled per latent group when the cache has group scales.
    {
      constexpr int tokens = Tile::tokens_per_thread;
      static_assert(tokens == 4, "one 16-byte partial-score load per group");
      const int token0 = soft_seg * tokens;
      float x[tokens];
      {
        float partial[Tile::groups][tokens];
SLIMSERVE_ATTENTION_UNROLL
        for (int group = 0; group < Tile::groups; ++group) {
          const Vec16 v = load16(&smem.s_partial[group][soft_row][token0]);
          std::memcpy(partial[group], &v, sizeof(v));
        }
SLIMSERVE_ATTENTION_UNROLL
        for (int j = 0; j < tokens; ++j) {
          x[j] = ((partial[0][j] + partial[1][j]) + (partial[2][j] + partial[3][j])) * p.score_scale;
        }
      }
      float tile_max = -INFINITY;
SLIMSERVE_ATTENTION_UNROLL
      for (int j = 0; j < tokens; ++j) {
        const std::int64_t position = tile_begin + token0 + j;
        const bool visible = soft_valid && stage.token_ok[token0 + j] != 0 && position <= soft_query;
        x[j] = visible ? x[j] : -INFINITY;
        tile_max = fmaxf(tile_max, x[j]);
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int offset = 1; offset < Tile::threads_per_row; offset *= 2) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
      }
      const float new_max = fmaxf(run_max, tile_max);
      const float base = new_max == -INFINITY ? 0.0f : new_max;  // all masked so far: p = 0
      const float alpha = exp2f(run_max - base);                 // 0 before the first token
      float w[tokens];
      float sum = 0.0f;
SLIMSERVE_ATTENTION_UNROLL
      for (int j = 0; j < tokens; ++j) {
        w[j] = exp2f(x[j] - base);
        sum += w[j];
      }
      if (group_scales) {
        float scales[tokens][Tile::groups];
SLIMSERVE_ATTENTION_UNROLL
        for (int j = 0; j < tokens; ++j) {
          const Vec16 v = load16(group_scale_of(stage, token0 + j));
          std::memcpy(scales[j], &v, sizeof(v));
        }
SLIMSERVE_ATTENTION_UNROLL
        for (int group = 0; group < Tile::groups; ++group) {
          const float h = per_token_p_headroom;
          const std::uint32_t pairs[2] = {
              pack_pair<MmaT>(w[0] * (scales[0][group] * h), w[1] * (scales[1][group] * h)),
              pack_pair<MmaT>(w[2] * (scales[2][group] * h), w[3] * (scales[3][group] * h))};
          store_packed(&smem.p_pairs[group][soft_row][token0 / 2], pairs);
        }
      } else {
        const std::uint32_t pairs[2] = {pack_pair<MmaT>(w[0], w[1]), pack_pair<MmaT>(w[2], w[3])};
        store_packed(&smem.p_pairs[0][soft_row][token0 / 2], pairs);
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int offset = 1; offset < Tile::threads_per_row; offset *= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      }
      run_sum = run_sum * alpha + sum;
      run_max = new_max;
      if (soft_seg == 0) smem.alpha[soft_row] = alpha;
    }
    __syncthreads();
    // 3. O[rows of wm, group wn] = alpha O + (P * scale_wn) latent; P fragments by ldmatrix.
    {
      const float alpha_lo = smem.alpha[wm * 16 + g];
      const float alpha_hi = smem.alpha[wm * 16 + g + 8];
      // Once the running maxima settle (most tiles of a long context) every alpha is 1: the
      // warp skips the 64 multiplies. The vote keeps the branch warp-uniform.
      if (__any_sync(0xffffffffu, alpha_lo != 1.0f || alpha_hi != 1.0f)) {
SLIMSERVE_ATTENTION_UNROLL
        for (int n = 0; n < Tile::output_tiles; ++n) {
          o_acc[n][0] *= alpha_lo;
          o_acc[n][1] *= alpha_lo;
          o_acc[n][2] *= alpha_hi;
          o_acc[n][3] *= alpha_hi;
        }
      }
      // ldmatrix.x4 of the 16 x 16 A tile: matrices (rows 0-7 | 8-15) x (tokens 0-7 | 8-15).
      const std::uint32_t* p_row =
          &smem.p_pairs[group_scales ? wn : 0][wm * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)][4 * (lane >> 4)];
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < 2; ++k) {
        std::uint32_t a[4];
        arch::ldmatrix_x4(a, p_row + 8 * k);
SLIMSERVE_ATTENTION_UNROLL
        for (int c = 0; c < Tile::mma_group_chunks; c += 2) {
          pv_chunk_pair<MmaT, mla_scale_group>(o_acc, mma_latent, 16 * k, c, a, lane);
        }
      }
    }
  };

  // Pipeline: stages - 1 tiles in flight ahead of the one being consumed.
SLIMSERVE_ATTENTION_UNROLL
  for (int i = 0; i < Tile::stages - 1; ++i) {
    if (i < num_tiles) produce(i);
    arch::cp_async_commit();
  }
  for (std::int64_t i = 0; i < num_tiles; ++i) {
    arch::cp_async_wait<Tile::stages - 2>();
    __syncthreads();  // tile i visible to all; tile i - 1 (and its P) consumed by all
    if (i + Tile::stages - 1 < num_tiles) produce(i + Tile::stages - 1);
    arch::cp_async_commit();
    consume(i);
  }
  arch::cp_async_wait<0>();

  // Epilogue: row statistics from the softmax threads, outputs from the accumulators.
  if (soft_seg == 0) {
    smem.row_max[soft_row] = run_max;
    smem.row_sum[soft_row] = run_sum;
  }
  __syncthreads();
  const float out_scale = group_scales ? 1.0f / per_token_p_headroom : static_scale;
  // NVFP4 with a tensor scale that is not finite and > 0: NaN rows and lse (its NaN scores
  // would otherwise read as a row that sees no token: 0 with lse -inf).
  const bool invalid_scale = block_scaled && static_scale != static_scale;  // NaN (host and device alike)
SLIMSERVE_ATTENTION_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int r = wm * 16 + g + 8 * half;
    const std::int64_t packed = tile_row0 + r;
    const float sum = smem.row_sum[r];
    const bool empty = sum == 0.0f;  // a NaN sum (a NaN key read) is not empty: NaN row and lse
    const float norm = invalid_scale ? NAN : (empty ? 0.0f : out_scale / sum);
    if (p.split_kv) {
      float* po = p.partial_o + partial_row(r) * mla_latent_dim;
SLIMSERVE_ATTENTION_UNROLL
      for (int n = 0; n < Tile::output_tiles; ++n) {
SLIMSERVE_ATTENTION_UNROLL
        for (int i = 0; i < 2; ++i) {
          po[mla_latent_column<KvT>(mla_scale_group * wn + output_column<false>(n, t, i))] = o_acc[n][2 * half + i] * norm;
        }
      }
      continue;
    }
    if (packed >= valid_rows) continue;
    const std::int64_t token = first_token + packed / p.num_heads;
    const std::int64_t head = packed % p.num_heads;
    QT* o = static_cast<QT*>(p.o) + token * p.o_token_stride + head * p.o_head_stride;
SLIMSERVE_ATTENTION_UNROLL
    for (int n = 0; n < Tile::output_tiles; ++n) {
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < 2; ++i) {
        o[mla_latent_column<KvT>(mla_scale_group * wn + output_column<false>(n, t, i))] = from_float<QT>(o_acc[n][2 * half + i] * norm);
      }
    }
  }
  // LSE (natural log): one thread per row.
  if (soft_seg == 0) mla_write_row_lse(p, work, soft_row, invalid_scale ? NAN : run_max, invalid_scale ? NAN : run_sum);
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
