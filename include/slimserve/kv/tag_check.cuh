#pragma once
/// \file
/// \brief Kernels of the GPU tag check: the device tag-array update (scatter of changed
/// entries) and the per-request validation of a page table against the device tags.
///
/// Layering: tag_check.hpp / device_tag_array.hpp (host façades) → cuda/kv/tag_check.cu
/// (launch wrappers) → these kernels. Both kernels are graph-safe: no host synchronization,
/// and every count they depend on is read from device memory or fixed at launch.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/kv/tag_update.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

struct TagScatterParams {
  const TagUpdate* batch;  // [1 + count]: batch[0].page = count, then the changed entries
  PageTag* page_tags;             // [num_pages]
  std::int32_t num_pages;
};

/// Where request b's entries are in a CSR table, and whether its lengths are consistent.
struct CsrRows {
  PageTableView table;  // device arrays
  SLIMSERVE_HOST_DEVICE std::int32_t batch_size() const { return table.batch_size; }
  /// Sets [begin, begin + count) of request b's entries; false when the row is malformed.
  SLIMSERVE_DEVICE bool row(int b, std::int64_t& begin, std::int32_t& count) const {
    const std::int32_t first = table.indptr[b];
    const std::int32_t end = table.indptr[b + 1];
    const std::int32_t last_len = table.last_page_len[b];
    begin = first;
    count = end - first;
    return end == first ? last_len == 0
                        : end > first && last_len >= 1 && last_len <= table.page_size;
  }
  SLIMSERVE_DEVICE PageId page(std::int64_t entry) const { return table.indices[entry]; }
  SLIMSERVE_DEVICE PageTag expected(std::int64_t entry) const { return table.expected_tags[entry]; }
};

/// The same for a 2-D block table: row b starts at b * max_pages_per_request and holds
/// ceil(seq_lens[b] / page_size) pages.
struct BlockRows {
  BlockTableView table;  // device arrays
  SLIMSERVE_HOST_DEVICE std::int32_t batch_size() const { return table.batch_size; }
  SLIMSERVE_DEVICE bool row(int b, std::int64_t& begin, std::int32_t& count) const {
    const std::int64_t tokens = table.seq_lens[b];
    begin = static_cast<std::int64_t>(b) * table.max_pages_per_request;
    count = static_cast<std::int32_t>((tokens + table.page_size - 1) / table.page_size);
    return tokens >= 0 &&
           tokens <= static_cast<std::int64_t>(table.max_pages_per_request) * table.page_size;
  }
  SLIMSERVE_DEVICE PageId page(std::int64_t entry) const { return table.block_table[entry]; }
  SLIMSERVE_DEVICE PageTag expected(std::int64_t entry) const { return table.expected_tags[entry]; }
};

template <class Rows>
struct TagCheckParams {
  Rows rows;                     // CsrRows or BlockRows
  const PageTag* page_tags;      // [num_pages], the device tag array
  std::int32_t num_pages;
  RequestStatus* statuses;       // [rows.batch_size()]
  std::int32_t* aborted_count;   // [1] or null; incremented once per failing request
};

namespace detail {
constexpr int warp_size = 32;
}  // namespace detail

namespace detail {

constexpr unsigned full_warp_mask = 0xFFFFFFFFu;

SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE int lowest_set_bit(unsigned mask) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(mask)) - 1;
#else
  return __builtin_ctz(mask);
#endif
}

}  // namespace detail

/// One thread per changed entry (grid-stride, so any grid covers any count).
template <int BlockThreads>
__global__ void __launch_bounds__(BlockThreads) scatter_page_tags_kernel(TagScatterParams params) {
  const std::int32_t count = params.batch[0].page;
  const TagUpdate* updates = params.batch + tag_batch_header_slots;  // [count]
  const std::int32_t stride = static_cast<std::int32_t>(gridDim.x * blockDim.x);
  for (std::int32_t i = static_cast<std::int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
       i < count; i += stride) {
    const TagUpdate update = updates[i];
    if (update.page >= 0 && update.page < params.num_pages) {
      params.page_tags[update.page] = update.tag;
    }
  }
}

/// One warp per request (grid-stride over requests). Lanes read 32 consecutive entries at a
/// time; a ballot finds the first failing slot, so the verdict is the same on every run.
template <int WarpsPerBlock, class Rows>
__global__ void __launch_bounds__(WarpsPerBlock * detail::warp_size)
    check_page_tags_kernel(TagCheckParams<Rows> params) {
  using detail::warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int warps_in_grid = static_cast<int>(gridDim.x) * WarpsPerBlock;
  for (int request = static_cast<int>(blockIdx.x) * WarpsPerBlock + warp;
       request < params.rows.batch_size(); request += warps_in_grid) {
    std::int64_t begin = 0;
    std::int32_t count = 0;
    const bool shape_ok = params.rows.row(request, begin, count);
    RequestState state = RequestState::ok;
    std::int32_t failed_slot = -1;
    if (!shape_ok) {  // the host validates; this is the backstop
      state = RequestState::bad_page_table;
      failed_slot = 0;
    }
    for (std::int32_t base = 0; shape_ok && base < count; base += warp_size) {
      const std::int32_t slot = base + lane;
      bool out_of_range = false;
      bool stale = false;
      if (slot < count) {
        const PageId page = params.rows.page(begin + slot);
        const PageTag expected = params.rows.expected(begin + slot);
        out_of_range = page < 0 || page >= params.num_pages;
        // A tag of 0 belongs only to the guard page (page 0); no owner of another page has it.
        stale = !out_of_range &&
                (params.page_tags[page] != expected || (page != 0 && expected == 0));
      }
      const unsigned range_mask = __ballot_sync(detail::full_warp_mask, out_of_range);
      const unsigned stale_mask = __ballot_sync(detail::full_warp_mask, stale);
      if ((range_mask | stale_mask) != 0u) {  // warp-uniform
        const int first = detail::lowest_set_bit(range_mask | stale_mask);
        state = ((range_mask >> first) & 1u) != 0u ? RequestState::page_out_of_range
                                                   : RequestState::stale_tag;
        failed_slot = base + first;
        break;
      }
    }
    if (lane == 0) {
      params.statuses[request] = RequestStatus{state, failed_slot};
      if (state != RequestState::ok && params.aborted_count != nullptr) {
        atomicAdd(params.aborted_count, 1);
      }
    }
  }
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
