#pragma once
/// \file
/// \brief Kernels of the page-movement family (page_movement.hpp): one kernel, three
/// endpoint pairs (cache -> cache, cache -> records, records -> cache). One block per moved
/// page; thread 0's access verdict (page_access_verdict on every page the move touches) gates
/// the whole block, then the threads copy the page's filled token slots of each array (K, V and
/// the per-token scales) in 16-byte vectors (4-byte words for scale runs of other lengths).

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/kv/page_access.hpp"
#include "slimserve/kv/page_fill.cuh"
#include "slimserve/kv/page_movement.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/runtime/platform.hpp"
#include "slimserve/runtime/shared_memory.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

/// Where each array of a page lives: in the cache (page-major arrays) and in a record.
struct PageGeometry {
  unsigned char* arrays[4];     // k_pages, v_pages, k_token_scales, v_token_scales (cache)
  std::int64_t array_bytes[4];  // bytes of one page in each array
  std::int64_t record_offset[4];
  std::int32_t unit_bytes[4];   // bytes of one (token, head): head_dim * element, or 4
  std::int32_t num_arrays;      // 2, or 4 with per-token scales
  std::int32_t page_size;
  std::int32_t num_kv_heads;
  bool hnd;                     // [H, page_size, ...] inside a page; NHD otherwise
  std::int64_t record_bytes;
};

enum class MoveKind : std::uint8_t { copy, swap_out, swap_in, export_request, import_request };

struct PageMoveParams {
  PageGeometry geometry;
  const DevicePageTag* page_tags;  // [num_pages]
  PageFillWord* page_fills;        // [num_pages]: what each written page now holds
  std::int32_t num_pages;
  std::int32_t count;              // blocks: copies, swaps, or the request's pages
  // copy / swap lists
  const PageCopy* copies;
  const PageSwap* swaps;
  unsigned char* records;          // swap: [host_slots, record_bytes]; export/import: after the header
  std::int32_t host_slots;
  // export / import: one request
  const PageId* request_pages;
  const PageTag* request_tags;
  std::int64_t request_tokens;
  WriterId request_writer;
  unsigned char* header;           // export: written; import: compared with `descriptor`
  KvBufferDescriptor descriptor;   // by value: what the header says (export) or must say (import)
  RequestStatus* statuses;         // [count] (copy, swap) or [1] (export, import)
};

struct PageMoveSharedStorage {
  std::int32_t first_failed_slot;
  RequestState state;
};

namespace detail {

/// Copies slots [0, tokens) of one array of a page: NHD is one run of tokens * H units; HND is
/// H runs of tokens units, page_size units apart.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void copy_page_slots(unsigned char* dst,
                                                            const unsigned char* src,
                                                            const PageGeometry& g, int array,
                                                            std::int32_t tokens, int thread,
                                                            int threads) {
  const std::int64_t unit = g.unit_bytes[array];
  const int runs = g.hnd ? g.num_kv_heads : 1;
  const std::int64_t run_bytes = g.hnd ? tokens * unit : tokens * unit * g.num_kv_heads;
  const std::int64_t run_stride = g.hnd ? static_cast<std::int64_t>(g.page_size) * unit : 0;
  for (int run = 0; run < runs; ++run) {
    unsigned char* d = dst + run * run_stride;
    const unsigned char* s = src + run * run_stride;
    if (run_bytes % 16 == 0) {  // data runs always; scale runs when the length allows
      auto* d16 = reinterpret_cast<uint4*>(d);
      const auto* s16 = reinterpret_cast<const uint4*>(s);
      for (std::int64_t i = thread; i < run_bytes / 16; i += threads) d16[i] = s16[i];
    } else {
      auto* d4 = reinterpret_cast<std::uint32_t*>(d);
      const auto* s4 = reinterpret_cast<const std::uint32_t*>(s);
      for (std::int64_t i = thread; i < run_bytes / 4; i += threads) d4[i] = s4[i];
    }
  }
}

}  // namespace detail

/// One block per moved page. Copies and swaps: each page has its own verdict and status.
/// Export and import: one request, all or nothing: every block checks every page of the
/// request (the first failing slot is the request's status), so a refused request moves no
/// page at all; import also compares the buffer's header with the expected descriptor.
template <int BlockThreads, MoveKind Kind>
__global__ void __launch_bounds__(BlockThreads) move_pages_kernel(PageMoveParams p) {
  constexpr std::int32_t none = 0x7FFFFFFF;
  constexpr bool whole_request = Kind == MoveKind::export_request || Kind == MoveKind::import_request;
  auto& shared = rt::shared_storage<PageMoveSharedStorage>();
  const int item = static_cast<int>(blockIdx.x);
  const int thread = static_cast<int>(threadIdx.x);
  const PageGeometry& g = p.geometry;
  if constexpr (!whole_request) {
    if (thread == 0) {
      RequestState state = RequestState::ok;
      if constexpr (Kind == MoveKind::copy) {
        const PageCopy c = p.copies[item];
        if (c.tokens < 1 || c.tokens > g.page_size || c.src == c.dst) {
          state = RequestState::bad_page_table;
        } else {
          state = page_access_verdict(p.page_tags, p.num_pages, c.src, c.src_tag, c.writer,
                                      PageAccess::read);
          if (state == RequestState::ok) {
            state = page_access_verdict(p.page_tags, p.num_pages, c.dst, c.dst_tag, c.writer,
                                        PageAccess::write);
          }
        }
      } else {
        const PageSwap sw = p.swaps[item];
        if (sw.host_slot < 0 || sw.host_slot >= p.host_slots) {
          state = RequestState::page_out_of_range;
        } else {
          state = page_access_verdict(
              p.page_tags, p.num_pages, sw.page, sw.tag, sw.writer,
              Kind == MoveKind::swap_out ? PageAccess::read : PageAccess::write);
        }
      }
      shared.state = state;
      p.statuses[item] = RequestStatus{state, state == RequestState::ok ? -1 : 0};
    }
    __syncthreads();
    if (shared.state != RequestState::ok) return;  // block-uniform: nothing moves
  } else {
    const bool shape_ok =
        p.count > 0 && p.request_tokens > static_cast<std::int64_t>(p.count - 1) * g.page_size &&
        p.request_tokens <= static_cast<std::int64_t>(p.count) * g.page_size;
    if (thread == 0) {
      shared.first_failed_slot = none;
      bool header_ok = true;
      if constexpr (Kind == MoveKind::import_request) {
        const auto* expected = reinterpret_cast<const unsigned char*>(&p.descriptor);
        for (int i = 0; i < static_cast<int>(sizeof(KvBufferDescriptor)); ++i) {
          header_ok &= p.header[i] == expected[i];
        }
      }
      shared.state = shape_ok && header_ok ? RequestState::ok : RequestState::bad_page_table;
    }
    __syncthreads();
    RequestState my_state = RequestState::ok;
    std::int32_t my_slot = none;
    for (std::int32_t slot = thread; shape_ok && slot < p.count; slot += BlockThreads) {
      const RequestState verdict = page_access_verdict(
          p.page_tags, p.num_pages, p.request_pages[slot], p.request_tags[slot], p.request_writer,
          Kind == MoveKind::export_request ? PageAccess::read : PageAccess::write);
      if (verdict != RequestState::ok) {
        my_state = verdict;
        my_slot = slot;
        break;
      }
    }
    if (my_slot != none) atomicMin(&shared.first_failed_slot, my_slot);
    __syncthreads();
    const std::int32_t first = shared.first_failed_slot;
    const bool ok = first == none && shared.state == RequestState::ok;
    if (item == 0) {
      if (shared.state != RequestState::ok) {
        if (thread == 0) p.statuses[0] = RequestStatus{shared.state, 0};
      } else if (first == none) {
        if (thread == 0) p.statuses[0] = RequestStatus{RequestState::ok, -1};
      } else if (my_slot == first) {
        p.statuses[0] = RequestStatus{my_state, first};
      }
      if constexpr (Kind == MoveKind::export_request) {
        const auto* descriptor = reinterpret_cast<const unsigned char*>(&p.descriptor);
        for (int i = thread; ok && i < static_cast<int>(sizeof(KvBufferDescriptor)); i += BlockThreads) {
          p.header[i] = descriptor[i];
        }
      }
    }
    if (!ok) return;  // block-uniform
  }

  // The page's endpoints and filled slots, array by array (no local arrays: no stack frame).
  for (int a = 0; a < g.num_arrays; ++a) {
    const unsigned char* src = nullptr;
    unsigned char* dst = nullptr;
    std::int32_t tokens = g.page_size;
    if constexpr (Kind == MoveKind::copy) {
      const PageCopy c = p.copies[item];
      tokens = c.tokens;
      src = g.arrays[a] + c.src * g.array_bytes[a];
      dst = g.arrays[a] + c.dst * g.array_bytes[a];
    } else if constexpr (Kind == MoveKind::swap_out || Kind == MoveKind::swap_in) {
      const PageSwap sw = p.swaps[item];
      unsigned char* page = g.arrays[a] + sw.page * g.array_bytes[a];
      unsigned char* record = p.records + sw.host_slot * g.record_bytes + g.record_offset[a];
      src = Kind == MoveKind::swap_out ? page : record;
      dst = Kind == MoveKind::swap_out ? record : page;
    } else {
      const std::int64_t left = p.request_tokens - static_cast<std::int64_t>(item) * g.page_size;
      tokens = static_cast<std::int32_t>(left < g.page_size ? left : g.page_size);
      unsigned char* page = g.arrays[a] + p.request_pages[item] * g.array_bytes[a];
      unsigned char* record = p.records + item * g.record_bytes + g.record_offset[a];
      src = Kind == MoveKind::export_request ? page : record;
      dst = Kind == MoveKind::export_request ? record : page;
    }
    detail::copy_page_slots(dst, src, g, a, tokens, thread, BlockThreads);
  }
}

/// Device-held lengths of the pages a move wrote, one thread per move (per page for an
/// import), after move_pages_kernel on the same stream: a move its verdict let through
/// records what its destination now holds. A kernel of its own, so the copy loops above stay
/// as they were.
template <int BlockThreads, MoveKind Kind>
__global__ void __launch_bounds__(BlockThreads) record_move_fills_kernel(PageMoveParams p) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= p.count) return;
  if constexpr (Kind == MoveKind::copy) {
    if (!request_ok(p.statuses[i])) return;
    const PageCopy c = p.copies[i];
    record_page_fill(p.page_fills, c.dst, c.dst_tag, c.tokens);
  } else if constexpr (Kind == MoveKind::swap_in) {
    if (!request_ok(p.statuses[i])) return;
    // A swap record carries no length: the page reads as full (see docs/kv.md).
    const PageSwap sw = p.swaps[i];
    record_page_fill(p.page_fills, sw.page, sw.tag, p.geometry.page_size);
  } else if constexpr (Kind == MoveKind::import_request) {
    if (!request_ok(p.statuses[0])) return;  // all or nothing
    const std::int64_t left = p.request_tokens - static_cast<std::int64_t>(i) * p.geometry.page_size;
    record_page_fill(p.page_fills, p.request_pages[i], p.request_tags[i],
                     static_cast<std::int32_t>(left < p.geometry.page_size ? left : p.geometry.page_size));
  }
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
