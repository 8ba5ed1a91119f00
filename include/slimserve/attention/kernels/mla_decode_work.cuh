#pragma once
/// \file
/// \brief What both MLA decode kernels (mla_decode_kernel, mla_wgmma_decode_kernel) share:
/// the parameters, the CTA's work item (request, packed rows, KV range of its split), a
/// token's record in the paged cache, and the writes that do not depend on the tile shape —
/// an aborted request's rows and a row's LSE.

#include <cmath>
#include <cstdint>

#include "slimserve/attention/kernels/mma_fragments.cuh"
#include "slimserve/attention/kernels/page_locator.cuh"
#include "slimserve/attention/kernels/paged_attention_kernel.cuh"
#include "slimserve/attention/mla_cache_view.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

struct MlaDecodeParams {
  // Cache: token records [num_pages, page_size, token_bytes].
  const unsigned char* pages;
  const float* latent_scale;  // per_tensor
  std::int32_t num_pages;
  std::int32_t page_size;
  std::int32_t page_shift;  // log2(page_size)
  std::int32_t token_bytes;
  std::int32_t scales_offset;
  std::int32_t rope_offset;
  MlaScaleMode scale_mode;
  // Page table: CSR (indptr != null) or block table.
  const std::int32_t* indptr;         // [B + 1]
  const std::int32_t* indices;        // [indptr[B]]
  const std::int32_t* last_page_len;  // [B]
  const std::int32_t* block_table;    // [B, block_table_stride]
  std::int32_t block_table_stride;
  const std::int32_t* seq_lens;     // [B]
  const kv::RequestStatus* status;  // [B] or null
  // Queries [T, H, 576] and outputs [T, H, 512] (+ lse [T, H]); request b owns query tokens
  // [qo_indptr[b], qo_indptr[b + 1]), its last positions (causal within them).
  const void* q;
  void* o;
  float* lse;
  std::int64_t q_token_stride, q_head_stride;
  std::int64_t o_token_stride, o_head_stride;
  std::int32_t num_heads;
  const std::int32_t* qo_indptr;  // [B + 1] (workspace, written by the plan)
  float score_scale;  // sm_scale * log2(e)
  // Schedule (workspace, written by the plan).
  const std::int32_t* work_request;
  const std::int32_t* work_row_tile;
  const std::int32_t* work_split;
  const std::int32_t* work_num_splits;
  std::int32_t chunk_tokens;
  bool split_kv;
  float* partial_o;    // [W, rows, 512]
  float* partial_lse;  // [W, rows]
};

/// Page id of the request's `page_index`-th page, or -1 when outside the cache.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE std::int32_t mla_page(const MlaDecodeParams& p, std::int32_t b,
                                                             std::int64_t page_index) {
  const std::int32_t page =
      p.indptr != nullptr
          ? p.indices[p.indptr[b] + static_cast<std::int32_t>(page_index)]
          : p.block_table[static_cast<std::int64_t>(b) * p.block_table_stride + page_index];
  return (page >= 0 && page < p.num_pages) ? page : -1;
}

/// One CTA's work item: request b's packed rows [tile_row0, tile_row0 + Rows) (row r =
/// query_token * num_heads + head) over positions [kv_begin, kv_end) of its split, cut at what
/// the tile's last query token can see.
struct MlaWork {
  std::int32_t index;  // blockIdx.x: the partial rows' work item
  std::int32_t b;
  bool aborted;  // tag check failed or the device table is inconsistent: read nothing
  std::int64_t kv_len;
  std::int64_t first_token;  // the request's first query token
  std::int32_t query_count;
  std::int64_t valid_rows;  // query_count * num_heads
  std::int64_t tile_row0;
  std::int64_t kv_begin, kv_end;
  std::int32_t num_tiles;  // of TileTokens
  std::int32_t rows;       // per CTA

  /// Position the packed row's query token sits at (it sees positions <= this).
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE std::int64_t query_position(const MlaDecodeParams& p,
                                                                      std::int64_t packed) const {
    return kv_len - query_count + packed / p.num_heads;
  }
  SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE std::int64_t partial_row(int r) const {
    return static_cast<std::int64_t>(index) * rows + r;
  }
};

template <int Rows, int TileTokens>
SLIMSERVE_DEVICE inline MlaWork mla_work(const MlaDecodeParams& p) {
  MlaWork w{};
  w.index = static_cast<std::int32_t>(blockIdx.x);
  w.rows = Rows;
  w.b = p.work_request[w.index];
  const std::int32_t row_tile = p.work_row_tile[w.index];
  const std::int32_t split = p.work_split[w.index];
  const std::int32_t num_splits = p.work_num_splits[w.index];
  w.kv_len = located_request_length(p, w.b);  // page_locator.cuh: CSR or block table
  w.aborted = w.kv_len < 0 || !(p.status == nullptr || kv::request_ok(p.status[w.b]));
  w.first_token = p.qo_indptr[w.b];
  w.query_count = p.qo_indptr[w.b + 1] - p.qo_indptr[w.b];
  w.valid_rows = static_cast<std::int64_t>(w.query_count) * p.num_heads;
  w.tile_row0 = static_cast<std::int64_t>(row_tile) * Rows;
  if (w.aborted) return w;
  const std::int64_t last_row = (w.tile_row0 + Rows < w.valid_rows ? w.tile_row0 + Rows : w.valid_rows) - 1;
  const std::int64_t max_query = w.query_position(p, last_row);
  w.kv_begin = static_cast<std::int64_t>(split) * p.chunk_tokens;
  std::int64_t kv_end = split == num_splits - 1 ? w.kv_len : w.kv_begin + p.chunk_tokens;
  if (kv_end > w.kv_len) kv_end = w.kv_len;
  if (kv_end > max_query + 1) kv_end = max_query + 1;
  if (kv_end < w.kv_begin) kv_end = w.kv_begin;
  w.kv_end = kv_end;
  w.num_tiles = static_cast<std::int32_t>((kv_end - w.kv_begin + TileTokens - 1) / TileTokens);
  return w;
}

/// An aborted request: nothing of it is read. Unsplit: NaN rows, lse -inf; split: partial
/// lse NaN, which the merge turns into the same marked rows.
template <class QT>
SLIMSERVE_DEVICE inline void mla_write_aborted_rows(const MlaDecodeParams& p, const MlaWork& w, int tid,
                                                    int threads) {
  for (int r = tid; r < w.rows; r += threads) {
    const std::int64_t packed = w.tile_row0 + r;
    if (p.split_kv) {
      p.partial_lse[w.partial_row(r)] = NAN;
      continue;
    }
    if (packed >= w.valid_rows) continue;
    const std::int64_t token = w.first_token + packed / p.num_heads;
    const std::int64_t head = packed % p.num_heads;
    QT* o = static_cast<QT*>(p.o) + token * p.o_token_stride + head * p.o_head_stride;
    for (int d = 0; d < mla_latent_dim; ++d) o[d] = from_float<QT>(NAN);
    if (p.lse != nullptr) p.lse[token * p.num_heads + head] = -INFINITY;
  }
}

/// The record of the request's token at `position`: `ok` is false (and the record a dummy
/// address that is never read) past the range and for bad page ids.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE const unsigned char* mla_token_record(const MlaDecodeParams& p,
                                                                            const MlaWork& w,
                                                                            std::int64_t position, bool& ok) {
  const std::int32_t page = position < w.kv_end ? mla_page(p, w.b, position >> p.page_shift) : -1;
  ok = page >= 0;
  return p.pages +
         (ok ? (static_cast<std::int64_t>(page) * p.page_size + (position & (p.page_size - 1))) * p.token_bytes : 0);
}

/// The natural-log LSE of packed row `r` from its exp2 running max and sum (-inf when the
/// row saw no token, or is past the request's rows in a split).
SLIMSERVE_DEVICE inline void mla_write_row_lse(const MlaDecodeParams& p, const MlaWork& w, int r, float run_max,
                                               float run_sum) {
  const std::int64_t packed = w.tile_row0 + r;
  const bool valid = packed < w.valid_rows;
  const bool empty = run_sum == 0.0f;  // NaN (a NaN key read) is not empty: the lse is NaN
  // A NaN run_max (the running max never is: fmaxf keeps the other operand) is the kernel's
  // mark of an invalid tensor scale: the lse is NaN too.
  const float lse = run_max != run_max ? NAN : empty ? -INFINITY : (run_max + log2f(run_sum)) * paged_ln_2;
  if (p.split_kv) {
    p.partial_lse[w.partial_row(r)] = valid ? lse : -INFINITY;
  } else if (valid && p.lse != nullptr) {
    const std::int64_t token = w.first_token + packed / p.num_heads;
    p.lse[token * p.num_heads + packed % p.num_heads] = lse;
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
