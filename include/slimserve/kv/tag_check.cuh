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
#include "slimserve/kv/page_access.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/kv/tag_update.hpp"
#include "slimserve/runtime/platform.hpp"
#include "slimserve/runtime/shared_memory.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

struct TagScatterParams {
  const TagUpdate* batch;         // [1 + count]: batch[0].page = count, then the changed entries
  DevicePageTag* page_tags;       // [num_pages]
  std::int32_t num_pages;
};

/// Where request b's entries are in a CSR table, and whether its lengths are consistent.
struct CsrRows {
  PageTableView table;  // device arrays
  SLIMSERVE_HOST_DEVICE std::int32_t batch_size() const { return table.batch_size; }
  SLIMSERVE_HOST_DEVICE std::int32_t page_size() const { return table.page_size; }
  /// Sets [begin, begin + count) of request b's entries and its length in tokens; false when
  /// the row is malformed.
  SLIMSERVE_DEVICE bool row(int b, std::int64_t& begin, std::int32_t& count,
                            std::int64_t& tokens) const {
    const std::int32_t first = table.indptr[b];
    const std::int32_t end = table.indptr[b + 1];
    const std::int32_t last_len = table.last_page_len[b];
    begin = first;
    count = end - first;
    tokens = count <= 0 ? 0 : static_cast<std::int64_t>(count - 1) * table.page_size + last_len;
    // Bounded rows: [first, end) stays inside the entries built for this table (its own
    // count, not indptr[batch_size]) and inside the buffer.
    std::int64_t bound = table.entry_capacity > 0 ? table.entry_capacity : 0x7FFFFFFF;
    if (table.num_entries != nullptr && *table.num_entries < bound) bound = *table.num_entries;
    const bool inside = first >= 0 && end <= bound;
    return inside && (end == first ? last_len == 0
                                   : end > first && last_len >= 1 && last_len <= table.page_size);
  }
  SLIMSERVE_DEVICE PageId page(std::int64_t entry) const { return table.indices[entry]; }
  SLIMSERVE_DEVICE PageTag expected(std::int64_t entry) const { return table.expected_tags[entry]; }
  SLIMSERVE_DEVICE const TableAge* built_at() const { return table.built_at; }
};

/// The same for a 2-D block table: row b starts at b * max_pages_per_request and holds
/// ceil(seq_lens[b] / page_size) pages.
struct BlockRows {
  BlockTableView table;  // device arrays
  const TableAge* age;   // [1] or null: the table's age (BlockTagCheckArguments::device_built_at)
  SLIMSERVE_HOST_DEVICE std::int32_t batch_size() const { return table.batch_size; }
  SLIMSERVE_HOST_DEVICE std::int32_t page_size() const { return table.page_size; }
  SLIMSERVE_DEVICE bool row(int b, std::int64_t& begin, std::int32_t& count,
                            std::int64_t& tokens) const {
    tokens = table.seq_lens[b];
    begin = static_cast<std::int64_t>(b) * table.max_pages_per_request;
    const bool ok =
        tokens >= 0 &&
        tokens <= static_cast<std::int64_t>(table.max_pages_per_request) * table.page_size;
    count = ok ? static_cast<std::int32_t>((tokens + table.page_size - 1) / table.page_size) : 0;
    return ok;
  }
  SLIMSERVE_DEVICE PageId page(std::int64_t entry) const { return table.block_table[entry]; }
  SLIMSERVE_DEVICE PageTag expected(std::int64_t entry) const { return table.expected_tags[entry]; }
  SLIMSERVE_DEVICE const TableAge* built_at() const { return age; }
};

template <class Rows>
struct TagCheckParams {
  Rows rows;                          // CsrRows or BlockRows
  const DevicePageTag* page_tags;     // [num_pages], the device tag array
  std::int32_t num_pages;
  const WriterId* writers;            // [rows.batch_size()] or null: nobody (reads only)
  const std::int32_t* append_indptr;  // [rows.batch_size() + 1] or null: no request writes
  const PageFillWord* page_fills;     // [num_pages] or null: lengths are not checked
  const TableAge* synced_age;         // [1]: what the last sync uploaded (DeviceTagArray)
  RequestStatus* statuses;            // [rows.batch_size()]
  std::int32_t* aborted_count;        // [1] or null; incremented once per failing request
};

struct TagCheckSharedStorage {
  std::int32_t first_failed_slot;  // the request's lowest failing slot (INT32_MAX: none)
};

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
      params.page_tags[update.page] = DevicePageTag{update.tag, update.writer};
    }
  }
}

/// One block per request, one thread per page-table entry (a thread takes entries
/// BlockThreads apart when the request has more): every entry's access verdict
/// (page_access_verdict: read for the pages this step only reads, write for the pages its
/// appended tokens land in) is computed in parallel, and a shared atomicMin finds the first
/// failing slot, so the verdict is the same on every run. Latency-bound: two dependent loads
/// (entry, then the page's tag word) per entry and two barriers per request.
template <int BlockThreads, class Rows>
__global__ void __launch_bounds__(BlockThreads)
    check_page_tags_kernel(TagCheckParams<Rows> params) {
  constexpr std::int32_t none = 0x7FFFFFFF;
  auto& shared = rt::shared_storage<TagCheckSharedStorage>();
  const int request = static_cast<int>(blockIdx.x);
  const int thread = static_cast<int>(threadIdx.x);
  std::int64_t begin = 0;
  std::int32_t count = 0;
  std::int64_t tokens = 0;
  bool shape_ok = params.rows.row(request, begin, count, tokens);
  // Slots at and after first_write receive this step's appended tokens.
  std::int32_t first_write = count;
  std::int64_t appended = 0;
  if (shape_ok && params.append_indptr != nullptr) {
    appended = params.append_indptr[request + 1] - params.append_indptr[request];
    shape_ok = appended >= 0 && appended <= tokens;
    if (shape_ok && appended > 0) {
      first_write = static_cast<std::int32_t>((tokens - appended) / params.rows.page_size());
    }
  }
  // A mirror that knows its age: a table built after changes the device tags never received
  // (a graph replayed after a skipped sync) is refused whole. One word per request, beside
  // the row's own loads (block-uniform).
  RequestState refusal = shape_ok ? RequestState::ok : RequestState::bad_page_table;
  if (const TableAge* built = params.rows.built_at(); built != nullptr && params.synced_age != nullptr) {
    if (table_is_newer_than_tags(*built, *params.synced_age)) refusal = RequestState::tags_not_synced;
  }
  if (refusal != RequestState::ok) {  // the host validates; this is the backstop (block-uniform branch)
    if (thread == 0) {
      params.statuses[request] = RequestStatus{refusal, 0};
      if (params.aborted_count != nullptr) atomicAdd(params.aborted_count, 1);
    }
    return;
  }
  const WriterId me = params.writers != nullptr ? params.writers[request] : no_writer;
  if (thread == 0) shared.first_failed_slot = none;
  __syncthreads();
  RequestState my_state = RequestState::ok;
  std::int32_t my_slot = none;
  const std::int64_t committed = tokens - appended;  // tokens already in the pages
  const std::int32_t page_size = params.rows.page_size();
  for (std::int32_t slot = thread; slot < count; slot += BlockThreads) {
    const PageId page = params.rows.page(begin + slot);
    const PageTag expected = params.rows.expected(begin + slot);
    // The fill is loaded beside the tag (both depend only on the entry), so device-held
    // lengths add a load per entry but no step to the chain of dependent loads.
    const bool fill_checked =
        params.page_fills != nullptr && page >= 0 && page < params.num_pages;
    const PageFillWord fill = fill_checked ? params.page_fills[page] : PageFillWord{0};
    RequestState verdict = page_access_verdict(
        params.page_tags, params.num_pages, page, expected, me,
        slot >= first_write ? PageAccess::write : PageAccess::read);
    if (verdict == RequestState::ok && fill_checked) {
      // Device-held lengths: what this generation of the page holds.
      const std::int32_t written = written_slots(fill, expected);
      const std::int64_t before = committed - static_cast<std::int64_t>(slot) * page_size;
      if (slot < first_write) {  // read: every slot the row claims must have been written
        const std::int64_t claimed = before < page_size ? before : page_size;
        if (written < claimed) verdict = RequestState::unwritten_slots;
      } else {  // write: the append starts exactly at the next unwritten slot
        const std::int64_t next = before > 0 ? before : 0;
        if (written != next) {
          verdict = written > next ? RequestState::append_not_next : RequestState::unwritten_slots;
        }
      }
    }
    if (verdict != RequestState::ok) {  // later slots of this thread cannot be first
      my_state = verdict;
      my_slot = slot;
      break;
    }
  }
  if (my_slot != none) atomicMin(&shared.first_failed_slot, my_slot);
  __syncthreads();
  const std::int32_t first = shared.first_failed_slot;
  if (first == none ? thread == 0 : my_slot == first) {  // exactly one thread reports
    params.statuses[request] =
        first == none ? RequestStatus{RequestState::ok, -1} : RequestStatus{my_state, first};
    if (first != none && params.aborted_count != nullptr) atomicAdd(params.aborted_count, 1);
  }
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
