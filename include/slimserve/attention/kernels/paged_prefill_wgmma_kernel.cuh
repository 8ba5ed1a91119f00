#pragma once
/// \file
/// \brief Paged attention on sm_90a warpgroup MMA (wgmma), for prefill / append: the same
/// parameters, schedule (64 packed rows per CTA, warps_m = 4) and results as
/// paged_attention_kernel, with both products on wgmma instead of mma.sync m16n8k16. The plan
/// picks it when asked (PagedAttentionPlanArguments::warpgroup_mma) for a 64-row schedule
/// over a head_dim of PagedWgmmaHeadDims; the run keeps the mma.sync kernel for what this one
/// does not take (per-token scales, fused chunk K/V).
///
/// CTA: one warpgroup (128 threads) owns the 64 rows (one wgmma M). K/V stream through
/// `stages` tiles of 64 tokens (cp.async, zero-filled past the end, page-table gather per
/// token):
///   16-bit caches: straight into the 128B-swizzled canonical tiles (WgmmaTile128B) that
///     wgmma reads;
///   FP8 caches: the raw codes into a plain stage; once per tile every thread widens 16 codes
///     at a time (cvt.f16x2.e4m3x2, exact) into the one converted fp16 tile pair, so each K/V
///     element is converted once per CTA and read by all 64 rows from there.
/// Per tile:
///   S[64 x 64] = Q K^T: Q fragments live in registers for the whole kernel (A from
///     registers), K K-major from the tile (head_dim is the contiguous dim): HeadDim/16
///     m64n64k16;
///   online softmax on the accumulator registers (FP32, log2 units, exp2), quad shuffles for
///     the row max; P rounded to the mma type straight into A fragments (the accumulator of
///     m64nN holds exactly the A fragment of the next product: p[k][r] = s[8k + 2r .. +1]);
///   O[64 x HeadDim] += P V: V is the MN-major B (the same swizzled bytes): 4 m64nHeadDimk16.
/// Each product is committed and waited for before its accumulator is touched (the emulator
/// makes in-flight accumulators NaN), so a CTA alternates tensor and softmax work; the second
/// CTA of the SM (2 per SM: ~100 KB of shared memory each) overlaps them.
/// Numerics: the mma.sync kernel's (mma_input_t<KvT>: the cache type, fp16 for FP8 with Q
/// saturated to its range, NaN kept; per-tensor k_scale folded into the score scale, v_scale into the
/// output), so both kernels share the tests' tolerances.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "slimserve/arch/cp_async.cuh"
#include "slimserve/arch/wgmma.cuh"
#include "slimserve/arch/wgmma_tile.cuh"
#include "slimserve/attention/kernels/paged_attention_kernel.cuh"
#include "slimserve/attention/kernels/prefill_pingpong_epilogue.cuh"
#include "slimserve/attention/kernels/prefill_q_fragments.cuh"
#include "slimserve/attention/kernels/prefill_tile_softmax.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

template <class KvT, int HeadDim>
struct PagedWgmmaTile {
  using MmaT = mma_input_t<KvT>;
  static constexpr bool fp8 = fp8_format<KvT>;
  static constexpr int threads = 128;  // one warpgroup
  static constexpr int rows = 64;      // one wgmma M; the plan's cta_rows at warps_m = 4
  static constexpr int stage_tokens = 64;
  static constexpr int stages = 3;
  static constexpr int k_steps = HeadDim / 16;            // Q fragments, S chain length
  static constexpr int token_steps = stage_tokens / 16;   // P fragments, O chain length
  static constexpr int score_values = stage_tokens / 2;   // S accumulator (m64n64) per thread
  static constexpr int output_values = HeadDim / 2;       // O accumulator (m64nD) per thread
  using KvTile = arch::WgmmaTile128B<stage_tokens, HeadDim>;  // [tokens][HeadDim] in MmaT
  static_assert(HeadDim % 64 == 0 && HeadDim <= 256, "wgmma N <= 256 in 128-byte atoms");
  static_assert(stage_tokens == 64, "one 64-bit token mask per stage");
  // FP8 raw stage: [2 (K, V)][tokens][HeadDim] codes, unswizzled (read once, 16 B per thread).
  static constexpr int raw_row_chunks = HeadDim / 16;
  static constexpr int raw_stage_chunks = stage_tokens * raw_row_chunks;  // per K (and V)

  // Shared memory, carved by byte offsets (the swizzled tiles need 1024-byte alignment, more
  // than a struct can ask of the dynamic shared memory base).
  static constexpr int kv_tiles = fp8 ? 1 : stages;
  static constexpr std::uint32_t tiles_offset = 0;  // [kv_tiles][K, V] KvTile
  static constexpr std::uint32_t raw_offset = tiles_offset + kv_tiles * 2 * KvTile::bytes;
  static constexpr std::uint32_t raw_stage_bytes = fp8 ? 2u * stage_tokens * HeadDim : 0u;
  // Per stage, one bit per token: its page id is valid (written by the producer's first
  // stage_tokens / 32 warps; read once per tile, before the softmax variants, so that they
  // hold no shared loads).
  static constexpr int mask_words = stage_tokens / 32;
  static constexpr std::uint32_t token_ok_offset = raw_offset + stages * raw_stage_bytes;
  static constexpr std::uint32_t shared_bytes = token_ok_offset + stages * mask_words * 4;
  static_assert(KvTile::bytes % 1024 == 0 && raw_offset % 16 == 0);
  static_assert(shared_bytes <= 113 * 1024, "two CTAs per SM");
};

/// One wgmma.mma_async with A from registers in the 16-bit type T.
template <class T, int N, arch::WgmmaMajor BMajor>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void paged_wgmma_rs(float (&d)[N / 2], const std::uint32_t (&a)[4],
                                                           std::uint64_t desc_b, bool accumulate) {
  if constexpr (std::is_same_v<T, bf16>) {
    arch::wgmma_mma_rs_bf16<N, BMajor>(d, a, desc_b, accumulate);
  } else {
    arch::wgmma_mma_rs_fp16<N, BMajor>(d, a, desc_b, accumulate);
  }
}

template <class KvT, class QT, int HeadDim>
__global__ void __launch_bounds__(128, 2) paged_prefill_wgmma_kernel(const PagedAttentionParams p) {
  using Tile = PagedWgmmaTile<KvT, HeadDim>;
  using MmaT = typename Tile::MmaT;
  using KvTile = typename Tile::KvTile;
  constexpr bool fp8 = Tile::fp8;
  unsigned char* smem = rt::dynamic_shared_memory();
  std::uint32_t* stage_token_ok = reinterpret_cast<std::uint32_t*>(smem + Tile::token_ok_offset);  // [stages][mask_words]
  const std::uint32_t smem_base = arch::wgmma_shared_address(smem);

  const int tid = static_cast<int>(threadIdx.x);
  const int w = tid / 32;  // warp of the warpgroup: rows 16 w ..
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  // The grid is [KV heads][work items] (blockIdx.y, blockIdx.x); CTAs are taken in the order
  // of the linear block index with the KV heads of one work item next to each other, so the
  // plan's longest-first order of the work items is the launch order across all heads (LPT:
  // the long causal row tiles start first, the short ones fill the tail).
  const std::int64_t cta = static_cast<std::int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  const std::int32_t work = static_cast<std::int32_t>(cta / p.num_kv_heads);
  const std::int32_t kv_head = static_cast<std::int32_t>(cta % p.num_kv_heads);
  const std::int32_t b = p.work_request[work];
  const std::int32_t row_tile = p.work_row_tile[work];
  const std::int32_t split = p.work_split[work];
  const std::int32_t num_splits = p.work_num_splits[work];

  const std::int32_t qo_begin = p.qo_indptr[b];
  const std::int32_t qo_len = p.qo_indptr[b + 1] - qo_begin;
  const std::int64_t kv_len = located_request_length(p, b);
  const bool aborted = kv_len < 0 || kv_len > INT32_MAX || qo_len < 0 || qo_len > kv_len || !request_admitted(p, b);
  const std::int64_t tile_row0 = static_cast<std::int64_t>(row_tile) * Tile::rows;

  if (aborted) {
    // As paged_attention_kernel: nothing of the request is read; NaN rows, lse -inf (split:
    // partial lse NaN, which the merge turns into the same marked rows).
    for (int r = tid; r < Tile::rows; r += Tile::threads) {
      const std::int64_t packed = tile_row0 + r;
      if (p.split_kv) {
        p.partial_lse[(static_cast<std::int64_t>(work) * p.num_kv_heads + kv_head) * Tile::rows + r] = NAN;
        continue;
      }
      if (qo_len < 0 || packed >= static_cast<std::int64_t>(qo_len) * p.group_size) continue;
      const std::int64_t token = qo_begin + packed / p.group_size;
      const std::int64_t head = static_cast<std::int64_t>(kv_head) * p.group_size + packed % p.group_size;
      QT* o = static_cast<QT*>(p.o) + token * p.o_token_stride + head * p.o_head_stride;
      for (int d = 0; d < HeadDim; ++d) o[d] = from_float<QT>(NAN);
      if (p.lse != nullptr) p.lse[token * p.num_qo_heads + head] = -INFINITY;
    }
    return;
  }

  const std::int64_t valid_rows = static_cast<std::int64_t>(qo_len) * p.group_size;
  auto row_query_position = [&](std::int64_t packed_row) -> std::int64_t {
    return kv_len - qo_len + packed_row / p.group_size;
  };
  // KV range: this split, cut to what the rows can see (causal end, window start).
  const bool has_rows = tile_row0 < valid_rows;
  const std::int64_t last_row = has_rows ? (tile_row0 + Tile::rows < valid_rows ? tile_row0 + Tile::rows : valid_rows) - 1 : tile_row0;
  const std::int64_t min_query = row_query_position(tile_row0);
  const std::int64_t max_query = row_query_position(last_row);
  std::int64_t kv_begin = static_cast<std::int64_t>(split) * p.chunk_tokens;
  std::int64_t kv_end = split == num_splits - 1 ? kv_len : kv_begin + p.chunk_tokens;
  if (kv_end > kv_len) kv_end = kv_len;
  if (p.causal && kv_end > max_query + 1) kv_end = max_query + 1;
  const bool windowed = p.window_left >= 0;
  if (windowed && kv_begin < min_query - p.window_left) kv_begin = min_query - p.window_left;
  if (!has_rows || kv_end < kv_begin) kv_end = kv_begin;

  // [pages of the request]; one pass over the range's page ids: the common case (all valid)
  // skips the per-token flags.
  const std::int32_t* request_pages = located_request_pages(p, b);
  int bad_page = 0;
  {
    const std::int64_t first_page = kv_begin >> p.page_shift;
    const std::int64_t end_page = kv_end > kv_begin ? ((kv_end - 1) >> p.page_shift) + 1 : first_page;
    // Not unrolled: a rolled scan is not mistaken for the streaming loop by the SASS report.
#if defined(__CUDACC__)
#pragma unroll 1
#endif
    for (std::int64_t i = first_page + tid; i < end_page; i += Tile::threads) {
      const std::int32_t page = request_pages[i];
      if (page < 0 || page >= p.num_pages) bad_page = 1;
    }
  }
  const bool all_pages_ok = __syncthreads_or(bad_page) == 0;

  // Q fragments of rows 16 w + g (+ 8), in A-fragment order: register r of k step s holds
  // columns 16 s + 8 (r / 2) + 2 t (+1) of row half r % 2.
  std::uint32_t q_frag[Tile::k_steps][4];
  PrefillRowRange rows{};
  rows.kv_end = kv_end;
  rows.causal = p.causal;
  rows.windowed = windowed;
  rows.window_left = p.window_left;
  {
    const QT* q = static_cast<const QT*>(p.q);
    std::int64_t row_base[2];
    for (int half = 0; half < 2; ++half) {
      const std::int64_t packed = tile_row0 + 16 * w + g + 8 * half;
      rows.row_valid[half] = packed < valid_rows;
      rows.query_position[half] = rows.row_valid[half] ? row_query_position(packed) : -1;
      const std::int64_t token = qo_begin + packed / p.group_size;
      const std::int64_t head = static_cast<std::int64_t>(kv_head) * p.group_size + packed % p.group_size;
      row_base[half] = rows.row_valid[half] ? token * p.q_token_stride + head * p.q_head_stride : 0;
    }
    load_prefill_q_fragments<QT, MmaT>(q, row_base, rows.row_valid, t, q_frag);
  }

  const float k_static = p.scale_mode == KvScaleMode::per_tensor ? *p.k_scale : 1.0f;
  const float v_static = p.scale_mode == KvScaleMode::per_tensor ? *p.v_scale : 1.0f;
  const bool soft_capped = p.soft_cap > 0.0f;
  const PrefillScoreScale scale{p.score_scale * k_static, p.sm_scale * k_static / (soft_capped ? p.soft_cap : 1.0f),
                                p.soft_cap * paged_log2_e};
  PrefillRowState<Tile::output_values> state;  // the O accumulators, row maxima and partial sums
  state.clear();

  const KvT* k_pages = static_cast<const KvT*>(p.k_pages);
  const KvT* v_pages = static_cast<const KvT*>(p.v_pages);
  const std::int64_t num_tiles = (kv_end - kv_begin + Tile::stage_tokens - 1) / Tile::stage_tokens;
  const PrefillPlainTiles<Tile::stage_tokens> plain(kv_begin, kv_end, min_query, max_query, p.causal, windowed,
                                                    p.window_left, all_pages_ok);
  // Element offset of (page, slot, kv_head, 0) = page * page_stride + slot * slot_stride + head_offset.
  const std::int64_t page_stride = p.page_stride;
  const std::int32_t slot_stride = p.layout == KvLayout::nhd ? p.num_kv_heads * HeadDim : HeadDim;
  const std::int32_t head_offset = p.layout == KvLayout::nhd ? kv_head * HeadDim : kv_head * p.page_size * HeadDim;
  const std::int32_t slot_mask = p.page_size - 1;
  const auto num_pages = static_cast<std::uint32_t>(p.num_pages);
  const auto kv_end32 = static_cast<std::int32_t>(kv_end);

  // Producer: thread `tid` copies 16-byte column `chunk` of tokens token0, token0 + step, ...
  // of K and V (one page-id load per token and thread).
  constexpr int row_chunks = fp8 ? Tile::raw_row_chunks : HeadDim / 8;
  constexpr int token_step = Tile::threads / row_chunks;
  static_assert(Tile::threads % row_chunks == 0 && Tile::stage_tokens % token_step == 0);
  const int producer_chunk = tid % row_chunks;
  const int producer_token = tid / row_chunks;
  auto produce = [&](std::int64_t i) {
    const int stage = static_cast<int>(i % Tile::stages);
    const auto tile_begin = static_cast<std::int32_t>(kv_begin + i * Tile::stage_tokens);
    unsigned char* k_dst = fp8 ? smem + Tile::raw_offset + stage * Tile::raw_stage_bytes
                               : smem + Tile::tiles_offset + stage * 2 * KvTile::bytes;
    unsigned char* v_dst = k_dst + (fp8 ? Tile::raw_stage_bytes / 2 : KvTile::bytes);
SLIMSERVE_ATTENTION_UNROLL
    for (int j = 0; j < Tile::stage_tokens / token_step; ++j) {
      const int token = producer_token + j * token_step;
      const std::int32_t position = tile_begin + token;
      const std::int32_t page = position < kv_end32 ? request_pages[position >> p.page_shift] : -1;
      const bool ok = static_cast<std::uint32_t>(page) < num_pages;
      const std::int64_t offset =
          ok ? page * page_stride + ((position & slot_mask) * slot_stride + head_offset + producer_chunk * (16 / static_cast<int>(sizeof(KvT))))
             : 0;
      const std::uint32_t dst = fp8 ? static_cast<std::uint32_t>(token * HeadDim + 16 * producer_chunk)
                                    : KvTile::chunk_offset(token, producer_chunk);
      arch::cp_async_16_zfill(k_dst + dst, k_pages + offset, ok);
      arch::cp_async_16_zfill(v_dst + dst, v_pages + offset, ok);
    }
    if (tid < Tile::stage_tokens) {  // whole warps
      bool token_ok = true;
      if (!all_pages_ok) {
        const std::int32_t position = tile_begin + tid;
        const std::int32_t page = position < kv_end32 ? request_pages[position >> p.page_shift] : -1;
        token_ok = static_cast<std::uint32_t>(page) < num_pages;
      }
      const std::uint32_t bits = __ballot_sync(0xffffffffu, token_ok);
      if (lane == 0) stage_token_ok[stage * Tile::mask_words + tid / 32] = bits;
    }
  };

  // FP8: widen the stage's codes (each once, 16 per thread and step) into the converted tiles.
  auto convert = [&](int stage) {
    const unsigned char* raw = smem + Tile::raw_offset + stage * Tile::raw_stage_bytes;
    unsigned char* tiles = smem + Tile::tiles_offset;
SLIMSERVE_ATTENTION_UNROLL
    for (int unit = 0; unit < 2 * Tile::raw_stage_chunks / Tile::threads; ++unit) {
      const int u = tid + Tile::threads * unit;  // [K, V][token][chunk]
      const int which = u / Tile::raw_stage_chunks;
      const int token = (u % Tile::raw_stage_chunks) / Tile::raw_row_chunks;
      const int c = u % Tile::raw_row_chunks;
      const Vec16 codes = load16(raw + 16 * u);
      Vec16 wide[2];
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < 4; ++k) {
        fp8_quad_to_f16x2<KvT>(codes.word[k], wide[k / 2].word[2 * (k % 2)], wide[k / 2].word[2 * (k % 2) + 1]);
      }
      unsigned char* tile = tiles + which * KvTile::bytes;
      store16(tile + KvTile::chunk_offset(token, 2 * c), wide[0]);
      store16(tile + KvTile::chunk_offset(token, 2 * c + 1), wide[1]);
    }
  };

  auto consume = [&](std::int64_t i) {
    const int stage = static_cast<int>(i % Tile::stages);
    const std::int64_t tile_begin = kv_begin + i * Tile::stage_tokens;
    // Bit c: token c of the tile has a valid page id (all ones when every page is valid).
    std::uint64_t token_ok = 0;
SLIMSERVE_ATTENTION_UNROLL
    for (int word = 0; word < Tile::mask_words; ++word) {
      token_ok |= static_cast<std::uint64_t>(stage_token_ok[stage * Tile::mask_words + word]) << (32 * word);
    }
    // 16-bit caches: the stage's tile address is uniform across the CTA, and the shuffle from
    // lane 0 tells the compiler so, which keeps the descriptors in uniform registers: each
    // wgmma's descriptor is one UIADD3.64 of a constant step to a uniform base, where the
    // per-thread address cost two R2UR and a 64-bit add with moves per wgmma (BF16 593 -> 549
    // warp-instructions per warp and tile). FP8 reads one converted tile at a constant address,
    // already uniform (a shuffle there only adds instructions).
    const std::uint32_t stage_tile = smem_base + Tile::tiles_offset + static_cast<std::uint32_t>(stage) * 2u * KvTile::bytes;
    const std::uint32_t k_tile = fp8 ? smem_base + Tile::tiles_offset : __shfl_sync(0xffffffffu, stage_tile, 0);
    const std::uint32_t v_tile = k_tile + KvTile::bytes;

    // S = Q K^T: [64 rows][64 tokens], K-major K.
    float s[Tile::score_values];
    {
      const std::uint64_t k_desc = KvTile::k_major_descriptor(k_tile, 0);
      arch::wgmma_fence();
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < Tile::k_steps; ++k) {
        paged_wgmma_rs<MmaT, Tile::stage_tokens, arch::WgmmaMajor::k>(s, q_frag[k], k_desc + KvTile::k_major_step(k), k > 0);
      }
      arch::wgmma_commit_group();
      arch::wgmma_wait_group<0>();
    }

    // Softmax of the tile (prefill_tile_softmax.cuh, shared with the ping-pong kernel),
    // compiled once per (masked, soft-capped) so the common case has no per-element branches.
    std::uint32_t p_frag[Tile::token_steps][4];
    prefill_tile_softmax<MmaT>(plain.masked(static_cast<std::int32_t>(i)), soft_capped, s, state, p_frag, scale, rows,
                               tile_begin, token_ok, t);

    // O += P V: V MN-major (rows = tokens = K, columns = head_dim = N).
    {
      const std::uint64_t v_desc = KvTile::mn_major_descriptor(v_tile, 0, 0);
      arch::wgmma_fence();
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < Tile::token_steps; ++k) {
        paged_wgmma_rs<MmaT, HeadDim, arch::WgmmaMajor::mn>(state.o, p_frag[k], v_desc + KvTile::mn_major_step(k, 0), true);
      }
      arch::wgmma_commit_group();
      arch::wgmma_wait_group<0>();
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
    if constexpr (fp8) {
      __syncthreads();  // raw stage i visible to all; the converted tiles of i - 1 consumed by all
      convert(static_cast<int>(i % Tile::stages));
    }
    arch::fence_proxy_async_shared();  // the tiles are read by wgmma next
    __syncthreads();  // tile i visible to all; stage i - 1 consumed by all
    if (i + Tile::stages - 1 < num_tiles) produce(i + Tile::stages - 1);
    arch::cp_async_commit();
    consume(i);
  }
  arch::cp_async_wait<0>();

  // Epilogue straight from the accumulators (prefill_pingpong_epilogue.cuh, shared with the
  // ping-pong kernel's consumer 0).
  prefill_store_rows<QT, HeadDim>(p, state, work, kv_head, qo_begin, tile_row0, valid_rows, v_static, w, g, t);
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
