#pragma once
/// \file
/// \brief Fused quantize-and-append: new K/V tokens (BF16/FP16) into their page slots.
///
/// Grid: (num_tokens, ceil(num_kv_heads / heads_per_block)); each block handles one token and
/// `heads_per_block` heads, `head_vector_lanes(head_dim)` threads per head, each active thread
/// 8 input elements (one 16-byte load); the page store itself is kv_store.cuh's. A token
/// whose destination is not provably inside its request's pages (request index, position,
/// page id, tag-check verdict) is skipped as a whole block: nothing is written.

#include <cmath>
#include <cstdint>

#include "slimserve/attention/kernels/kv_store.cuh"
#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/kv/page_fill.cuh"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

struct AppendParams {
  void* k_pages;  // [num_pages, page_size, H, D] or [num_pages, H, page_size, D]
  void* v_pages;
  const float* k_scale;  // per_tensor
  const float* v_scale;
  float* k_token_scales;  // per_token, pages' layout with D = 1
  float* v_token_scales;
  std::int32_t num_pages;
  std::int32_t page_size;
  std::int32_t num_kv_heads;
  KvLayout layout;
  KvScaleMode scale_mode;
  // Page table (CSR) and per-request verdicts (may be null: no check).
  const std::int32_t* indptr;         // [batch_size + 1]
  const std::int32_t* indices;        // [indptr[batch_size]]
  const std::int32_t* last_page_len;  // [batch_size]
  const kv::RequestStatus* status;    // [batch_size] or null
  std::int32_t batch_size;
  // New tokens.
  const void* k_new;  // k_new[t * k_row_stride + h * D + d]
  const void* v_new;  // v_new[t * v_row_stride + h * D + d]
  std::int64_t k_row_stride;  // elements between tokens' rows (the host resolves 0 to H * D)
  std::int64_t v_row_stride;
  const std::int32_t* token_request;   // [num_tokens] (explicit destinations) or null
  const std::int32_t* token_position;  // [num_tokens] (explicit destinations) or null
  const std::int32_t* append_indptr;   // [batch_size + 1] (chunk mode: each request's last tokens)
  const std::int64_t* slot_mapping;    // [num_tokens] (slot mode: page * page_size + offset, -1 skips) or null
  std::int32_t num_tokens;
  std::int64_t page_stride;            // elements between pages of k_pages / v_pages; 0: packed
  // Device-held lengths (or null): the written slot is recorded under the entry's tag.
  const kv::PageTag* expected_tags;   // [indptr[batch_size]]
  kv::PageFillWord* page_fills;       // [num_pages] or null
};

/// Where token t goes: request and position, or request = -1 when it must be skipped.
struct TokenDestination {
  std::int32_t request = -1;
  std::int32_t page = -1;
  std::int32_t slot = 0;
  std::int64_t entry = 0;  // the page's index in the table's indices / expected_tags
};

SLIMSERVE_DEVICE inline TokenDestination find_destination(const AppendParams& p, std::int32_t t) {
  TokenDestination dest;
  if (p.slot_mapping != nullptr) {
    // Slot mode (vLLM's reshape_and_cache): no page table, no request; the slot names the page.
    const std::int64_t flat = p.slot_mapping[t];
    if (flat < 0) return dest;
    const std::int64_t page = flat / p.page_size;
    if (page >= p.num_pages) return dest;
    dest.request = 0;
    dest.page = static_cast<std::int32_t>(page);
    dest.slot = static_cast<std::int32_t>(flat % p.page_size);
    return dest;
  }
  std::int32_t b = -1;
  std::int64_t position = -1;
  std::int64_t length = 0;
  auto request_length = [&](std::int32_t r) -> std::int64_t {
    const std::int32_t pages = p.indptr[r + 1] - p.indptr[r];
    const std::int32_t last = p.last_page_len[r];
    if (pages <= 0 || last < 1 || last > p.page_size) return 0;  // device backstop
    return static_cast<std::int64_t>(pages - 1) * p.page_size + last;
  };
  if (p.token_request != nullptr) {
    b = p.token_request[t];
    if (b < 0 || b >= p.batch_size) return dest;
    position = p.token_position[t];
    length = request_length(b);
  } else {
    // Chunk mode: the request whose [append_indptr[b], append_indptr[b+1]) holds t.
    std::int32_t lo = 0, hi = p.batch_size;  // invariant: append_indptr[lo] <= t < append_indptr[hi]
    if (t < p.append_indptr[0] || t >= p.append_indptr[p.batch_size]) return dest;
    while (hi - lo > 1) {
      const std::int32_t mid = (lo + hi) / 2;
      if (p.append_indptr[mid] <= t) lo = mid; else hi = mid;
    }
    b = lo;
    length = request_length(b);
    const std::int32_t count = p.append_indptr[b + 1] - p.append_indptr[b];
    position = length - count + (t - p.append_indptr[b]);
  }
  if (p.status != nullptr && !kv::request_ok(p.status[b])) return dest;
  if (position < 0 || position >= length) return dest;
  const std::int32_t page_index = static_cast<std::int32_t>(position / p.page_size);
  const std::int64_t entry = static_cast<std::int64_t>(p.indptr[b]) + page_index;
  const std::int32_t page = p.indices[entry];
  if (page < 0 || page >= p.num_pages) return dest;
  dest.entry = entry;
  dest.request = b;
  dest.page = page;
  dest.slot = static_cast<std::int32_t>(position % p.page_size);
  return dest;
}

/// One block's work: token blockIdx.x, heads_per_block heads from blockIdx.y on.
template <class KvT, class InT, int HeadDim, KvRotation Rotation>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void append_token_heads(const AppendParams& p) {
  constexpr int lanes = HeadVectorLanes<HeadDim>::lanes;  // threads per head vector

  const std::int32_t t = static_cast<std::int32_t>(blockIdx.x);
  const TokenDestination dest = find_destination(p, t);
  if (dest.request < 0) return;  // whole block: no shuffle is left half-done

  const int heads_per_block = static_cast<int>(blockDim.x) / lanes;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  const std::int32_t head =
      static_cast<std::int32_t>(blockIdx.y) * heads_per_block + static_cast<int>(threadIdx.x) / lanes;
  const bool head_valid = head < p.num_kv_heads;
  // Token rows p.*_row_stride apart (a fused projection's slices), heads contiguous in a row.
  const std::int64_t head_offset = static_cast<std::int64_t>(head_valid ? head : 0) * HeadDim;
  const std::int64_t k_row = static_cast<std::int64_t>(t) * p.k_row_stride + head_offset;
  const std::int64_t v_row = static_cast<std::int64_t>(t) * p.v_row_stride + head_offset;
  const PageStoreTarget target{p.k_pages, p.v_pages, p.k_token_scales, p.v_token_scales, p.k_scale,
                               p.v_scale, p.page_size, p.num_kv_heads, p.layout, p.scale_mode, p.page_stride};
  store_head_vectors<KvT, InT, HeadDim, Rotation>(target, static_cast<const InT*>(p.k_new) + k_row,
                                                  static_cast<const InT*>(p.v_new) + v_row, lane, head_valid,
                                                  dest.page, dest.slot, head);
}

template <class KvT, class InT, int HeadDim>
__global__ void append_kernel(const AppendParams p) {
  append_token_heads<KvT, InT, HeadDim, KvRotation::none>(p);
}

/// append_kernel with K (RotateValues: and V) rotated before quantization (kv_rotate.cuh);
/// head dims of RotationHeadDims. A kernel of its own so append_kernel's code is unchanged.
template <class KvT, class InT, int HeadDim, bool RotateValues>
__global__ void rotated_append_kernel(const AppendParams p) {
  append_token_heads<KvT, InT, HeadDim, RotateValues ? KvRotation::keys_and_values : KvRotation::keys>(p);
}

/// Device-held lengths, after append_kernel on the same stream: one thread per token records
/// the slot it was written to in its page's fill, under the table's expected tag (within one
/// launch every token of a page carries the same tag, so only the largest slot stays). A kernel
/// of its own, so the append kernel's code is unchanged when fills are not tracked.
template <int BlockThreads>
__global__ void __launch_bounds__(BlockThreads) record_append_fills_kernel(const AppendParams p) {
  const std::int32_t t = static_cast<std::int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (t >= p.num_tokens) return;
  const TokenDestination dest = find_destination(p, t);  // the append's own verdict
  if (dest.request < 0) return;                           // skipped: nothing was written
  kv::record_page_fill(p.page_fills, dest.page, p.expected_tags[dest.entry], dest.slot + 1);
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
