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

// TEMPORARY until the CPU emulator lands on main: its placeholder has no kernel support.
#if !defined(SLIMSERVE_EMULATE) || __has_include("slimserve/emu/qualifiers.hpp")
#define SLIMSERVE_KV_HAS_KERNELS 1
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

struct TagScatterParams {
  const TagUpdate* batch;  // [1 + count]: batch[0].page = count, then the changed entries
  PageTag* page_tags;             // [num_pages]
  std::int32_t num_pages;
};

struct TagCheckParams {
  PageTableView table;           // device arrays
  const PageTag* page_tags;      // [num_pages], the device tag array
  std::int32_t num_pages;
  RequestStatus* statuses;       // [table.batch_size]
  std::int32_t* aborted_count;   // [1] or null; incremented once per failing request
};

namespace detail {
constexpr int warp_size = 32;
}  // namespace detail

#if defined(SLIMSERVE_KV_HAS_KERNELS)
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
template <int WarpsPerBlock>
__global__ void __launch_bounds__(WarpsPerBlock * detail::warp_size)
    check_page_tags_kernel(TagCheckParams params) {
  using detail::warp_size;
  const PageTableView& table = params.table;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int warps_in_grid = static_cast<int>(gridDim.x) * WarpsPerBlock;
  for (int request = static_cast<int>(blockIdx.x) * WarpsPerBlock + warp;
       request < table.batch_size; request += warps_in_grid) {
    const std::int32_t begin = table.indptr[request];
    const std::int32_t end = table.indptr[request + 1];
    const std::int32_t last_len = table.last_page_len[request];
    RequestState state = RequestState::ok;
    std::int32_t failed_slot = -1;
    const bool shape_ok = end == begin ? last_len == 0
                                       : end > begin && last_len >= 1 &&
                                             last_len <= table.page_size;
    if (!shape_ok) {  // the host validates; this is the backstop
      state = RequestState::bad_page_table;
      failed_slot = 0;
    }
    for (std::int32_t base = begin; shape_ok && base < end; base += warp_size) {
      const std::int32_t entry = base + lane;
      bool out_of_range = false;
      bool stale = false;
      if (entry < end) {
        const PageId page = table.indices[entry];   // [nnz]
        const PageTag expected = table.expected_tags[entry];
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
        failed_slot = base - begin + first;
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

#endif  // SLIMSERVE_KV_HAS_KERNELS

}  // namespace kv
SLIMSERVE_NAMESPACE_END
