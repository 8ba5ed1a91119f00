#pragma once
/// \file
/// \brief Paged prefill on sm_90a wgmma, warp-specialized (FlashAttention-3's CTA shape): a
/// producer warpgroup streams K/V into a ring of shared-memory slots, two consumer warpgroups
/// run the same 64 packed rows over alternate 64-token tiles in ping-pong, so that one's
/// softmax runs while the other's products are on the tensor cores. Same parameters, schedule
/// (the plan's 64-row work items, warps_m = 4), results and tolerances as the one-warpgroup
/// kernel (paged_prefill_wgmma_kernel), which stays selectable
/// (PagedAttentionPlanArguments::wgmma_kernel).
///
/// CTA: 384 threads, one CTA per SM (about 200 KB of shared memory).
///   warpgroup 0, producer (setmaxnreg.dec to 48): cp.async of tile i (page-table gather: a
///     thread's run of 8 tokens (FP8: 4) takes one page-id load when it lies in one page, else
///     one per token; zero-filled past the end) into slot i % slots; 16-bit caches straight into the
///     128B-swizzled wgmma tiles, FP8 caches the raw codes. `lookahead` tiles stay in flight
///     behind the one it hands over: cp.async.wait_group, fence.proxy.async, then bar.arrive
///     on the slot's "full" barrier; before refilling a slot it bar.syncs on its "empty" one.
///   warpgroups 1, 2, consumers c = 0, 1 (setmaxnreg.inc to 232): consumer c takes tiles
///     c, c + 2, ...; Q fragments in registers (A from registers) in both. Per tile, one
///     block of tensor work: O += P V of its previous tile and S = Q K^T of this one, issued
///     together between the two "schedule" barriers (c waits for the other's block to be
///     issued, then lets the other go once its own is), committed, waited; then the online
///     softmax of S (prefill_tile_softmax.cuh) while the other consumer's block runs.
///     FP8: the consumer widens its tile's codes (cvt.f16x2.e4m3x2, exact) into its own fp16
///     K tile and one of two V tiles (V is read one block later) and frees the raw slot at once.
///   epilogue (prefill_pingpong_epilogue.cuh): consumer 1 hands its running state to consumer
///     0 through shared memory, which merges the two and writes the rows.
/// Why not mbarriers: the slots' full/empty hand-over is one named barrier per slot and
/// direction (bar.arrive from the side that is done, bar.sync on the side that waits), which
/// the emulator checks and orders for TSan; the ids fit (16-bit: 6 slots, 15 ids).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "slimserve/arch/cp_async.cuh"
#include "slimserve/arch/named_barrier.cuh"
#include "slimserve/arch/wgmma.cuh"
#include "slimserve/arch/wgmma_tile.cuh"
#include "slimserve/attention/kernels/paged_attention_kernel.cuh"
#include "slimserve/attention/kernels/paged_prefill_wgmma_kernel.cuh"
#include "slimserve/attention/kernels/prefill_pingpong_epilogue.cuh"
#include "slimserve/attention/kernels/prefill_q_fragments.cuh"
#include "slimserve/attention/kernels/prefill_tile_softmax.cuh"
#include "slimserve/runtime/shared_memory.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

template <class KvT, int HeadDim>
struct PagedPingPongTile {
  using MmaT = mma_input_t<KvT>;
  static constexpr bool fp8 = fp8_format<KvT>;
  static constexpr int warpgroup_threads = 128;
  static constexpr int consumers = 2;
  static constexpr int threads = (1 + consumers) * warpgroup_threads;
  static constexpr int rows = 64;  // one wgmma M; the plan's cta_rows at warps_m = 4
  static constexpr int stage_tokens = 64;
  // Ring slots and the producer's cp.async groups in flight behind the one it hands over.
  // 16-bit: a consumer frees a slot only after the next block (its V is read there), so the
  // producer may run `slots - 3` tiles ahead; FP8 frees the raw slot once widened.
  static constexpr int slots = fp8 ? 4 : 6;
  static constexpr int lookahead = fp8 ? 2 : 3;
  static_assert(slots % consumers == 0, "each consumer owns the slots of its tiles");
  static_assert(fp8 ? lookahead <= slots - 1 : lookahead <= slots - 3, "the producer never waits on itself");
  static constexpr int producer_registers = 48;
  static constexpr int consumer_registers = 232;
  static_assert(warpgroup_threads * (producer_registers + consumers * consumer_registers) <= 65536,
                "the register file holds the three warpgroups after setmaxnreg");
  static constexpr int k_steps = HeadDim / 16;           // Q fragments, S chain length
  static constexpr int token_steps = stage_tokens / 16;  // P fragments, O chain length
  static constexpr int score_values = stage_tokens / 2;  // S accumulator (m64n64) per thread
  static constexpr int output_values = HeadDim / 2;      // O accumulator (m64nD) per thread
  using KvTile = arch::WgmmaTile128B<stage_tokens, HeadDim>;  // [tokens][HeadDim] in MmaT
  static_assert(HeadDim % 64 == 0 && HeadDim <= 256, "wgmma N <= 256 in 128-byte atoms");
  static constexpr int raw_row_chunks = HeadDim / 16;                      // FP8: 16 codes a chunk
  static constexpr int raw_stage_chunks = stage_tokens * raw_row_chunks;  // per K (and V)
  static constexpr std::uint32_t raw_tile_bytes = stage_tokens * HeadDim;  // FP8 codes of K (or V)
  static constexpr std::uint32_t slot_bytes = fp8 ? 2 * raw_tile_bytes : 2 * KvTile::bytes;
  // FP8: per consumer its widened K tile and two V tiles.
  static constexpr int converted_tiles = fp8 ? consumers * 3 : 0;
  static constexpr std::uint32_t converted_offset = 0;
  static constexpr std::uint32_t ring_offset = converted_offset + converted_tiles * KvTile::bytes;
  static constexpr std::uint32_t kv_bytes = ring_offset + slots * slot_bytes;
  static constexpr int mask_words = stage_tokens / 32;
  static_assert(KvTile::bytes % 1024 == 0 && slot_bytes % 1024 == 0);

  // Named barrier ids (0 is __syncthreads').
  SLIMSERVE_HOST_DEVICE static constexpr std::uint32_t schedule_barrier(int consumer) { return 1u + static_cast<std::uint32_t>(consumer); }
  SLIMSERVE_HOST_DEVICE static constexpr std::uint32_t full_barrier(int slot) { return 3u + static_cast<std::uint32_t>(slot); }
  SLIMSERVE_HOST_DEVICE static constexpr std::uint32_t empty_barrier(int slot) { return 3u + slots + static_cast<std::uint32_t>(slot); }
  SLIMSERVE_HOST_DEVICE static constexpr std::uint32_t convert_barrier(int consumer) { return 3u + 2 * slots + static_cast<std::uint32_t>(consumer); }
  static constexpr std::uint32_t merge_barrier = 3u + 2 * slots + (fp8 ? consumers : 0);
  static_assert(merge_barrier <= 15, "16 named barriers");
  static constexpr std::uint32_t pair_threads = 2 * warpgroup_threads;  // the producer or a consumer + a consumer
};

/// The CTA's shared memory; the launch size is its sizeof. `kv` comes first: its tiles need
/// 1024-byte alignment, which the dynamic shared memory base has on the GPU when the kernel
/// has no static shared memory (offsets inside are multiples of 1024).
template <class KvT, int HeadDim>
struct PagedPingPongSharedStorage {
  using Tile = PagedPingPongTile<KvT, HeadDim>;
  unsigned char kv[Tile::kv_bytes];                          // FP8: [consumers][K, V0, V1] widened; then the ring
  std::uint32_t token_ok[Tile::slots][Tile::mask_words];     // per slot, bit c: token c has a valid page id
  PrefillMergeExchange<Tile::output_values> merge;           // consumer 1's state for consumer 0
};

template <class KvT, class QT, int HeadDim>
__global__ void __launch_bounds__(384, 1) paged_prefill_pingpong_kernel(const PagedAttentionParams p) {
  using Tile = PagedPingPongTile<KvT, HeadDim>;
  using Smem = PagedPingPongSharedStorage<KvT, HeadDim>;
  using MmaT = typename Tile::MmaT;
  using KvTile = typename Tile::KvTile;
  constexpr bool fp8 = Tile::fp8;
  static_assert(Tile::threads == 384 && offsetof(Smem, kv) == 0);
  Smem& smem = rt::shared_storage<Smem>();
  const std::uint32_t smem_base = arch::wgmma_shared_address(smem.kv);

  const int tid = static_cast<int>(threadIdx.x);
  const int warpgroup = tid / Tile::warpgroup_threads;
  const int i_wg = tid % Tile::warpgroup_threads;  // index in the warpgroup
  const int lane = tid % 32;

  // Work item and KV head: as paged_prefill_wgmma_kernel (launch order = the plan's
  // longest-first order across all heads).
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
    // Nothing of the request is read; NaN rows, lse -inf (split: partial lse NaN, which the
    // merge turns into the same marked rows).
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
  // Tile indices, slots and positions in 32 bits (kv_len <= INT32_MAX): the 64-bit forms cost
  // the producer and consumer loops a 64-bit modulo and compare per tile, and FP8's consumers
  // the registers they spilled.
  const auto num_tiles = static_cast<std::int32_t>((kv_end - kv_begin + Tile::stage_tokens - 1) / Tile::stage_tokens);

  // [pages of the request]; one pass over the range's page ids by all 384 threads: the common
  // case (all valid) skips the per-token flags.
  const std::int32_t* request_pages = located_request_pages(p, b);
  int bad_page = 0;
  {
    const std::int64_t first_page = kv_begin >> p.page_shift;
    const std::int64_t end_page = kv_end > kv_begin ? ((kv_end - 1) >> p.page_shift) + 1 : first_page;
#if defined(__CUDACC__)
#pragma unroll 1
#endif
    for (std::int64_t i = first_page + tid; i < end_page; i += Tile::threads) {
      const std::int32_t page = request_pages[i];
      if (page < 0 || page >= p.num_pages) bad_page = 1;
    }
  }
  const bool all_pages_ok = __syncthreads_or(bad_page) == 0;

  if (warpgroup == 0) {
    // ---- producer -------------------------------------------------------------------------
    arch::set_max_registers_dec<Tile::producer_registers>();
    const KvT* k_pages = static_cast<const KvT*>(p.k_pages);
    const KvT* v_pages = static_cast<const KvT*>(p.v_pages);
    const std::int64_t page_stride = p.page_stride;
    const std::int32_t slot_stride = p.layout == KvLayout::nhd ? p.num_kv_heads * HeadDim : HeadDim;
    const std::int32_t head_offset = p.layout == KvLayout::nhd ? kv_head * HeadDim : kv_head * p.page_size * HeadDim;
    const std::int32_t slot_mask = p.page_size - 1;
    const auto num_pages = static_cast<std::uint32_t>(p.num_pages);
    const auto kv_end32 = static_cast<std::uint32_t>(kv_end);
    // Thread i_wg copies 16-byte column `chunk` of the tile's tokens first .. first + group - 1
    // of K and V.
    constexpr int row_chunks = fp8 ? Tile::raw_row_chunks : HeadDim / 8;
    constexpr int group = Tile::stage_tokens * row_chunks / Tile::warpgroup_threads;  // tokens per thread
    static_assert(Tile::warpgroup_threads % row_chunks == 0 && Tile::stage_tokens % group == 0);
    const int chunk = i_wg % row_chunks;
    const int first = (i_wg / row_chunks) * group;
    constexpr int chunk_elements = 16 / static_cast<int>(sizeof(KvT));
    // A thread's run lies in one page when pages hold whole runs and the range starts on a run
    // (the common case): one page-id load per thread and tile, the tokens a slot stride apart.
    const bool runs_in_a_page = p.page_size >= group && (kv_begin % group) == 0;
    // Tiles before `whole_tiles` lie inside the range: their tokens need no end check.
    const auto whole_tiles = static_cast<std::int32_t>((kv_end - kv_begin) / Tile::stage_tokens);
    const auto kv_begin32 = static_cast<std::uint32_t>(kv_begin);
    int slot = 0;        // of tile i
    int ready_slot = 0;  // of tile i - lookahead
    for (std::int32_t i = 0; i < num_tiles + Tile::lookahead; ++i) {
      if (i < num_tiles) {
        if (i >= Tile::slots) arch::named_barrier_sync(Tile::empty_barrier(slot), Tile::pair_threads);
        // unsigned: a tile's last token may lie past INT32_MAX when the range ends near it
        const std::uint32_t tile_begin = kv_begin32 + static_cast<std::uint32_t>(i) * Tile::stage_tokens;
        unsigned char* k_dst = smem.kv + Tile::ring_offset + slot * Tile::slot_bytes;
        unsigned char* v_dst = k_dst + Tile::slot_bytes / 2;
        auto destination = [&](int token) -> std::uint32_t {
          return fp8 ? static_cast<std::uint32_t>(token * HeadDim + 16 * chunk) : KvTile::chunk_offset(token, chunk);
        };
        const std::uint32_t position0 = tile_begin + static_cast<std::uint32_t>(first);
        if (runs_in_a_page) {
          const std::int32_t page = position0 < kv_end32 ? request_pages[position0 >> p.page_shift] : -1;
          const bool page_ok = static_cast<std::uint32_t>(page) < num_pages;
          const std::int64_t offset =
              page_ok ? page * page_stride + ((static_cast<std::int32_t>(position0) & slot_mask) * slot_stride + head_offset + chunk * chunk_elements) : 0;
          const KvT* k_src = k_pages + offset;
          const KvT* v_src = v_pages + offset;
          auto copy_run = [&](auto whole_tag) {
SLIMSERVE_ATTENTION_UNROLL
            for (int j = 0; j < group; ++j) {
              const bool ok = page_ok && (decltype(whole_tag)::value || position0 + j < kv_end32);
              arch::cp_async_16_zfill(k_dst + destination(first + j), k_src + j * slot_stride, ok);
              arch::cp_async_16_zfill(v_dst + destination(first + j), v_src + j * slot_stride, ok);
            }
          };
          if (i < whole_tiles) {
            copy_run(std::true_type{});  // the steady state
          } else {
            copy_run(std::false_type{});
          }
        } else {
SLIMSERVE_ATTENTION_UNROLL
          for (int j = 0; j < group; ++j) {
            const std::uint32_t position = position0 + j;
            const std::int32_t page = position < kv_end32 ? request_pages[position >> p.page_shift] : -1;
            const bool ok = static_cast<std::uint32_t>(page) < num_pages;
            const std::int64_t offset =
                ok ? page * page_stride + ((static_cast<std::int32_t>(position) & slot_mask) * slot_stride + head_offset + chunk * chunk_elements) : 0;
            arch::cp_async_16_zfill(k_dst + destination(first + j), k_pages + offset, ok);
            arch::cp_async_16_zfill(v_dst + destination(first + j), v_pages + offset, ok);
          }
        }
        if (i_wg < Tile::stage_tokens) {  // whole warps
          bool token_ok = true;
          if (!all_pages_ok) {
            const std::uint32_t position = tile_begin + static_cast<std::uint32_t>(i_wg);
            const std::int32_t page = position < kv_end32 ? request_pages[position >> p.page_shift] : -1;
            token_ok = static_cast<std::uint32_t>(page) < num_pages;
          }
          const std::uint32_t bits = __ballot_sync(0xffffffffu, token_ok);
          if (lane == 0) smem.token_ok[slot][i_wg / 32] = bits;
        }
        slot = slot + 1 == Tile::slots ? 0 : slot + 1;
      }
      arch::cp_async_commit();
      arch::cp_async_wait<Tile::lookahead>();
      if (i >= Tile::lookahead) {  // tile i - lookahead (< num_tiles) has landed
        arch::fence_proxy_async_shared();  // the tiles are read by wgmma next
        arch::named_barrier_arrive(Tile::full_barrier(ready_slot), Tile::pair_threads);
        ready_slot = ready_slot + 1 == Tile::slots ? 0 : ready_slot + 1;
      }
    }
    return;
  }

  // ---- consumers ----------------------------------------------------------------------------
  arch::set_max_registers_inc<Tile::consumer_registers>();
  const int consumer = warpgroup - 1;
  const int w = i_wg / 32;  // warp of the warpgroup: rows 16 w ..
  const int g = lane / 4;
  const int t = lane % 4;

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

  PrefillRowState<Tile::output_values> state;
  state.clear();

  // This consumer's tiles c, c + 2, ...: one block of tensor work per tile and one more for
  // the last tile's P V. The blocks of the two consumers alternate (0, 1, 0, 1, ...) while
  // both have some.
  const std::int32_t own_tiles = (num_tiles - consumer + 1) / 2;
  const std::int32_t other_tiles = (num_tiles - (1 - consumer) + 1) / 2;
  const std::int32_t own_blocks = own_tiles > 0 ? own_tiles + 1 : 0;
  const std::int32_t other_blocks = other_tiles > 0 ? other_tiles + 1 : 0;
  const PrefillPlainTiles<Tile::stage_tokens> plain(kv_begin, kv_end, min_query, max_query, p.causal, windowed,
                                                    p.window_left, all_pages_ok);
  // Uniform across the warpgroup; read from lane 0 so that the compiler knows it and keeps the
  // FP8 descriptors in uniform registers, as the 16-bit slots' (see `block`): without it the
  // consumer path is 0.9 w-i/16B longer.
  const std::uint32_t converted =
      __shfl_sync(0xffffffffu, smem_base + Tile::converted_offset + static_cast<std::uint32_t>(consumer) * 3u * KvTile::bytes, 0);

  std::uint32_t p_frag[Tile::token_steps][4];  // P of the previous tile, read by the next block
  std::uint32_t v_previous = 0;                // shared address of the previous tile's V
  std::int32_t previous_tile = -1;
  int slot = consumer;  // of this consumer's next tile (its tiles' slots: consumer, consumer + 2, ...)
  int previous_slot = 0;

  // FP8: widen the slot's codes (each once) into this consumer's K tile and V tile `v_index`.
  // Thread i_wg widens 16-code chunk i_wg % raw_row_chunks of tokens i_wg / raw_row_chunks
  // + widen_tokens j (pass j) of K and of V. widen_tokens is a multiple of 8: a pass lies
  // widen_raw_step bytes on in the raw tile and widen_wide_step on in the 128B-swizzled tile
  // (whole 8-row groups, the same swizzle phase), so every address is a per-thread base
  // plus a constant. Indexing each unit by its own number (div/mod, swizzle) made a trip 89
  // instructions, not 41. One pass (a K and a V unit) per trip, not all
  // of them: fully unrolled, the compiler hoisted every shared load (32 registers of codes,
  // 64 of halves) over the live O, Q and P fragments, which spilled 63-68 values.
  constexpr int widen_tokens = Tile::warpgroup_threads / Tile::raw_row_chunks;
  constexpr int widen_passes = Tile::stage_tokens / widen_tokens;
  static_assert(Tile::warpgroup_threads % Tile::raw_row_chunks == 0 && widen_tokens % 8 == 0 &&
                    Tile::stage_tokens % widen_tokens == 0,
                "a widening pass covers whole 8-token swizzle groups");
  constexpr std::uint32_t widen_raw_step = static_cast<std::uint32_t>(widen_tokens) * HeadDim;
  constexpr std::uint32_t widen_wide_step = KvTile::chunk_offset(widen_tokens, 0);
  const int widen_token = i_wg / Tile::raw_row_chunks;
  const int widen_chunk = i_wg % Tile::raw_row_chunks;
  const std::uint32_t widen_raw = 16u * static_cast<std::uint32_t>(i_wg);  // widen_token * HeadDim + 16 widen_chunk
  const std::uint32_t widen_wide0 = KvTile::chunk_offset(widen_token, 2 * widen_chunk);
  const std::uint32_t widen_wide1 = KvTile::chunk_offset(widen_token, 2 * widen_chunk + 1);
  // 16 codes at `raw` -> 16 halves at wide + widen_wide0 (the first 8) and + widen_wide1.
  auto widen16 = [&](const unsigned char* raw, unsigned char* wide) {
    const Vec16 codes = load16(raw);
    Vec16 halves[2];
SLIMSERVE_ATTENTION_UNROLL
    for (int k = 0; k < 4; ++k) {
      fp8_quad_to_f16x2<KvT>(codes.word[k], halves[k / 2].word[2 * (k % 2)], halves[k / 2].word[2 * (k % 2) + 1]);
    }
    store16(wide + widen_wide0, halves[0]);
    store16(wide + widen_wide1, halves[1]);
  };
  auto widen = [&](int raw_slot, int v_index) {
    const unsigned char* raw = smem.kv + Tile::ring_offset + raw_slot * Tile::slot_bytes + widen_raw;
    unsigned char* k_wide = smem.kv + Tile::converted_offset + consumer * 3 * KvTile::bytes;
    unsigned char* v_wide = k_wide + (1 + v_index) * KvTile::bytes;
#if defined(__CUDACC__)
#pragma unroll 1
#endif
    for (int pass = 0; pass < widen_passes; ++pass) {
      widen16(raw + pass * widen_raw_step, k_wide + pass * widen_wide_step);
      widen16(raw + Tile::raw_tile_bytes + pass * widen_raw_step, v_wide + pass * widen_wide_step);
    }
  };

  // Block `blk` (0 .. own_blocks - 1): HasPv: O += P V of the previous tile; HasS: S of tile
  // consumer + 2 blk, then its softmax.
  auto block = [&](std::int32_t blk, auto has_pv_tag, auto has_s_tag) {
    constexpr bool has_pv = decltype(has_pv_tag)::value;
    constexpr bool has_s = decltype(has_s_tag)::value;
    const std::int32_t tile = consumer + 2 * blk;
    std::uint32_t k_tile = 0, v_tile = 0;
    std::uint64_t token_ok = 0;  // read before the slot can be handed back (FP8: at once)
    if constexpr (has_s) {
      arch::named_barrier_sync(Tile::full_barrier(slot), Tile::pair_threads);
SLIMSERVE_ATTENTION_UNROLL
      for (int word = 0; word < Tile::mask_words; ++word) {
        token_ok |= static_cast<std::uint64_t>(smem.token_ok[slot][word]) << (32 * word);
      }
      if constexpr (fp8) {
        const int v_index = blk % 2;
        // every warp of this warpgroup is past the previous block's products (which read the
        // widened tiles being overwritten)
        arch::named_barrier_sync(Tile::convert_barrier(consumer), Tile::warpgroup_threads);
        widen(slot, v_index);
        arch::fence_proxy_async_shared();
        if (tile + Tile::slots < num_tiles) arch::named_barrier_arrive(Tile::empty_barrier(slot), Tile::pair_threads);
        arch::named_barrier_sync(Tile::convert_barrier(consumer), Tile::warpgroup_threads);  // tiles written
        k_tile = converted;
        v_tile = converted + static_cast<std::uint32_t>(1 + v_index) * KvTile::bytes;
      } else {
        // The slot's address is uniform across the warpgroup; the shuffle from lane 0 tells the
        // compiler so, which keeps the descriptors in uniform registers (one UIADD3.64 per wgmma).
        const std::uint32_t slot_tile = smem_base + Tile::ring_offset + static_cast<std::uint32_t>(slot) * Tile::slot_bytes;
        k_tile = __shfl_sync(0xffffffffu, slot_tile, 0);
        v_tile = k_tile + KvTile::bytes;
      }
    }

    // Ping-pong: consumer 0's block blk follows consumer 1's block blk - 1; consumer 1's
    // block blk follows consumer 0's block blk.
    const bool wait_turn = consumer == 0 ? (blk >= 1 && blk - 1 < other_blocks) : blk < other_blocks;
    const bool pass_turn = consumer == 0 ? blk < other_blocks : blk + 1 < other_blocks;
    if (wait_turn) arch::named_barrier_sync(Tile::schedule_barrier(consumer), Tile::pair_threads);
    float s[Tile::score_values];
    arch::wgmma_fence();
    if constexpr (has_pv) {
      // O += P V: V MN-major (rows = tokens = K, columns = head_dim = N).
      const std::uint64_t v_desc = KvTile::mn_major_descriptor(v_previous, 0, 0);
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < Tile::token_steps; ++k) {
        paged_wgmma_rs<MmaT, HeadDim, arch::WgmmaMajor::mn>(state.o, p_frag[k], v_desc + KvTile::mn_major_step(k, 0), true);
      }
    }
    if constexpr (has_s) {
      // S = Q K^T: [64 rows][64 tokens], K-major K.
      const std::uint64_t k_desc = KvTile::k_major_descriptor(k_tile, 0);
SLIMSERVE_ATTENTION_UNROLL
      for (int k = 0; k < Tile::k_steps; ++k) {
        paged_wgmma_rs<MmaT, Tile::stage_tokens, arch::WgmmaMajor::k>(s, q_frag[k], k_desc + KvTile::k_major_step(k), k > 0);
      }
    }
    arch::wgmma_commit_group();
    if (pass_turn) arch::named_barrier_arrive(Tile::schedule_barrier(1 - consumer), Tile::pair_threads);
    arch::wgmma_wait_group<0>();
    if constexpr (!fp8 && has_pv) {
      // the previous tile's V is read: its slot may be refilled
      if (previous_tile + Tile::slots < num_tiles) {
        arch::named_barrier_arrive(Tile::empty_barrier(previous_slot), Tile::pair_threads);
      }
    }
    if constexpr (has_s) {
      const std::int64_t tile_begin = kv_begin + static_cast<std::int64_t>(tile) * Tile::stage_tokens;
      prefill_tile_softmax<MmaT>(plain.masked(tile), soft_capped, s, state, p_frag, scale, rows, tile_begin, token_ok, t);
      v_previous = v_tile;
      previous_tile = tile;
      previous_slot = slot;
      slot = slot + 2 >= Tile::slots ? slot + 2 - Tile::slots : slot + 2;
    }
  };

  using yes = std::true_type;
  using no = std::false_type;
  if (own_blocks > 0) {
    block(0, no{}, yes{});
    for (std::int32_t blk = 1; blk < own_tiles; ++blk) block(blk, yes{}, yes{});  // the steady state
    block(own_tiles, yes{}, no{});
  }

  // ---- epilogue -------------------------------------------------------------------------------
  if (!prefill_merge_consumers(state, smem.merge, consumer, i_wg, Tile::merge_barrier)) return;
  prefill_store_rows<QT, HeadDim>(p, state, work, kv_head, qo_begin, tile_row0, valid_rows, v_static, w, g, t);
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
