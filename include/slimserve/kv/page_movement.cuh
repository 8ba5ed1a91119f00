#pragma once
/// \file
/// \brief Kernels of the page-movement family (page_movement.hpp): one kernel, three
/// endpoint pairs (cache -> cache, cache -> records, records -> cache). One block per moved
/// page; thread 0's access verdict (page_access_verdict on every page the move touches) gates
/// the whole block, then the threads copy the page's filled token slots of each array (K, V and
/// the per-token scales) in 16-byte vectors (4-byte words for scale runs of other lengths).
/// A move whose records leave the cache (swap-out, export) takes the records' checksum terms
/// from the words it copies, in registers, and writes the header after the copy: each byte is
/// read once. A move into the cache (swap-in, import) has its records verified by
/// verify_records_kernel first (a refused record must land no byte; see there why that pass
/// cannot ride on the copy).

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
  unsigned char* records;          // swap: [host_slots, slot_bytes]; export/import: after the buffer header
  std::int64_t slot_bytes;         // KvRecordHeader + record_bytes: one slot (one export record)
  std::int32_t host_slots;
  const RecordIdentity* identities;  // swap: [count], written (out) or expected (in) per slot, or
                                     // null: {pool, the swap's writer, 0}
  PageTag pool;                      // the tag array's synced pool (default identities)
  // export / import: one request
  const PageId* request_pages;
  const PageTag* request_tags;
  std::int64_t request_tokens;
  WriterId request_writer;
  unsigned char* header;           // export: written; import: compared with `descriptor`
  KvBufferDescriptor descriptor;   // by value: what the header says (export) or must say (import)
  RecordIdentity identity;         // export: written; import: expected in every record header
  RequestStatus* statuses;         // [count] (copy, swap) or [1] (export, import)
};

struct PageMoveSharedStorage {
  std::int32_t first_failed_slot;
  RequestState state;
  bool keep_status;  // import: the record verdict already wrote the request's status
  unsigned long long word_sum;  // swap-out, export: the record's checksum terms (atomicAdd)
};

struct RecordVerifySharedStorage {
  unsigned long long word_sum;  // the block's checksum terms, folded by atomicAdd
};

/// Set in the import status before verify_records_kernel: no record failed yet.
inline constexpr std::int32_t no_failed_record = 0x7F7F7F7F;  // what a 0x7F byte fill gives

namespace detail {

/// Walks slots [0, tokens) of one array of a page or record: NHD is one run of tokens * H
/// units; HND is H runs of tokens units, page_size units apart. `Copy`: copies them from `src`
/// to `dst`. `Checksum`: returns this thread's share of the record's checksum terms of the
/// words read, at their offsets in the record, from the registers the load put them in (so
/// sealing a record on the way out costs no second read, and the way in sums the same terms).
template <bool Copy, bool Checksum>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE unsigned long long page_slots(unsigned char* dst,
                                                                     const unsigned char* src,
                                                                     const PageGeometry& g,
                                                                     int array,
                                                                     std::int32_t tokens,
                                                                     int thread, int threads) {
  static_assert(Copy || Checksum);
  const std::int64_t unit = g.unit_bytes[array];
  const int runs = g.hnd ? g.num_kv_heads : 1;
  const std::int64_t run_bytes = g.hnd ? tokens * unit : tokens * unit * g.num_kv_heads;
  const std::int64_t run_stride = g.hnd ? static_cast<std::int64_t>(g.page_size) * unit : 0;
  unsigned long long sum = 0;
  for (int run = 0; run < runs; ++run) {
    unsigned char* d = nullptr;
    if constexpr (Copy) d = dst + run * run_stride;
    const unsigned char* s = src + run * run_stride;
    const std::int64_t base = g.record_offset[array] + run * run_stride;  // s's record offset
    if (run_bytes % 16 == 0) {  // data runs always; scale runs when the length allows
      const auto* s16 = reinterpret_cast<const uint4*>(s);
      for (std::int64_t i = thread; i < run_bytes / 16; i += threads) {
        const uint4 v = s16[i];
        if constexpr (Copy) reinterpret_cast<uint4*>(d)[i] = v;
        if constexpr (Checksum) {
          const std::int64_t at = base + 16 * i;
          sum += record_word_term(at, v.x) + record_word_term(at + 4, v.y) +
                 record_word_term(at + 8, v.z) + record_word_term(at + 12, v.w);
        }
      }
    } else {
      const auto* s4 = reinterpret_cast<const std::uint32_t*>(s);
      for (std::int64_t i = thread; i < run_bytes / 4; i += threads) {
        const std::uint32_t w = s4[i];
        if constexpr (Copy) reinterpret_cast<std::uint32_t*>(d)[i] = w;
        if constexpr (Checksum) sum += record_word_term(base + 4 * i, w);
      }
    }
  }
  return sum;
}

/// Where record `index` of a move's records lives: its header, then its bytes.
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE unsigned char* record_at(const PageMoveParams& p,
                                                                std::int64_t index) {
  return p.records + index * p.slot_bytes;
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
  constexpr bool seal = Kind == MoveKind::swap_out || Kind == MoveKind::export_request;
  if constexpr (seal) {
    if (thread == 0) shared.word_sum = 0;  // read after the __syncthreads below
  }
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
        if constexpr (Kind == MoveKind::swap_in) {
          // verify_records_kernel ran first: a refused record keeps its verdict.
          const RequestStatus record = p.statuses[item];
          if (!request_ok(record)) state = record.state;
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
      shared.keep_status = false;
      bool header_ok = true;
      if constexpr (Kind == MoveKind::import_request) {
        const auto* expected = reinterpret_cast<const unsigned char*>(&p.descriptor);
        for (int i = 0; i < static_cast<int>(sizeof(KvBufferDescriptor)); ++i) {
          header_ok &= p.header[i] == expected[i];
        }
      }
      shared.state = shape_ok && header_ok ? RequestState::ok : RequestState::bad_page_table;
      if constexpr (Kind == MoveKind::import_request) {
        // verify_records_kernel ran first: a refused record refuses the request, and its
        // status (the first failing record) stays. Block 0 writes the status only when the
        // records passed, and then every block computes the same verdict below.
        const RequestStatus records = p.statuses[0];
        if (!request_ok(records)) {
          shared.state = records.state;
          shared.keep_status = true;
        }
      }
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
        if (thread == 0 && !shared.keep_status) p.statuses[0] = RequestStatus{shared.state, 0};
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
  unsigned long long word_sum = 0;  // seal: this thread's checksum terms
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
      unsigned char* record =
          detail::record_at(p, sw.host_slot) + kv_record_header_bytes + g.record_offset[a];
      src = Kind == MoveKind::swap_out ? page : record;
      dst = Kind == MoveKind::swap_out ? record : page;
    } else {
      const std::int64_t left = p.request_tokens - static_cast<std::int64_t>(item) * g.page_size;
      tokens = static_cast<std::int32_t>(left < g.page_size ? left : g.page_size);
      unsigned char* page = g.arrays[a] + p.request_pages[item] * g.array_bytes[a];
      unsigned char* record =
          detail::record_at(p, item) + kv_record_header_bytes + g.record_offset[a];
      src = Kind == MoveKind::export_request ? page : record;
      dst = Kind == MoveKind::export_request ? record : page;
    }
    word_sum += detail::page_slots<true, seal>(dst, src, g, a, tokens, thread, BlockThreads);
  }
  if constexpr (seal) {
    // The record's header: whose record, which slot, what it holds, and the checksum of the
    // bytes this block just copied (swap records hold the whole page, export records the
    // filled slots: exactly the copied runs).
    atomicAdd(&shared.word_sum, word_sum);
    __syncthreads();
    if (thread == 0) {
      KvRecordHeader header;
      if constexpr (Kind == MoveKind::swap_out) {
        const PageSwap sw = p.swaps[item];
        header.identity =
            p.identities != nullptr ? p.identities[item] : RecordIdentity{p.pool, sw.writer, 0};
        header.index = sw.host_slot;
        header.tokens = written_slots(p.page_fills[sw.page], sw.tag);  // for swap-in's fill
      } else {
        const std::int64_t left = p.request_tokens - static_cast<std::int64_t>(item) * g.page_size;
        header.identity = p.identity;
        header.index = item;
        header.tokens = static_cast<std::int32_t>(left < g.page_size ? left : g.page_size);
      }
      header.checksum =
          record_checksum(shared.word_sum, header.identity, header.index, header.tokens);
      *reinterpret_cast<KvRecordHeader*>(detail::record_at(p, header.index)) = header;
      if constexpr (Kind == MoveKind::export_request) {
        if (item == 0) {
          *reinterpret_cast<RecordIdentity*>(p.header + kv_buffer_identity_offset) = header.identity;
        }
      }
    }
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
    // The verified header says how many slots the record holds (the fill at swap-out).
    const PageSwap sw = p.swaps[i];
    const auto* header = reinterpret_cast<const KvRecordHeader*>(detail::record_at(p, sw.host_slot));
    record_page_fill(p.page_fills, sw.page, sw.tag, header->tokens);
  } else if constexpr (Kind == MoveKind::import_request) {
    if (!request_ok(p.statuses[0])) return;  // all or nothing
    const std::int64_t left = p.request_tokens - static_cast<std::int64_t>(i) * p.geometry.page_size;
    record_page_fill(p.page_fills, p.request_pages[i], p.request_tags[i],
                     static_cast<std::int32_t>(left < p.geometry.page_size ? left : p.geometry.page_size));
  }
}

/// Verifies the records a swap-in or import is about to copy, one block per record, before
/// move_pages_kernel on the same stream: the header must carry the expected identity, the
/// slot (page) index, a token count the page can hold (import: the page's share of the
/// request) and the checksum of the record's bytes. Swap-in writes each swap's status (ok or
/// record_mismatch); import folds refusals into the request's status (set to ok /
/// no_failed_record before the launch): the first failing record's index.
///
/// Why a pass of its own, unlike sealing: the verdict needs every word of the record, and a
/// refused record must land no byte. An import is all or nothing over the request, so no
/// block may write before every block's records passed: a grid-wide dependency, which is
/// the kernel boundary (a cooperative grid sync would cap requests at the resident CTAs). A
/// swap-in is per page, but copying after the verdict means holding the whole record on chip
/// until then. The move kernel runs at 32 registers a thread (sm_90a SASS), 16 CTAs an SM, so
/// that many 16-byte loads are in flight; a 33-KiB FP8 record (16 tokens x 8 heads x 128, with
/// scales) is 264 B (66 registers) a thread of 128, a 64-KiB BF16 one 128, a BF16 page of 32
/// tokens 256 (more than a thread has); a shared-memory stage holds 6 such FP8 records an SM
/// (3 BF16; a BF16 page of 256 tokens not at all). Either trades the copy's bytes in flight
/// for the second read it saves. So the record is read twice on the way in; this pass only
/// reads, in 16-byte vectors like the copy (the checksum terms, not the loads, bound it).
template <int BlockThreads, MoveKind Kind>
__global__ void __launch_bounds__(BlockThreads) verify_records_kernel(PageMoveParams p) {
  static_assert(Kind == MoveKind::swap_in || Kind == MoveKind::import_request);
  auto& shared = rt::shared_storage<RecordVerifySharedStorage>();
  const int item = static_cast<int>(blockIdx.x);
  const int thread = static_cast<int>(threadIdx.x);
  const PageGeometry& g = p.geometry;
  std::int32_t index;
  std::int32_t tokens;  // -1: whatever the header says, within the page
  RecordIdentity expected;
  if constexpr (Kind == MoveKind::swap_in) {
    const PageSwap sw = p.swaps[item];
    if (sw.host_slot < 0 || sw.host_slot >= p.host_slots) {  // the move kernel refuses it
      if (thread == 0) p.statuses[item] = RequestStatus{RequestState::ok, -1};
      return;
    }
    index = sw.host_slot;
    tokens = -1;
    expected = p.identities != nullptr ? p.identities[item] : RecordIdentity{p.pool, sw.writer, 0};
  } else {
    index = item;
    const std::int64_t left = p.request_tokens - static_cast<std::int64_t>(item) * g.page_size;
    tokens = static_cast<std::int32_t>(left < g.page_size ? left : g.page_size);
    expected = p.identity;
  }
  const unsigned char* slot = detail::record_at(p, index);
  const KvRecordHeader header = *reinterpret_cast<const KvRecordHeader*>(slot);
  const std::int32_t covered = Kind == MoveKind::swap_in ? g.page_size : tokens;
  if (thread == 0) shared.word_sum = 0;
  __syncthreads();
  unsigned long long sum = 0;
  for (int a = 0; a < g.num_arrays; ++a) {
    sum += detail::page_slots<false, true>(nullptr, slot + kv_record_header_bytes + g.record_offset[a],
                                           g, a, covered, thread, BlockThreads);
  }
  atomicAdd(&shared.word_sum, sum);
  __syncthreads();
  if (thread != 0) return;
  const bool ok = record_header_matches(header, expected, index, tokens, g.page_size, shared.word_sum);
  if constexpr (Kind == MoveKind::swap_in) {
    p.statuses[item] = ok ? RequestStatus{RequestState::ok, -1}
                          : RequestStatus{RequestState::record_mismatch, 0};
  } else if (!ok) {
    atomicMin(&p.statuses[0].failed_slot, item);
    p.statuses[0].state = RequestState::record_mismatch;  // every refusing block stores the same
  }
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
