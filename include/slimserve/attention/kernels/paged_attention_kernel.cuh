#pragma once
/// \file
/// \brief Tensor-core paged attention (FlashAttention-2 style) for prefill, append, decode and
/// speculative verify over BF16/FP16/FP8/NVFP4 pages; and the merge of its split-KV partials.
///
/// Rows. For one KV head, the query rows of a request are packed as row = token * group +
/// head-in-group (group = num_qo_heads / num_kv_heads), so the mma's M dimension holds every
/// query head that shares the K/V: a decode step of GQA 8 is 8 rows of one m16 tile, a prefill
/// chunk of 100 tokens is 800 rows. A CTA owns `cta_rows` = 16 * warps_m consecutive rows.
///
/// CTA: 4 warps, arranged warps_m x warps_n (1x4 decode, 2x2, 4x1 prefill; chosen by the plan).
/// K/V stream through shared memory in `stages` tiles of `stage_tokens` tokens (cp.async,
/// zero-filled past the end). A tile is cut into 4 sub-blocks of `warp_tokens` tokens; warp
/// (wm, wn) does rows [16 wm, 16 wm + 16) of the sub-blocks wn, wn + warps_n, ... so every K/V
/// byte is read from DRAM once per CTA and from shared memory once per warps_m.
///
/// Per sub-block and warp: S = Q K^T on tensor cores (Q fragments live in registers for the
/// whole kernel), online softmax in FP32 registers in log2 units (exp2), P rounded to the mma
/// type, O += P V. FP8 fragments are converted once per warp (see mma_fragments.cuh); NVFP4
/// fragments are widened with their block scales in registers (nvfp4_fragments.cuh), the
/// per-tensor scale times nvfp4_fragment_unit folding into the score and output scales.
/// NVFP4's fused prefill stages the chunk's own K/V as fp16 rows in the NVFP4 fragment order
/// (chunk_kv.cuh), a quarter of a stage's tokens per chunk tile.
/// Scales: per-tensor k_scale folds into the score scale and v_scale into the output; per-token
/// k scales multiply score columns (FP32), per-token v scales multiply P before it is rounded
/// (by v_scale * 2^8, undone at the end, which keeps P*v_scale in the fp16 normal range).
///
/// Epilogue: the warps_n partial states of each row meet in shared memory; the CTA writes the
/// normalized output (+ natural-log LSE) or, for split-KV plans, an FP32 partial that
/// `paged_merge_kernel` combines.

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "slimserve/arch/cp_async.cuh"
#include "slimserve/arch/satfinite_pack.cuh"
#include "slimserve/attention/kernels/chunk_kv.cuh"
#include "slimserve/attention/kernels/fragment_rotate.cuh"
#include "slimserve/attention/kernels/merge_kernel.cuh"
#include "slimserve/attention/kernels/mma_fragments.cuh"
#include "slimserve/attention/kernels/nvfp4_fragments.cuh"
#include "slimserve/attention/kernels/page_locator.cuh"
#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/attention/rotation.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/runtime/platform.hpp"
#include "slimserve/runtime/shared_memory.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

struct PagedAttentionParams {
  // Cache (filled by detail::fill_paged_cache_fields, shared with append/decode).
  const void* k_pages;  // [num_pages, page_size, H_kv, D] (NHD) or [num_pages, H_kv, page_size, D]
  const void* v_pages;
  const float* k_scale;  // per_tensor
  const float* v_scale;
  const float* k_token_scales;  // per_token: pages' layout with D = 1
  const float* v_token_scales;
  std::int32_t num_pages;
  std::int32_t page_size;
  std::int32_t page_shift;  // log2(page_size)
  std::int32_t num_kv_heads;
  std::int64_t page_stride;  // elements from one page of k_pages (and of v_pages) to the next
  KvLayout layout;
  KvScaleMode scale_mode;
  // Page table: CSR (indptr != null) or block table (page_locator.cuh), and tag-check verdicts.
  const std::int32_t* indptr;         // [B + 1]
  const std::int32_t* indices;        // [indptr[B]]
  const std::int32_t* last_page_len;  // [B]
  const std::int32_t* block_table;    // [B, block_table_stride]
  std::int32_t block_table_stride;
  const std::int32_t* seq_lens;     // [B]
  const kv::RequestStatus* status;  // [B] or null
  // Queries and outputs (strides in elements).
  const std::int32_t* qo_indptr;  // [B + 1]: query tokens of request b
  const void* q;                  // q[token * q_token_stride + head * q_head_stride + d]
  void* o;                        // o[token * o_token_stride + head * o_head_stride + d]
  float* lse;                     // [total query tokens, H_qo] natural log, or null
  std::int64_t q_token_stride, q_head_stride;
  std::int64_t o_token_stride, o_head_stride;
  std::int32_t num_qo_heads;
  std::int32_t group_size;  // H_qo / H_kv
  // Options.
  float score_scale;      // sm_scale * log2(e) (scores in log2 units)
  float sm_scale;         // for the soft-cap, in natural units
  float soft_cap;         // 0: none; else s = cap * tanh(s / cap) on sm_scale * q.k
  std::int32_t window_left;  // < 0: none; else key positions >= query position - window_left
  bool causal;
  // The cache's rotation (rotation.hpp), read by paged_attention_rotated_kernel only: the query
  // rows are rotated after loading; keys_and_values also rotates the output back.
  KvRotation rotation;
  const float* sinks;     // [H_qo] natural-log sink logits, or null
  // Schedule (workspace, written by the plan).
  std::int32_t warps_m;   // 1, 2 or 4
  std::int32_t cta_rows;  // 16 * warps_m
  const std::int32_t* work_request;     // [W]
  const std::int32_t* work_row_tile;    // [W]
  const std::int32_t* work_split;       // [W]
  const std::int32_t* work_num_splits;  // [W]
  std::int32_t chunk_tokens;            // KV tokens per split (multiple of stage tokens)
  bool split_kv;
  float* partial_o;    // [W, H_kv, cta_rows, D]
  float* partial_lse;  // [W, H_kv, cta_rows] natural log (sinks excluded)
  // Fused prefill (paged_prefill_fused_kernel): the chunk's own K/V and the writable cache.
  ChunkKvParams chunk;
};

inline constexpr float paged_log2_e = 1.4426950408889634f;
inline constexpr float paged_ln_2 = 0.6931471805599453f;
/// P * per-token v scale is multiplied by this before rounding to fp16 (and divided out of the
/// output): keeps products of small probabilities and scales out of fp16 subnormals.
inline constexpr float per_token_p_headroom = 256.0f;

/// Tile geometry of one instantiation.
template <class KvT, int HeadDim>
struct PagedAttentionTile {
  using Row = KvRowGeometry<KvT, HeadDim>;
  static constexpr int threads = 128;
  static constexpr int warps = 4;
  static constexpr int stages = 3;
  /// ~32 KiB of K + V per stage, 64 or 128 tokens (head_dim 96 and 192: 64 for 16-bit).
  static constexpr int stage_tokens_raw = 32768 / (2 * Row::row_bytes);
  static constexpr int stage_tokens = stage_tokens_raw < 128 ? 64 : 128;
  static constexpr int warp_tokens = stage_tokens / warps;  // one sub-block
  static constexpr int score_tiles = warp_tokens / 8;       // n8 tiles of S per sub-block
  static constexpr int k_steps = HeadDim / 16;              // Q fragments
  static constexpr int output_tiles = HeadDim / 8;          // n8 tiles of O
  static constexpr int max_rows = 64;                       // cta_rows at warps_m = 4
  static constexpr int stage_chunks = stage_tokens * Row::row_chunks;  // per K (and per V)
  /// NVFP4: a [stage_tokens, head_dim / 16] byte array of block scales per K and per V stage.
  static constexpr bool block_scaled = std::is_same_v<KvT, nvfp4>;
  static constexpr int block_scale_bytes = block_scaled ? stage_tokens * HeadDim / nvfp4_block_elements : 0;
  /// CTAs per SM the registers are sized for (__launch_bounds__). 16-bit head_dim 64 stages
  /// 128 tokens (~100 KB of shared memory), so 2 CTAs fit: saying so gives the compiler up to
  /// 255 registers, where its own occupancy guess (168) spilled. Others: the default.
  static constexpr int min_ctas_per_sm = (Row::bits == 16 && HeadDim == 64) ? 2 : 1;
  static_assert(warp_tokens % 16 == 0, "sub-blocks of whole k steps");
  static_assert(stage_chunks % threads == 0, "whole chunks per thread");
  static_assert(stage_tokens <= threads, "one thread per token of a stage for its metadata");
};

/// The block scales of one stage (NVFP4; empty for the other formats, so their stages keep
/// their size).
template <int Bytes>
struct StageBlockScales {
  alignas(16) unsigned char k[Bytes];  // [stage_tokens, head_dim / 16] E4M3
  alignas(16) unsigned char v[Bytes];
};
template <>
struct StageBlockScales<0> {};

template <class KvT, int HeadDim>
struct PagedAttentionSharedStorage {
  using Tile = PagedAttentionTile<KvT, HeadDim>;
  struct Stage {
    alignas(128) unsigned char k[Tile::stage_tokens * Tile::Row::row_bytes];  // [tokens, row] swizzled
    alignas(128) unsigned char v[Tile::stage_tokens * Tile::Row::row_bytes];
    // Written only when per-token scales or invalid page ids are in play: the K scale (1 for
    // per-tensor) or NaN where the token must be left out (past the end, invalid page id).
    float k_token_scale[Tile::stage_tokens];
    float v_token_scale[Tile::stage_tokens];  // per_token: v scale * 2^8, else 1
    [[no_unique_address]] StageBlockScales<Tile::block_scale_bytes> block_scales;
  };
  struct Epilogue {
    float o[Tile::max_rows * HeadDim];  // [warps_n, cta_rows, D] unnormalized
    float m[Tile::max_rows];            // [warps_n, cta_rows] running max (log2 units)
    float l[Tile::max_rows];            // [warps_n, cta_rows] running sum
  };
  union {
    Stage stages[Tile::stages];
    Epilogue epilogue;
  } u;
};

/// The one place the kernel consults the tag check: may request b's pages be read?
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE bool request_admitted(const PagedAttentionParams& p, std::int32_t b) {
  return p.status == nullptr || kv::request_ok(p.status[b]);
}

template <class T>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE float activation_to_float(const void* base, std::int64_t index) {
  return to_float(static_cast<const T*>(base)[index]);
}

/// The kernel body. FusedChunk: the chunk's K/V come from `p.chunk` (chunk_kv.cuh) instead of
/// the pages, and split 0 of each row tile writes its tokens' K/V into the pages. Rotated: the
/// cache was appended with p.rotation (not none): the query rows are rotated in FP32 after
/// loading (fragment_rotate.cuh) and, for keys_and_values, the output rows are rotated back
/// before they are written. A template parameter, so the unrotated kernels' code is unchanged.
template <class KvT, class QT, int HeadDim, bool FusedChunk, bool Rotated = false>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void paged_attention_body(const PagedAttentionParams& p) {
  using Tile = PagedAttentionTile<KvT, HeadDim>;
  using Row = typename Tile::Row;
  using MmaT = mma_input_t<KvT>;
  using Smem = PagedAttentionSharedStorage<KvT, HeadDim>;
  constexpr bool fp8 = Row::fp8;
  constexpr bool block_scaled = Tile::block_scaled;
  static_assert(!(Rotated && FusedChunk), "a rotated cache has no fused prefill (the host refuses it)");
  static_assert(!Rotated || hadamard_head_dim<HeadDim>, "rotation: head_dim 64, 128 or 256 (RotationHeadDims)");
  auto& smem = rt::shared_storage<Smem>();

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // fragment row
  const int t = lane % 4;  // fragment column pair
  const int warps_n = Tile::warps / p.warps_m;
  const int wm = warp % p.warps_m;
  const int wn = warp / p.warps_m;

  const std::int32_t work = static_cast<std::int32_t>(blockIdx.x);
  const std::int32_t kv_head = static_cast<std::int32_t>(blockIdx.y);
  const std::int32_t b = p.work_request[work];
  const std::int32_t row_tile = p.work_row_tile[work];
  const std::int32_t split = p.work_split[work];
  const std::int32_t num_splits = p.work_num_splits[work];

  const std::int32_t qo_begin = p.qo_indptr[b];
  const std::int32_t qo_len = p.qo_indptr[b + 1] - qo_begin;
  const std::int64_t kv_len = located_request_length(p, b);
  const bool aborted = kv_len < 0 || kv_len > INT32_MAX || qo_len < 0 || qo_len > kv_len || !request_admitted(p, b);

  // Rows of this CTA: (query token, query head) of each packed row; invalid rows are padding.
  const std::int64_t tile_row0 = static_cast<std::int64_t>(row_tile) * p.cta_rows;
  const std::int64_t valid_rows = aborted ? 0 : static_cast<std::int64_t>(qo_len) * p.group_size;
  auto row_query_position = [&](std::int64_t packed_row) -> std::int64_t {
    return kv_len - qo_len + packed_row / p.group_size;  // the query token's position
  };

  if (aborted) {
    // Nothing of the request is read. Unsplit: NaN rows, lse -inf; split: partial lse NaN,
    // which the merge turns into the same marked rows.
    const std::int32_t rows_total = p.qo_indptr[b + 1] - qo_begin;
    for (int r = tid; r < p.cta_rows; r += Tile::threads) {
      const std::int64_t packed = tile_row0 + r;
      if (p.split_kv) {
        p.partial_lse[(static_cast<std::int64_t>(work) * p.num_kv_heads + kv_head) * p.cta_rows + r] = NAN;
        continue;
      }
      if (rows_total < 0 || packed >= static_cast<std::int64_t>(rows_total) * p.group_size) continue;
      const std::int64_t token = qo_begin + packed / p.group_size;
      const std::int64_t head = static_cast<std::int64_t>(kv_head) * p.group_size + packed % p.group_size;
      QT* o = static_cast<QT*>(p.o) + token * p.o_token_stride + head * p.o_head_stride;
      for (int d = 0; d < HeadDim; ++d) o[d] = from_float<QT>(NAN);
      if (p.lse != nullptr) p.lse[token * p.num_qo_heads + head] = -INFINITY;
    }
    return;
  }

  if constexpr (FusedChunk) {
    // Split 0 of each row tile quantizes the chunk tokens whose first packed row it holds
    // (each (token, KV head) once); nothing else reads those slots in this launch.
    if (split == 0) {
      const std::int64_t first = (tile_row0 + p.group_size - 1) / p.group_size;
      std::int64_t last = (tile_row0 + p.cta_rows + p.group_size - 1) / p.group_size;
      if (last > qo_len) last = qo_len;
      const PageStoreTarget target{p.chunk.k_pages, p.chunk.v_pages, p.chunk.k_token_scales,
                                   p.chunk.v_token_scales, p.k_scale, p.v_scale, p.page_size,
                                   p.num_kv_heads, p.layout, p.scale_mode, 0};
      append_chunk_tokens<KvT, QT, HeadDim>(p.chunk, target, located_request_pages(p, b), p.num_pages,
                                            p.page_shift, kv_head, qo_begin, kv_len - qo_len, first, last,
                                            tid, Tile::threads);
    }
  }

  // KV range: this split, cut to what the rows can see (causal end, window start).
  const std::int64_t last_row = valid_rows > 0 ? (tile_row0 + p.cta_rows < valid_rows ? tile_row0 + p.cta_rows : valid_rows) - 1 : tile_row0;
  const bool has_rows = tile_row0 < valid_rows;
  const std::int64_t min_query = row_query_position(tile_row0);
  const std::int64_t max_query = row_query_position(last_row);
  std::int64_t kv_begin = static_cast<std::int64_t>(split) * p.chunk_tokens;
  std::int64_t kv_end = split == num_splits - 1 ? kv_len : kv_begin + p.chunk_tokens;
  if (kv_end > kv_len) kv_end = kv_len;
  if (p.causal && kv_end > max_query + 1) kv_end = max_query + 1;
  const bool windowed = p.window_left >= 0;
  if (windowed) {
    const std::int64_t first_visible = min_query - p.window_left;
    if (kv_begin < first_visible) kv_begin = first_visible;
  }
  if (!has_rows || kv_end < kv_begin) kv_end = kv_begin;
  // Fused: positions from chunk_start on are the chunk's own, read from p.chunk; the pages
  // serve [kv_begin, page_end) only. Otherwise the pages serve the whole range.
  const std::int64_t chunk_start = FusedChunk ? kv_len - qo_len : kv_end;
  const std::int64_t page_end = kv_end < chunk_start ? kv_end : chunk_start;
  const std::int64_t chunk_begin = kv_begin > chunk_start ? kv_begin : chunk_start;

  // [pages of the request]: its CSR slice or its block-table row; read below kv_end only.
  const std::int32_t* request_pages = located_request_pages(p, b);
  auto page_of = [&](std::int64_t position) -> std::int32_t {
    const std::int32_t page = request_pages[position >> p.page_shift];
    return (page >= 0 && page < p.num_pages) ? page : -1;
  };
  // One pass over the range's page ids: the common case (all valid) skips per-token checks.
  int bad_page = 0;
  {
    const std::int64_t first_page = kv_begin >> p.page_shift;
    const std::int64_t end_page = page_end > kv_begin ? ((page_end - 1) >> p.page_shift) + 1 : first_page;
    for (std::int64_t i = first_page + tid; i < end_page; i += Tile::threads) {
      if (page_of(i << p.page_shift) < 0) bad_page = 1;
    }
  }
  const bool all_pages_ok = __syncthreads_or(bad_page) == 0;

  // Q fragments of this warp's 16 rows, converted to the mma type: bf16 -> fp16 rounds to
  // nearest even (exact for normal fp16 values), larger magnitudes saturate to +-65504 and NaN
  // stays NaN.
  std::uint32_t q_frag[Tile::k_steps][4];
  std::int64_t query_position[2];
  bool row_valid[2];
  {
    const QT* q = static_cast<const QT*>(p.q);
    for (int half = 0; half < 2; ++half) {
      const std::int64_t packed = tile_row0 + wm * 16 + g + half * 8;
      row_valid[half] = packed < valid_rows;
      query_position[half] = row_valid[half] ? row_query_position(packed) : -1;
    }
    // The 4 elements of k step s of row `half` as FP32 (0 for padding rows).
    auto load_q = [&](int s, int half, float (&v)[4]) {
      if (row_valid[half]) {
        const std::int64_t packed = tile_row0 + wm * 16 + g + half * 8;
        const std::int64_t token = qo_begin + packed / p.group_size;
        const std::int64_t head = static_cast<std::int64_t>(kv_head) * p.group_size + packed % p.group_size;
        const std::int64_t base = token * p.q_token_stride + head * p.q_head_stride;
SLIMSERVE_ATTENTION_UNROLL
        for (int e = 0; e < 4; ++e) {
          // The d order of the K fragments (mma_fragments.cuh, nvfp4_fragments.cuh).
          const int column = block_scaled ? nvfp4_q_column(s, t, e) : 16 * s + q_fragment_column<fp8>(t, e);
          v[e] = activation_to_float<QT>(q, base + column);
        }
      }
    };
    // A BF16 query into fp16 operands, or a rotated row (whose elements may grow by up to
    // sqrt(HeadDim)), saturates to the operand's range with NaN kept NaN (one
    // cvt.rn.satfinite per pair).
    auto pack_q = [&](int s, int half, float (&v)[4]) {
      if constexpr (!std::is_same_v<QT, MmaT> || Rotated) {
        q_frag[s][half] = arch::pack_satfinite<MmaT>(v[0], v[1]);
        q_frag[s][2 + half] = arch::pack_satfinite<MmaT>(v[2], v[3]);
      } else {
        q_frag[s][half] = pack_pair<MmaT>(v[0], v[1]);      // a[0] (row g), a[1] (row g + 8)
        q_frag[s][2 + half] = pack_pair<MmaT>(v[2], v[3]);  // a[2], a[3]
      }
    };
    if constexpr (Rotated) {
      // Each row's D values in FP32 across its quad, rotated like the stored keys, then
      // converted: q.k over the rotated keys is the unrotated q.k (rotation.hpp).
      using Columns = QueryFragmentColumns<fp8, block_scaled>;
      float rows[2][HeadDim / 4];
SLIMSERVE_ATTENTION_UNROLL
      for (int half = 0; half < 2; ++half) {
SLIMSERVE_ATTENTION_UNROLL
        for (int s = 0; s < Tile::k_steps; ++s) {
          float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          load_q(s, half, v);
SLIMSERVE_ATTENTION_UNROLL
          for (int e = 0; e < 4; ++e) rows[half][quad_local_index<Columns::shift>(Columns::column(4 * s + e, 0))] = v[e];
        }
        quad_hadamard_rotate<HeadDim, Columns::shift>(rows[half], t);
SLIMSERVE_ATTENTION_UNROLL
        for (int s = 0; s < Tile::k_steps; ++s) {
          float v[4];
SLIMSERVE_ATTENTION_UNROLL
          for (int e = 0; e < 4; ++e) v[e] = rows[half][quad_local_index<Columns::shift>(Columns::column(4 * s + e, 0))];
          pack_q(s, half, v);
        }
      }
    } else {
SLIMSERVE_ATTENTION_UNROLL
      for (int s = 0; s < Tile::k_steps; ++s) {
SLIMSERVE_ATTENTION_UNROLL
        for (int half = 0; half < 2; ++half) {
          float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          load_q(s, half, v);
          pack_q(s, half, v);
        }
      }
    }
  }

  const bool per_token = p.scale_mode == KvScaleMode::per_token;
  float k_static = p.scale_mode == KvScaleMode::per_tensor ? *p.k_scale : 1.0f;
  float v_static = p.scale_mode == KvScaleMode::per_tensor ? *p.v_scale : 1.0f;
  if constexpr (block_scaled) {
    // Products of widened NVFP4 fragments carry 2^-14 (nvfp4_fragment_unit). A tensor scale outside
    // the format's domain gives NaN scores and outputs, as the append makes such a cache's blocks
    // NaN: a bad device-held scale is visible, never a silent rescale.
    k_static = nvfp4_checked_tensor_scale(k_static, nvfp4_fragment_unit);
    v_static = nvfp4_checked_tensor_scale(v_static, nvfp4_fragment_unit);
  }
  // NVFP4 chunk tiles: 1 / v_static split into V * 2^-k (exact) and P * 2^k / v_static (chunk_kv.cuh).
  [[maybe_unused]] float chunk_v_shift = 1.0f, chunk_p_factor = 1.0f;
  if constexpr (FusedChunk && block_scaled) {
    int exponent = 0;
    frexpf(v_static, &exponent);  // v_static in [2^(exponent - 1), 2^exponent)
    exponent = exponent < -125 ? -125 : (exponent > 126 ? 126 : exponent);  // 2^(1 - exponent) finite
    chunk_v_shift = ldexpf(1.0f, 1 - exponent);
    chunk_p_factor = 1.0f / (v_static * chunk_v_shift);
  }
  const float score_scale = p.score_scale * k_static;  // raw q.k -> log2 units
  const bool soft_capped = p.soft_cap > 0.0f;
  const float cap_in = p.sm_scale * k_static / (soft_capped ? p.soft_cap : 1.0f);
  const float cap_out = p.soft_cap * paged_log2_e;

  float o_acc[Tile::output_tiles][4];
SLIMSERVE_ATTENTION_UNROLL
  for (int n = 0; n < Tile::output_tiles; ++n) {
    o_acc[n][0] = o_acc[n][1] = o_acc[n][2] = o_acc[n][3] = 0.0f;
  }
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this lane's columns only; quad-reduced at the end

  const KvT* k_pages = static_cast<const KvT*>(p.k_pages);
  const KvT* v_pages = static_cast<const KvT*>(p.v_pages);
  const std::int64_t span = page_end > kv_begin ? page_end - kv_begin : 0;
  const std::int64_t num_page_tiles = (span + Tile::stage_tokens - 1) / Tile::stage_tokens;
  // Chunk tiles: the same stage bytes in the mma type's 16-bit rows (FP8: half the tokens,
  // NVFP4: a quarter, its code bytes only).
  using ChunkRow = KvRowGeometry<MmaT, HeadDim>;
  constexpr int chunk_tile_tokens = block_scaled ? Tile::stage_tokens * Row::row_bytes / ChunkRow::row_bytes
                                                 : Tile::stage_tokens * Row::element_bytes / ChunkRow::element_bytes;
  static_assert(chunk_tile_tokens * ChunkRow::row_chunks == Tile::stage_chunks, "same stage bytes");
  static_assert(chunk_tile_tokens % Tile::warp_tokens == 0, "whole sub-blocks per chunk tile");
  const std::int64_t chunk_span = FusedChunk && kv_end > chunk_begin ? kv_end - chunk_begin : 0;
  const std::int64_t num_tiles = num_page_tiles + (chunk_span + chunk_tile_tokens - 1) / chunk_tile_tokens;

  // Element offset of (page, slot, kv_head, 0) = page * page_stride + slot * slot_stride +
  // head_offset in both layouts.
  const std::int64_t page_stride = p.page_stride;
  const std::int32_t slot_stride = p.layout == KvLayout::nhd ? p.num_kv_heads * HeadDim : HeadDim;
  const std::int32_t head_offset = p.layout == KvLayout::nhd ? kv_head * HeadDim : kv_head * p.page_size * HeadDim;
  const std::int32_t slot_mask = p.page_size - 1;
  const auto num_pages = static_cast<std::uint32_t>(p.num_pages);
  const auto page_end32 = static_cast<std::int32_t>(page_end);

  // NVFP4 producer (nvfp4_fragments.cuh): thread `tid` copies the head vector of token `tid`
  // of the tile (stage_tokens == threads), codes into the swizzled chunk rows, scales into the
  // stage's block-scale arrays, in pieces of piece_bytes. One page-id load and one address per
  // token, the pieces at immediate offsets: the per-piece index math of a lane-per-piece
  // mapping cost ~9x the instructions (a warp's copy then touches 32 vectors, all in L1 after
  // the first piece: .ca). Pages are addressed in bytes, page_stride apart (an NVFP4 page
  // stride counts bytes: packed, or vLLM's blocks of a K page and a V page): vector (slot,
  // head) of a page is at vector_bytes * its cache_offset with head_dim 1.
  auto produce_nvfp4_pages = [&](auto& stage, std::int32_t tile_begin) {
    if constexpr (block_scaled) {
      using Vec = Nvfp4VectorGeometry<HeadDim>;
      static_assert(Tile::stage_tokens == Tile::threads, "one token per thread");
      const auto* k_bytes = static_cast<const unsigned char*>(p.k_pages);
      const auto* v_bytes = static_cast<const unsigned char*>(p.v_pages);
      const int token = tid;
      const std::int32_t position = tile_begin + token;
      const std::int32_t page = position < page_end32 ? request_pages[position >> p.page_shift] : -1;
      const bool ok = static_cast<std::uint32_t>(page) < num_pages;
      const std::int32_t in_page = p.layout == KvLayout::nhd ? (position & slot_mask) * p.num_kv_heads + kv_head
                                                             : kv_head * p.page_size + (position & slot_mask);
      const std::int64_t offset =
          ok ? page * page_stride + static_cast<std::int64_t>(in_page) * Vec::vector_bytes : 0;
      const unsigned char* k_src = k_bytes + offset;
      const unsigned char* v_src = v_bytes + offset;
SLIMSERVE_ATTENTION_UNROLL
      for (int piece = 0; piece < Vec::pieces; ++piece) {
        const int byte = piece * Vec::piece_bytes;
        if (piece < Vec::code_pieces) {
          const int dst = Row::byte_offset(token, byte / 16) + byte % 16;
          arch::cp_async_zfill<Vec::piece_bytes>(stage.k + dst, k_src + byte, ok);
          arch::cp_async_zfill<Vec::piece_bytes>(stage.v + dst, v_src + byte, ok);
        } else {
          const int dst = token * Vec::scale_bytes + (byte - Vec::code_bytes);
          arch::cp_async_zfill<Vec::piece_bytes>(stage.block_scales.k + dst, k_src + byte, ok);
          arch::cp_async_zfill<Vec::piece_bytes>(stage.block_scales.v + dst, v_src + byte, ok);
        }
      }
    }
  };

  // Producer: every thread queues its chunks of K and V of tile `i` into stage `i % stages`
  // (one page-id load per chunk; rows of consecutive lanes are consecutive 16-byte chunks).
  auto produce_pages = [&](std::int64_t i) {
    auto& stage = smem.u.stages[i % Tile::stages];
    const auto tile_begin = static_cast<std::int32_t>(kv_begin + i * Tile::stage_tokens);
    if constexpr (block_scaled) {
      produce_nvfp4_pages(stage, tile_begin);
    } else {
SLIMSERVE_ATTENTION_UNROLL
    for (int j = 0; j < Tile::stage_chunks / Tile::threads; ++j) {
      const int chunk_id = tid + j * Tile::threads;
      const int token = chunk_id / Row::row_chunks;
      const int chunk = chunk_id % Row::row_chunks;
      const std::int32_t position = tile_begin + token;
      const std::int32_t page = position < page_end32 ? request_pages[position >> p.page_shift] : -1;
      const bool ok = static_cast<std::uint32_t>(page) < num_pages;
      const std::int64_t offset =
          ok ? page * page_stride + ((position & slot_mask) * slot_stride + head_offset + chunk * Row::chunk_elements) : 0;
      const int dst = Row::byte_offset(token, chunk);
      arch::cp_async_16_zfill(stage.k + dst, k_pages + offset, ok);
      arch::cp_async_16_zfill(stage.v + dst, v_pages + offset, ok);
    }
    }
    if (!all_pages_ok || per_token) {
      if (tid < Tile::stage_tokens) {
        const std::int32_t position = tile_begin + tid;
        const std::int32_t page = position < page_end32 ? page_of(position) : -1;
        {
          float ks = page >= 0 ? 1.0f : NAN, vs = 1.0f;
          if (per_token && page >= 0) {
            const std::int64_t s = cache_offset(p.layout, p.page_size, p.num_kv_heads, 1, page,
                                                position & slot_mask, kv_head, 0);
            ks = p.k_token_scales[s];
            vs = p.v_token_scales[s] * per_token_p_headroom;
          }
          stage.k_token_scale[tid] = ks;
          stage.v_token_scale[tid] = vs;
        }
      }
    }
  };

  // Fused producer of chunk tile `ci` (stage `i % stages`, i = num_page_tiles + ci): the
  // chunk's K/V rows from the inputs (chunk_kv.cuh), zero past kv_end. Column scales undo the
  // cache scale the kernel applies to page columns (per-tensor: 1 / scale; per-token: the P
  // headroom only), so the inputs enter unscaled.
  auto produce_chunk = [&](std::int64_t i) {
    if constexpr (FusedChunk) {
    auto& stage = smem.u.stages[i % Tile::stages];
    const std::int64_t tile_begin = chunk_begin + (i - num_page_tiles) * chunk_tile_tokens;
    const QT* chunk_k = static_cast<const QT*>(p.chunk.k);
    const QT* chunk_v = static_cast<const QT*>(p.chunk.v);
    if constexpr (block_scaled) {
      // A 32-wide group of d (four fp16 chunks) per thread and step, permuted in registers to
      // the NVFP4 fragment order (chunk_kv.cuh). Head_dim 64 has fewer groups than threads.
      constexpr int row_groups = ChunkRow::row_chunks / 4;
      constexpr int groups = Tile::stage_chunks / 4;
      static_assert(ChunkRow::row_chunks % 4 == 0, "whole 32-wide groups");
SLIMSERVE_ATTENTION_UNROLL
      for (int j = 0; j < (groups + Tile::threads - 1) / Tile::threads; ++j) {
        const int group_id = tid + j * Tile::threads;
        if (groups % Tile::threads != 0 && group_id >= groups) break;
        const int token = group_id / row_groups;
        const int group = group_id % row_groups;
        const std::int64_t position = tile_begin + token;
        const bool ok = position < kv_end;
        const std::int64_t row = ok ? (qo_begin + position - chunk_start) * p.chunk.token_stride + kv_head * p.chunk.head_stride : 0;
        unsigned char* const k_dst[4] = {stage.k + ChunkRow::byte_offset(token, 4 * group),
                                         stage.k + ChunkRow::byte_offset(token, 4 * group + 1),
                                         stage.k + ChunkRow::byte_offset(token, 4 * group + 2),
                                         stage.k + ChunkRow::byte_offset(token, 4 * group + 3)};
        unsigned char* const v_dst[4] = {stage.v + ChunkRow::byte_offset(token, 4 * group),
                                         stage.v + ChunkRow::byte_offset(token, 4 * group + 1),
                                         stage.v + ChunkRow::byte_offset(token, 4 * group + 2),
                                         stage.v + ChunkRow::byte_offset(token, 4 * group + 3)};
        stage_nvfp4_order_group<QT, false>(k_dst, chunk_k + row + 32 * group, ok, 1.0f);
        stage_nvfp4_order_group<QT, true>(v_dst, chunk_v + row + 32 * group, ok, chunk_v_shift);
      }
    } else if constexpr (fp8) {
      // A 16-wide group of d (two chunks of the mma type) per thread and step: converted and
      // permuted in registers (chunk_kv.cuh).
      constexpr int row_groups = ChunkRow::row_chunks / 2;
      static_assert(ChunkRow::row_chunks % 2 == 0 && (Tile::stage_chunks / 2) % Tile::threads == 0,
                    "whole 16-wide groups per thread");
SLIMSERVE_ATTENTION_UNROLL
      for (int j = 0; j < Tile::stage_chunks / 2 / Tile::threads; ++j) {
        const int group_id = tid + j * Tile::threads;
        const int token = group_id / row_groups;
        const int group = group_id % row_groups;
        const std::int64_t position = tile_begin + token;
        const bool ok = position < kv_end;
        const std::int64_t row = ok ? (qo_begin + position - chunk_start) * p.chunk.token_stride + kv_head * p.chunk.head_stride : 0;
        const int dst_lo = ChunkRow::byte_offset(token, 2 * group);
        const int dst_hi = ChunkRow::byte_offset(token, 2 * group + 1);
        stage_fp8_order_group<QT, false>(stage.k + dst_lo, stage.k + dst_hi, chunk_k + row + 16 * group, ok);
        stage_fp8_order_group<QT, true>(stage.v + dst_lo, stage.v + dst_hi, chunk_v + row + 16 * group, ok);
      }
    } else {
SLIMSERVE_ATTENTION_UNROLL
      for (int j = 0; j < Tile::stage_chunks / Tile::threads; ++j) {
        const int chunk_id = tid + j * Tile::threads;
        const int token = chunk_id / ChunkRow::row_chunks;
        const int chunk = chunk_id % ChunkRow::row_chunks;
        const std::int64_t position = tile_begin + token;
        const bool ok = position < kv_end;
        const std::int64_t row = ok ? (qo_begin + position - chunk_start) * p.chunk.token_stride + kv_head * p.chunk.head_stride : 0;
        const int dst = ChunkRow::byte_offset(token, chunk);
        arch::cp_async_16_zfill(stage.k + dst, chunk_k + row + chunk * ChunkRow::chunk_elements, ok);
        arch::cp_async_16_zfill(stage.v + dst, chunk_v + row + chunk * ChunkRow::chunk_elements, ok);
      }
    }
    if (tid < chunk_tile_tokens) {
      const bool tensor_scaled = p.scale_mode == KvScaleMode::per_tensor;
      stage.k_token_scale[tid] = tensor_scaled ? 1.0f / k_static : 1.0f;
      if constexpr (block_scaled) {
        stage.v_token_scale[tid] = chunk_p_factor;  // V carries the power of two (chunk_kv.cuh)
      } else {
        stage.v_token_scale[tid] = tensor_scaled ? 1.0f / v_static : (per_token ? per_token_p_headroom : 1.0f);
      }
    }
    }
  };
  auto produce = [&](std::int64_t i) {
    if constexpr (FusedChunk) {
      if (i >= num_page_tiles) {
        produce_chunk(i);
        return;
      }
    }
    produce_pages(i);
  };

  // Consumer: this warp's sub-blocks of a tile of `tile_tokens` tokens whose rows have the
  // geometry of `Elem` (the stored type for page tiles, the mma type for chunk tiles);
  // positions from tile_end on are masked.
  auto consume_tile = [&](auto elem_tag, const auto& stage, std::int64_t tile_begin, int tile_tokens,
                          std::int64_t tile_end, bool tile_pages_ok, bool column_scales) {
    using Elem = typename decltype(elem_tag)::type;
    using TileRow = KvRowGeometry<Elem, HeadDim>;
    for (int sub = wn; sub < Tile::warps; sub += warps_n) {
      const int row0 = sub * Tile::warp_tokens;
      const std::int64_t block_begin = tile_begin + row0;
      if (row0 >= tile_tokens || block_begin >= tile_end) break;  // warp-uniform: nothing left
      const std::int64_t block_last = block_begin + Tile::warp_tokens - 1;
      const bool needs_mask = !tile_pages_ok || block_last >= tile_end ||
                              (p.causal && block_last > min_query) ||
                              (windowed && block_begin < max_query - p.window_left);

      float s[Tile::score_tiles][4];
SLIMSERVE_ATTENTION_UNROLL
      for (int n = 0; n < Tile::score_tiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
SLIMSERVE_ATTENTION_UNROLL
      for (int m = 0; m < Tile::warp_tokens / 16; ++m) {
SLIMSERVE_ATTENTION_UNROLL
        for (int c = 0; c < TileRow::row_chunks; c += 2) {
          if constexpr (block_scaled && std::is_same_v<Elem, KvT>) {  // page tiles; chunk tiles are fp16
            nvfp4_qk_chunk_pair<HeadDim>(s[2 * m], s[2 * m + 1], stage.k, stage.block_scales.k, row0 + 16 * m, c,
                                         q_frag, lane);
          } else {
            qk_chunk_pair<Elem, HeadDim>(s[2 * m], s[2 * m + 1], stage.k, row0 + 16 * m, c, q_frag, lane);
          }
        }
      }

      // The tokens' metadata, loaded before the variants so that they hold no shared loads.
      float column_k_scale[Tile::score_tiles][2], column_v_scale[Tile::score_tiles][2];
SLIMSERVE_ATTENTION_UNROLL
      for (int n = 0; n < Tile::score_tiles; ++n) {
SLIMSERVE_ATTENTION_UNROLL
        for (int c = 0; c < 2; ++c) {
          column_k_scale[n][c] = stage.k_token_scale[row0 + 8 * n + 2 * t + c];
          column_v_scale[n][c] = stage.v_token_scale[row0 + 8 * n + 2 * t + c];
        }
      }
      // Softmax of the block, compiled once per (masked, soft-capped, per-token) so the common
      // case (unmasked, no cap) has no per-element branches.
      std::uint32_t p_frag[Tile::warp_tokens / 16][4];
      auto softmax = [&](auto masked_tag, auto capped_tag, auto per_token_tag) {
        constexpr bool masked = decltype(masked_tag)::value;
        constexpr bool capped = decltype(capped_tag)::value;
        constexpr bool scaled_tokens = decltype(per_token_tag)::value;
        // Scores in log2 units, masked; new row maxima.
        float block_max[2] = {-INFINITY, -INFINITY};
SLIMSERVE_ATTENTION_UNROLL
        for (int n = 0; n < Tile::score_tiles; ++n) {
SLIMSERVE_ATTENTION_UNROLL
          for (int e = 0; e < 4; ++e) {
            const int column = row0 + 8 * n + 2 * t + (e & 1);  // token row in the stage
            const int half = e >> 1;
            float x = s[n][e];
            if constexpr (scaled_tokens) x *= column_k_scale[n][e & 1];
            if constexpr (capped) {
              x = cap_out * tanhf(x * cap_in);
            } else {
              x *= score_scale;
            }
            if constexpr (masked) {
              const std::int64_t position = tile_begin + column;
              bool visible = row_valid[half] && position < tile_end && (tile_pages_ok || !std::isnan(column_k_scale[n][e & 1]));
              if (p.causal) visible = visible && position <= query_position[half];
              if (windowed) visible = visible && position >= query_position[half] - p.window_left;
              if (!visible) x = -INFINITY;
            }
            s[n][e] = x;
            block_max[half] = fmaxf(block_max[half], x);
          }
        }
        bool rescale = false;
        float alpha[2];
        float base[2];
SLIMSERVE_ATTENTION_UNROLL
        for (int half = 0; half < 2; ++half) {
          float mx = block_max[half];
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float new_max = fmaxf(row_max[half], mx);
          base[half] = new_max == -INFINITY ? 0.0f : new_max;  // all masked so far: p = 0
          alpha[half] = fast_exp2(row_max[half] - base[half]);  // 0 before the first token
          rescale = rescale || new_max != row_max[half];
          row_max[half] = new_max;
          row_sum[half] *= alpha[half];
        }
        if (__any_sync(0xffffffffu, rescale)) {
SLIMSERVE_ATTENTION_UNROLL
          for (int n = 0; n < Tile::output_tiles; ++n) {
            o_acc[n][0] *= alpha[0];
            o_acc[n][1] *= alpha[0];
            o_acc[n][2] *= alpha[1];
            o_acc[n][3] *= alpha[1];
          }
        }
        // P = exp2(s - max), summed in FP32, rounded to the mma type in A-fragment order.
SLIMSERVE_ATTENTION_UNROLL
        for (int n = 0; n < Tile::score_tiles; ++n) {
          float pr[4];
SLIMSERVE_ATTENTION_UNROLL
          for (int e = 0; e < 4; ++e) {
            pr[e] = fast_exp2(s[n][e] - base[e >> 1]);
            row_sum[e >> 1] += pr[e];
            if constexpr (scaled_tokens) pr[e] *= column_v_scale[n][e & 1];
          }
          // Score tile n = 2 k + j holds tokens 8 j.. of k step k: a[2j] (row g), a[2j + 1] (g + 8).
          p_frag[n >> 1][2 * (n & 1)] = pack_pair<MmaT>(pr[0], pr[1]);
          p_frag[n >> 1][2 * (n & 1) + 1] = pack_pair<MmaT>(pr[2], pr[3]);
        }
      };
      using yes = std::true_type;
      using no = std::false_type;
      if (needs_mask || soft_capped || column_scales) {
        if (soft_capped) {
          if (column_scales) softmax(yes{}, yes{}, yes{}); else softmax(yes{}, yes{}, no{});
        } else {
          if (column_scales) softmax(yes{}, no{}, yes{}); else softmax(yes{}, no{}, no{});
        }
      } else {
        softmax(no{}, no{}, no{});  // the steady state of plain decode and prefill
      }
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < Tile::warp_tokens / 16; ++k) {
SLIMSERVE_ATTENTION_UNROLL
        for (int c = 0; c < TileRow::row_chunks; c += 2) {
          if constexpr (block_scaled && std::is_same_v<Elem, KvT>) {
            nvfp4_pv_chunk_pair<HeadDim>(o_acc, stage.v, stage.block_scales.v, row0 + 16 * k, c, p_frag[k], lane);
          } else {
            pv_chunk_pair<Elem, HeadDim>(o_acc, stage.v, row0 + 16 * k, c, p_frag[k], lane);
          }
        }
      }
    }
  };
  auto consume = [&](std::int64_t i) {
    const auto& stage = smem.u.stages[i % Tile::stages];
    if constexpr (FusedChunk) {
      if (i >= num_page_tiles) {
        consume_tile(std::type_identity<MmaT>{}, stage, chunk_begin + (i - num_page_tiles) * chunk_tile_tokens,
                     chunk_tile_tokens, kv_end, true, p.scale_mode != KvScaleMode::none);
        return;
      }
    }
    consume_tile(std::type_identity<KvT>{}, stage, kv_begin + i * Tile::stage_tokens, Tile::stage_tokens,
                 page_end, all_pages_ok, per_token);
  };

  // Pipeline: stages - 1 tiles in flight ahead of the one being consumed.
SLIMSERVE_ATTENTION_UNROLL
  for (int i = 0; i < Tile::stages - 1; ++i) {
    if (i < num_tiles) produce(i);
    arch::cp_async_commit();
  }
  for (std::int64_t i = 0; i < num_tiles; ++i) {
    arch::cp_async_wait<Tile::stages - 2>();
    __syncthreads();  // tile i is visible to all; tile i - 1 is consumed by all
    if (i + Tile::stages - 1 < num_tiles) produce(i + Tile::stages - 1);
    arch::cp_async_commit();
    consume(i);
  }
  arch::cp_async_wait<0>();

  // Row sums over the quad's columns.
SLIMSERVE_ATTENTION_UNROLL
  for (int half = 0; half < 2; ++half) {
    row_sum[half] += __shfl_xor_sync(0xffffffffu, row_sum[half], 1);
    row_sum[half] += __shfl_xor_sync(0xffffffffu, row_sum[half], 2);
  }
  __syncthreads();  // the stages are dead; the epilogue overlays them
  auto& epi = smem.u.epilogue;
  {
    const int partial_row0 = wn * p.cta_rows + wm * 16 + g;
SLIMSERVE_ATTENTION_UNROLL
    for (int n = 0; n < Tile::output_tiles; ++n) {
SLIMSERVE_ATTENTION_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int column = block_scaled ? nvfp4_output_column(n, t, e) : output_column<fp8>(n, t, e);
        epi.o[(partial_row0 + 8 * (e >> 1)) * HeadDim + column] = o_acc[n][e];
      }
    }
    if (t == 0) {
      epi.m[partial_row0] = row_max[0];
      epi.l[partial_row0] = row_sum[0];
      epi.m[partial_row0 + 8] = row_max[1];
      epi.l[partial_row0 + 8] = row_sum[1];
    }
  }
  __syncthreads();

  // Each thread finishes 8 consecutive d of one row.
  const float out_scale = per_token ? 1.0f / per_token_p_headroom : v_static;
  constexpr int row_pieces = HeadDim / 8;
  for (int unit = tid; unit < p.cta_rows * row_pieces; unit += Tile::threads) {
    const int r = unit / row_pieces;
    const int d0 = (unit % row_pieces) * 8;
    const std::int64_t packed = tile_row0 + r;
    const bool skipped = packed >= valid_rows && !p.split_kv;
    // Rotated: the row's D / 8 threads (consecutive, aligned: unit % row_pieces == tid %
    // row_pieces) shuffle together below, so a skipped row leaves only after that.
    if constexpr (!Rotated) {
      if (skipped) continue;
    }
    float m = -INFINITY;
    for (int w = 0; w < warps_n; ++w) m = fmaxf(m, epi.m[w * p.cta_rows + r]);
    const std::int64_t head = static_cast<std::int64_t>(kv_head) * p.group_size + packed % p.group_size;
    // Sinks count once: here when unsplit, in the merge when split.
    const float sink = (!p.split_kv && p.sinks != nullptr) ? p.sinks[head] * paged_log2_e : -INFINITY;
    const float top = fmaxf(m, sink);
    // top is -inf for a row that saw nothing, and for one whose every score was NaN (the
    // running max drops them): base 0 then gives weight 0, and 0 x a NaN sum keeps it NaN.
    const float base = top == -INFINITY ? 0.0f : top;
    float sum = exp2f(sink - base);
    float out[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int w = 0; w < warps_n; ++w) {
      const int pr = w * p.cta_rows + r;
      const float weight = exp2f(epi.m[pr] - base);  // 0 for a part that saw nothing
      sum += weight * epi.l[pr];
SLIMSERVE_ATTENTION_UNROLL
      for (int e = 0; e < 8; ++e) out[e] = fmaf(weight, epi.o[pr * HeadDim + d0 + e], out[e]);
    }
    if constexpr (Rotated) {
      // V was stored rotated: rotate the row back (8 consecutive d a thread, hadamard.cuh's
      // layout), before the norm (a per-row factor) and before a split partial is written:
      // the merge's weighted sum of rotated partials is the rotated merge (the map is linear),
      // and the lse, from the unchanged scores, is the same.
      if (rotates_values(p.rotation)) hadamard_rotate<HeadDim>(out);
      if (skipped) continue;
    }
    const bool empty = sum == 0.0f;  // a NaN sum (a NaN key read) is not empty: NaN row and lse
    float norm = empty ? 0.0f : out_scale / sum;
    float lse = empty ? -INFINITY : (top + log2f(sum)) * paged_ln_2;
    if constexpr (block_scaled) {
      // NaN scores are dropped by the running max (fmaxf), which would leave an invalid K
      // tensor scale looking like "nothing visible": mark the rows NaN instead.
      if (std::isnan(k_static)) norm = lse = NAN;
    }
    if (p.split_kv) {
      const std::int64_t partial_row = (static_cast<std::int64_t>(work) * p.num_kv_heads + kv_head) * p.cta_rows + r;
      float* po = p.partial_o + partial_row * HeadDim + d0;
      Vec16 lo, hi;
      float a[4] = {out[0] * norm, out[1] * norm, out[2] * norm, out[3] * norm};
      float c[4] = {out[4] * norm, out[5] * norm, out[6] * norm, out[7] * norm};
      std::memcpy(&lo, a, sizeof(a));
      std::memcpy(&hi, c, sizeof(c));
      store16(po, lo);
      store16(po + 4, hi);
      if (d0 == 0) p.partial_lse[partial_row] = packed < valid_rows ? lse : -INFINITY;
    } else {
      const std::int64_t token = qo_begin + packed / p.group_size;
      QT values[8];
SLIMSERVE_ATTENTION_UNROLL
      for (int e = 0; e < 8; ++e) values[e] = from_float<QT>(out[e] * norm);
      QT* o = static_cast<QT*>(p.o) + token * p.o_token_stride + head * p.o_head_stride + d0;
      store_packed(o, values);
      if (p.lse != nullptr && d0 == 0) p.lse[token * p.num_qo_heads + head] = lse;
    }
  }
}

template <class KvT, class QT, int HeadDim>
__global__ void __launch_bounds__(128, (PagedAttentionTile<KvT, HeadDim>::min_ctas_per_sm))
    paged_attention_kernel(const PagedAttentionParams p) {
  paged_attention_body<KvT, QT, HeadDim, false>(p);
}

/// Attention over a cache appended with a rotation (p.rotation keys or keys_and_values):
/// head_dim 64, 128 or 256 (RotationHeadDims).
template <class KvT, class QT, int HeadDim>
__global__ void __launch_bounds__(128, (PagedAttentionTile<KvT, HeadDim>::min_ctas_per_sm))
    paged_attention_rotated_kernel(const PagedAttentionParams p) {
  paged_attention_body<KvT, QT, HeadDim, false, true>(p);
}

/// Fused (mixed-dtype) prefill: the chunk attends to its own K/V from the inputs and writes
/// them into its page slots (chunk_kv.cuh).
template <class KvT, class QT, int HeadDim>
__global__ void __launch_bounds__(128, (PagedAttentionTile<KvT, HeadDim>::min_ctas_per_sm))
    paged_prefill_fused_kernel(const PagedAttentionParams p) {
  paged_attention_body<KvT, QT, HeadDim, true>(p);
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
