#pragma once
/// \file
/// \brief Absorbed MLA decode on sm_90a warpgroup MMA (wgmma): 64 packed rows per CTA (one
/// wgmma M), two warpgroups, the latent tile staged once per tile in the 128B-swizzled
/// canonical layout and read by both products. Same parameters, schedule and results as
/// mla_decode_kernel (the mma.sync kernel); the plan picks it only when asked and when a
/// request has at least 64 rows (MlaDecodeProblem::warpgroup_mma).
///
/// Per tile of 32 tokens (`Tile`):
///   P. producer: 8 threads per token; BF16: cp.async of the record straight into the
///      swizzled latent tile of the stage (latent and rope: columns 0..575); FP8: the raw
///      record (codes, scales, rope) into the stage;
///   0. FP8: every thread widens 4 chunks of 16 codes (exactly, to fp16) into the one
///      converted tile, and converts one chunk of the BF16 rope to fp16;
///   1. S: warpgroup w, tokens [16 w, 16 w + 16): per latent group g an m64n16k16 chain over
///      its 8 k steps (Q K-major, latent K-major), and one for the rope; S = sum_g scale_g S_g
///      + S_rope, to shared memory;
///   2. softmax: 4 threads per row, 8 tokens each (as the mma.sync kernel, FP32, exp2); P as
///      16-bit values into K-major P tiles (per group, times the group scale, when the cache
///      has group scales);
///   3. O: warpgroup w owns latent columns [256 w, 256 w + 256) = groups 2w, 2w+1: rescale by
///      alpha, then per group an m64n128k16 chain over the tile's 2 token k steps (P K-major,
///      latent MN-major: the same bytes as in step 1).
/// Numerics as the mma.sync kernel: 16-bit inputs of mma_input_t<KvT> (fp16 for FP8, with Q
/// clamped to its range), FP32 accumulation, per-token group scales on S and on P (2^8
/// headroom).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "slimserve/arch/cp_async.cuh"
#include "slimserve/arch/wgmma.cuh"
#include "slimserve/arch/wgmma_tile.cuh"
#include "slimserve/attention/kernels/mla_decode_kernel.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

template <class KvT>
struct MlaWgmmaTile {
  static constexpr bool fp8 = fp8_format<KvT>;
  static constexpr int rows = 64;
  static constexpr int warpgroups = 2;
  static constexpr int threads = 128 * warpgroups;
  static constexpr int tile_tokens = 32;
  static constexpr int stages = fp8 ? 3 : 3;
  static constexpr int dims = mla_latent_dim + mla_rope_dim;  // 576
  static constexpr int groups = mla_scale_groups;              // 4
  static constexpr int group_k_steps = mla_scale_group / 16;   // 8
  static constexpr int rope_k_steps = mla_rope_dim / 16;       // 4
  static constexpr int threads_per_row = threads / rows;       // 4
  static constexpr int tokens_per_thread = tile_tokens / threads_per_row;  // 8
  static constexpr int threads_per_token = threads / tile_tokens;          // 8
  using QTile = arch::WgmmaTile128B<rows, dims>;
  using LatentTile = arch::WgmmaTile128B<tile_tokens, dims>;
  using PTile = arch::WgmmaTile128B<rows, 64>;  // tokens 0..31 used
  // FP8 raw record parts per stage.
  static constexpr int code_bytes = mla_latent_dim;          // 512
  static constexpr int rope_bytes = mla_rope_dim * 2;        // 128
  static_assert(groups == 4 && tokens_per_thread == 8 && threads_per_token == 8);

  // Shared memory, carved by byte offsets (the tiles need 1024-byte alignment, more than a
  // struct can ask of the dynamic shared memory base).
  static constexpr std::uint32_t q_offset = 0;
  static constexpr std::uint32_t latent_offset = q_offset + QTile::bytes;
  static constexpr int latent_tiles = fp8 ? 1 : stages;
  static constexpr std::uint32_t p_offset = latent_offset + latent_tiles * LatentTile::bytes;
  static constexpr int p_tiles = groups;
  static constexpr std::uint32_t raw_offset = p_offset + p_tiles * PTile::bytes;
  static constexpr std::uint32_t raw_stage_bytes = fp8 ? tile_tokens * (code_bytes + rope_bytes) : 0;
  static constexpr std::uint32_t scores_offset = raw_offset + stages * raw_stage_bytes;
  static constexpr std::uint32_t scales_offset = scores_offset + rows * tile_tokens * 4;
  static constexpr std::uint32_t token_ok_offset = scales_offset + stages * tile_tokens * groups * 4;
  static constexpr std::uint32_t stats_offset = token_ok_offset + stages * tile_tokens * 4;
  static constexpr std::uint32_t shared_bytes = stats_offset + 3 * rows * 4;  // alpha, max, sum
  static_assert(shared_bytes <= 227 * 1024, "over the per-CTA shared memory limit");
  static_assert(latent_offset % 1024 == 0 && p_offset % 1024 == 0 && raw_offset % 16 == 0);
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

template <class KvT>
__global__ void __launch_bounds__(MlaWgmmaTile<KvT>::threads)
    mla_wgmma_decode_kernel(const MlaDecodeParams p) {
  using Tile = MlaWgmmaTile<KvT>;
  using MmaT = mma_input_t<KvT>;
  using QTile = typename Tile::QTile;
  using LatentTile = typename Tile::LatentTile;
  using PTile = typename Tile::PTile;
  constexpr bool fp8 = Tile::fp8;
  unsigned char* smem = rt::dynamic_shared_memory();
  float* scores = reinterpret_cast<float*>(smem + Tile::scores_offset);       // [rows][tile_tokens]
  float* stage_scales = reinterpret_cast<float*>(smem + Tile::scales_offset);  // [stages][tokens][groups]
  std::int32_t* stage_ok = reinterpret_cast<std::int32_t*>(smem + Tile::token_ok_offset);  // [stages][tokens]
  float* row_alpha = reinterpret_cast<float*>(smem + Tile::stats_offset);
  float* row_max = row_alpha + Tile::rows;
  float* row_sum = row_max + Tile::rows;
  const std::uint32_t smem_base = arch::wgmma_shared_address(smem);

  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid / 128;
  const int w = (tid / 32) % 4;  // warp within the warpgroup: rows 16 w ..
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  const std::int32_t work = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t b = p.work_request[work];
  const std::int32_t row_tile = p.work_row_tile[work];
  const std::int32_t split = p.work_split[work];
  const std::int32_t num_splits = p.work_num_splits[work];

  const std::int64_t kv_len = mla_request_length(p, b);
  const bool aborted = kv_len < 0 || !(p.status == nullptr || kv::request_ok(p.status[b]));
  const std::int64_t first_token = p.qo_indptr[b];
  const std::int32_t query_count = p.qo_indptr[b + 1] - p.qo_indptr[b];
  const std::int64_t valid_rows = static_cast<std::int64_t>(query_count) * p.num_heads;
  const std::int64_t tile_row0 = static_cast<std::int64_t>(row_tile) * Tile::rows;
  auto partial_row = [&](int r) { return static_cast<std::int64_t>(work) * Tile::rows + r; };

  if (aborted) {
    for (int r = tid; r < Tile::rows; r += Tile::threads) {
      const std::int64_t packed = tile_row0 + r;
      if (p.split_kv) {
        p.partial_lse[partial_row(r)] = NAN;
        continue;
      }
      if (packed >= valid_rows) continue;
      const std::int64_t token = first_token + packed / p.num_heads;
      const std::int64_t head = packed % p.num_heads;
      bf16* o = static_cast<bf16*>(p.o) + token * p.o_token_stride + head * p.o_head_stride;
      for (int d = 0; d < mla_latent_dim; ++d) o[d] = from_float<bf16>(NAN);
      if (p.lse != nullptr) p.lse[token * p.num_heads + head] = -INFINITY;
    }
    return;
  }

  const std::int64_t last_row = (tile_row0 + Tile::rows < valid_rows ? tile_row0 + Tile::rows : valid_rows) - 1;
  const std::int64_t max_query = kv_len - query_count + last_row / p.num_heads;
  const std::int64_t kv_begin = static_cast<std::int64_t>(split) * p.chunk_tokens;
  std::int64_t kv_end = split == num_splits - 1 ? kv_len : kv_begin + p.chunk_tokens;
  if (kv_end > kv_len) kv_end = kv_len;
  if (kv_end > max_query + 1) kv_end = max_query + 1;
  if (kv_end < kv_begin) kv_end = kv_begin;
  const std::int64_t num_tiles = (kv_end - kv_begin + Tile::tile_tokens - 1) / Tile::tile_tokens;

  // Q tile [64 rows][576] in the mma input type (FP8 caches: fp16, clamped to its range).
  {
    const bf16* q = static_cast<const bf16*>(p.q);
    constexpr int chunks = Tile::dims / 8;
    for (int i = tid; i < Tile::rows * chunks; i += Tile::threads) {
      const int r = i / chunks;
      const int chunk = i % chunks;
      const std::int64_t packed = tile_row0 + r;
      std::uint32_t words[4] = {0u, 0u, 0u, 0u};
      if (packed < valid_rows) {
        const std::int64_t base = (first_token + packed / p.num_heads) * p.q_token_stride +
                                  (packed % p.num_heads) * p.q_head_stride + 8 * chunk;
        const Vec16 raw = load16(q + base);  // 8 bf16 (q rows and strides are 16-byte aligned)
        float v[8];
SLIMSERVE_ATTENTION_UNROLL
        for (int e = 0; e < 8; ++e) {
          float x = to_float(bf16::from_bits(static_cast<std::uint16_t>(raw.word[e / 2] >> (16 * (e % 2)))));
          if constexpr (!std::is_same_v<MmaT, bf16>) {
            x = fminf(fmaxf(x, -format_traits<MmaT>::max_finite), format_traits<MmaT>::max_finite);
          }
          v[e] = x;
        }
SLIMSERVE_ATTENTION_UNROLL
        for (int e = 0; e < 4; ++e) words[e] = pack_pair<MmaT>(v[2 * e], v[2 * e + 1]);
      }
      Vec16 chunk_value;
      std::memcpy(chunk_value.word, words, sizeof words);
      store16(smem + Tile::q_offset + QTile::chunk_offset(r, chunk), chunk_value);
    }
  }

  // Group scales exist only for FP8 latents: a compile-time false for BF16.
  const bool group_scales = fp8 && p.scale_mode == MlaScaleMode::per_token_group;
  const float static_scale = p.scale_mode == MlaScaleMode::per_tensor ? *p.latent_scale : 1.0f;

  float o_acc[2][64];  // groups 2 wg, 2 wg + 1: D of m64n128
SLIMSERVE_ATTENTION_UNROLL
  for (int j = 0; j < 2; ++j) {
SLIMSERVE_ATTENTION_UNROLL
    for (int i = 0; i < 64; ++i) o_acc[j][i] = 0.0f;
  }

  // Softmax role: 4 threads per row, 8 tokens each.
  const int soft_row = tid / Tile::threads_per_row;
  const int soft_seg = tid % Tile::threads_per_row;
  const std::int64_t soft_packed = tile_row0 + soft_row;
  const bool soft_valid = soft_packed < valid_rows;
  const std::int64_t soft_query = kv_len - query_count + soft_packed / p.num_heads;
  float run_max = -INFINITY;
  float run_sum = 0.0f;

  const int producer_token = tid / Tile::threads_per_token;
  const int producer_sub = tid % Tile::threads_per_token;
  auto produce = [&](std::int64_t i) {
    const int stage = static_cast<int>(i % Tile::stages);
    const std::int64_t position = kv_begin + i * Tile::tile_tokens + producer_token;
    const std::int32_t page = position < kv_end ? mla_page(p, b, position >> p.page_shift) : -1;
    const bool ok = page >= 0;
    const unsigned char* record =
        p.pages + (ok ? (static_cast<std::int64_t>(page) * p.page_size + (position & (p.page_size - 1))) * p.token_bytes
                      : 0);
    if constexpr (fp8) {
      unsigned char* raw = smem + Tile::raw_offset + stage * Tile::raw_stage_bytes +
                           producer_token * (Tile::code_bytes + Tile::rope_bytes);
      constexpr int chunks = (Tile::code_bytes + Tile::rope_bytes) / 16;  // 40: 5 per thread
      static_assert(chunks % Tile::threads_per_token == 0);
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < chunks / Tile::threads_per_token; ++k) {
        const int c = producer_sub + Tile::threads_per_token * k;
        const unsigned char* source =
            c < Tile::code_bytes / 16 ? record + 16 * c : record + p.rope_offset + 16 * (c - Tile::code_bytes / 16);
        arch::cp_async_16_zfill(raw + 16 * c, source, ok);
      }
    } else {
      unsigned char* tile = smem + Tile::latent_offset + stage * LatentTile::bytes;
      constexpr int chunks = Tile::dims / 8;  // 72: 9 per thread
      static_assert(chunks % Tile::threads_per_token == 0);
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < chunks / Tile::threads_per_token; ++k) {
        const int c = producer_sub + Tile::threads_per_token * k;
        const unsigned char* source =
            c < mla_latent_dim / 8 ? record + 16 * c : record + p.rope_offset + 16 * (c - mla_latent_dim / 8);
        arch::cp_async_16_zfill(tile + LatentTile::chunk_offset(producer_token, c), source, ok);
      }
    }
    if (producer_sub == 0) {
      if (group_scales) {
        arch::cp_async_16_zfill(stage_scales + (stage * Tile::tile_tokens + producer_token) * Tile::groups,
                                record + p.scales_offset, ok);
      }
      stage_ok[stage * Tile::tile_tokens + producer_token] = ok;
    }
  };

  auto consume = [&](std::int64_t tile_index) {
    const int stage = static_cast<int>(tile_index % Tile::stages);
    const std::int64_t tile_begin = kv_begin + tile_index * Tile::tile_tokens;
    const float* scales = stage_scales + stage * Tile::tile_tokens * Tile::groups;
    const std::int32_t* token_ok = stage_ok + stage * Tile::tile_tokens;
    std::uint32_t latent_tile = Tile::latent_offset + (fp8 ? 0u : static_cast<std::uint32_t>(stage) * LatentTile::bytes);
    if constexpr (fp8) {
      // 0. Widen the stage's codes (each once) into the converted tile; copy the rope.
      const unsigned char* raw = smem + Tile::raw_offset + stage * Tile::raw_stage_bytes;
      unsigned char* tile = smem + Tile::latent_offset;
      constexpr int code_chunks = Tile::code_bytes / 16;  // 32 chunks of 16 codes per token
      static_assert(Tile::tile_tokens * code_chunks % Tile::threads == 0);
SLIMSERVE_ATTENTION_UNROLL
      for (int unit = 0; unit < Tile::tile_tokens * code_chunks / Tile::threads; ++unit) {
        const int u = tid + Tile::threads * unit;
        const int token = u / code_chunks;
        const int c = u % code_chunks;
        const Vec16 codes = load16(raw + token * (Tile::code_bytes + Tile::rope_bytes) + 16 * c);
        Vec16 wide[2];
SLIMSERVE_ATTENTION_UNROLL
        for (int k = 0; k < 4; ++k) {
          wide[k / 2].word[2 * (k % 2)] = fp8_pair_to_f16x2<KvT>(codes.word[k]);
          wide[k / 2].word[2 * (k % 2) + 1] = fp8_pair_to_f16x2<KvT>(codes.word[k] >> 16);
        }
        store16(tile + LatentTile::chunk_offset(token, 2 * c), wide[0]);
        store16(tile + LatentTile::chunk_offset(token, 2 * c + 1), wide[1]);
      }
      constexpr int rope_chunks = Tile::rope_bytes / 16;
      static_assert(Tile::tile_tokens * rope_chunks % Tile::threads == 0);
SLIMSERVE_ATTENTION_UNROLL
      for (int unit = 0; unit < Tile::tile_tokens * rope_chunks / Tile::threads; ++unit) {
        const int u = tid + Tile::threads * unit;
        const int token = u / rope_chunks;
        const int c = u % rope_chunks;
        // The rope is BF16 in the cache; the tile is fp16 (exact within fp16's normal range).
        const Vec16 rope = load16(raw + token * (Tile::code_bytes + Tile::rope_bytes) + Tile::code_bytes + 16 * c);
        Vec16 narrow;
SLIMSERVE_ATTENTION_UNROLL
        for (int k = 0; k < 4; ++k) {
          narrow.word[k] = pack_pair<MmaT>(to_float(bf16::from_bits(static_cast<std::uint16_t>(rope.word[k]))),
                                           to_float(bf16::from_bits(static_cast<std::uint16_t>(rope.word[k] >> 16))));
        }
        store16(tile + LatentTile::chunk_offset(token, mla_latent_dim / 8 + c), narrow);
      }
      arch::fence_proxy_async_shared();
      __syncthreads();
    }

    // 1. S for tokens [16 wg, 16 wg + 16): one accumulator per latent group and one for the rope.
    {
      float s_group[Tile::groups][8];
      float s_rope[8];
      const std::uint32_t q_tile = smem_base + Tile::q_offset;
      const std::uint32_t b_tile = smem_base + latent_tile + 2u * LatentTile::group_bytes * static_cast<std::uint32_t>(wg);
      // Base descriptors once; each k step adds a constant to the start address.
      const std::uint64_t q_desc = QTile::k_major_descriptor(q_tile, 0);
      const std::uint64_t b_desc = LatentTile::k_major_descriptor(b_tile, 0);
      arch::wgmma_fence();
SLIMSERVE_ATTENTION_UNROLL
      for (int grp = 0; grp < Tile::groups; ++grp) {
SLIMSERVE_ATTENTION_UNROLL
        for (int k = 0; k < Tile::group_k_steps; ++k) {
          const int step = grp * Tile::group_k_steps + k;
          mla_wgmma_ss<MmaT, 16>(s_group[grp], q_desc + QTile::k_major_step(step), b_desc + LatentTile::k_major_step(step),
                                 k > 0);
        }
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < Tile::rope_k_steps; ++k) {
        const int step = Tile::groups * Tile::group_k_steps + k;
        mla_wgmma_ss<MmaT, 16>(s_rope, q_desc + QTile::k_major_step(step), b_desc + LatentTile::k_major_step(step), k > 0);
      }
      arch::wgmma_commit_group();
      arch::wgmma_wait_group<0>();
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < 8; ++i) {
        const int row = 16 * w + g + 8 * ((i / 2) % 2);
        const int token = 16 * wg + 8 * (i / 4) + 2 * t + i % 2;
        float s = s_rope[i];
SLIMSERVE_ATTENTION_UNROLL
        for (int grp = 0; grp < Tile::groups; ++grp) {
          const float scale = group_scales ? scales[token * Tile::groups + grp] : static_scale;
          s = fmaf(s_group[grp][i], scale, s);
        }
        scores[row * Tile::tile_tokens + token] = s;
      }
    }
    __syncthreads();

    // 2. Online softmax: row soft_row, tokens [8 soft_seg, 8 soft_seg + 8).
    {
      constexpr int tokens = Tile::tokens_per_thread;
      const int token0 = soft_seg * tokens;
      float x[tokens];
      float tile_max = -INFINITY;
SLIMSERVE_ATTENTION_UNROLL
      for (int j = 0; j < tokens; ++j) {
        const std::int64_t position = tile_begin + token0 + j;
        const bool visible = soft_valid && token_ok[token0 + j] != 0 && position <= soft_query;
        x[j] = visible ? scores[soft_row * Tile::tile_tokens + token0 + j] * p.score_scale : -INFINITY;
        tile_max = fmaxf(tile_max, x[j]);
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int offset = 1; offset < Tile::threads_per_row; offset *= 2) {
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
      }
      const float new_max = fmaxf(run_max, tile_max);
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      const float alpha = exp2f(run_max - base);
      float weight[tokens];
      float sum = 0.0f;
SLIMSERVE_ATTENTION_UNROLL
      for (int j = 0; j < tokens; ++j) {
        weight[j] = exp2f(x[j] - base);
        sum += weight[j];
      }
      // One 16-byte chunk of P per P tile: columns [8 soft_seg, 8 soft_seg + 8) of the row.
      for (int grp = 0; grp < (group_scales ? Tile::groups : 1); ++grp) {
        Vec16 chunk;
SLIMSERVE_ATTENTION_UNROLL
        for (int j = 0; j < tokens; j += 2) {
          float lo = weight[j];
          float hi = weight[j + 1];
          if (group_scales) {
            lo *= scales[(token0 + j) * Tile::groups + grp] * per_token_p_headroom;
            hi *= scales[(token0 + j + 1) * Tile::groups + grp] * per_token_p_headroom;
          }
          chunk.word[j / 2] = pack_pair<MmaT>(lo, hi);
        }
        store16(smem + Tile::p_offset + grp * PTile::bytes + PTile::chunk_offset(soft_row, soft_seg), chunk);
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int offset = 1; offset < Tile::threads_per_row; offset *= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      }
      run_sum = run_sum * alpha + sum;
      run_max = new_max;
      if (soft_seg == 0) row_alpha[soft_row] = alpha;
    }
    arch::fence_proxy_async_shared();
    __syncthreads();

    // 3. O[:, groups 2 wg, 2 wg + 1] = alpha O + P_group . latent[tile, group columns].
    {
      const float alpha_lo = row_alpha[16 * w + g];
      const float alpha_hi = row_alpha[16 * w + g + 8];
      // Once the row maxima settle every alpha is 1: skip the 128 multiplies (warp vote).
      if (__any_sync(0xffffffffu, alpha_lo != 1.0f || alpha_hi != 1.0f)) {
SLIMSERVE_ATTENTION_UNROLL
        for (int j = 0; j < 2; ++j) {
SLIMSERVE_ATTENTION_UNROLL
          for (int i = 0; i < 64; ++i) o_acc[j][i] *= ((i / 2) % 2) != 0 ? alpha_hi : alpha_lo;
        }
      }
      arch::wgmma_fence();
SLIMSERVE_ATTENTION_UNROLL
      for (int j = 0; j < 2; ++j) {
        const int grp = 2 * wg + j;
        const std::uint32_t p_tile = smem_base + Tile::p_offset + static_cast<std::uint32_t>(group_scales ? grp : 0) * PTile::bytes;
SLIMSERVE_ATTENTION_UNROLL
        for (int k = 0; k < Tile::tile_tokens / 16; ++k) {
          mla_wgmma_ss<MmaT, 128, arch::WgmmaMajor::mn>(o_acc[j], PTile::k_major_descriptor(p_tile, k),
                                              LatentTile::mn_major_descriptor(smem_base + latent_tile, k, mla_scale_group * grp),
                                              true);
        }
      }
      arch::wgmma_commit_group();
      arch::wgmma_wait_group<0>();
    }
  };

SLIMSERVE_ATTENTION_UNROLL
  for (int i = 0; i < Tile::stages - 1; ++i) {
    if (i < num_tiles) produce(i);
    arch::cp_async_commit();
  }
  for (std::int64_t i = 0; i < num_tiles; ++i) {
    arch::cp_async_wait<Tile::stages - 2>();
    arch::fence_proxy_async_shared();  // the copies are read by wgmma (BF16) next
    __syncthreads();  // tile i visible to all; tile i - 1 consumed by all
    if (i + Tile::stages - 1 < num_tiles) produce(i + Tile::stages - 1);
    arch::cp_async_commit();
    consume(i);
  }
  arch::cp_async_wait<0>();

  if (soft_seg == 0) {
    row_max[soft_row] = run_max;
    row_sum[soft_row] = run_sum;
  }
  __syncthreads();
  const float out_scale = group_scales ? 1.0f / per_token_p_headroom : static_scale;
SLIMSERVE_ATTENTION_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int r = 16 * w + g + 8 * half;
    const std::int64_t packed = tile_row0 + r;
    const float sum = row_sum[r];
    const bool empty = !(sum > 0.0f);
    const float norm = empty ? 0.0f : out_scale / sum;
    if (!p.split_kv && packed >= valid_rows) continue;
    float* po = p.split_kv ? p.partial_o + partial_row(r) * mla_latent_dim : nullptr;
    bf16* o = nullptr;
    if (!p.split_kv) {
      const std::int64_t token = first_token + packed / p.num_heads;
      const std::int64_t head = packed % p.num_heads;
      o = static_cast<bf16*>(p.o) + token * p.o_token_stride + head * p.o_head_stride;
    }
SLIMSERVE_ATTENTION_UNROLL
    for (int j = 0; j < 2; ++j) {
SLIMSERVE_ATTENTION_UNROLL
      for (int i = 0; i < 64; ++i) {
        if (((i / 2) % 2) != half) continue;
        const int column = mla_scale_group * (2 * wg + j) + 8 * (i / 4) + 2 * t + i % 2;
        if (p.split_kv) {
          po[column] = o_acc[j][i] * norm;
        } else {
          o[column] = from_float<bf16>(o_acc[j][i] * norm);
        }
      }
    }
  }
  if (soft_seg == 0) {
    const bool empty = !(run_sum > 0.0f);
    const float lse = empty ? -INFINITY : (run_max + log2f(run_sum)) * paged_ln_2;
    if (p.split_kv) {
      p.partial_lse[partial_row(soft_row)] = soft_valid ? lse : -INFINITY;
    } else if (soft_valid && p.lse != nullptr) {
      const std::int64_t token = first_token + soft_packed / p.num_heads;
      p.lse[token * p.num_heads + soft_packed % p.num_heads] = lse;
    }
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
