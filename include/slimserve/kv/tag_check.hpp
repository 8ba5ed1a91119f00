#pragma once
/// \file
/// \brief The GPU tag check (host façade): compares every entry of a batch's page table with
/// the device tag array and writes one RequestStatus per request.
///
/// Launch it as its own step after the page table and the tag array reached the device and
/// before any kernel that reads or writes pages; those kernels take the statuses and skip
/// requests that are not ok. No host synchronization; fixed launch shape for a given batch
/// size, so it can be captured in a CUDA graph.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "slimserve/config.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_access.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

/// Write ownership: give every request's identity (`writers`, the WriterId its pages were
/// granted to) and, for a step that appends, the same `append_indptr` the append kernel takes
/// (request b appends its last append_indptr[b+1] - append_indptr[b] tokens). The pages those
/// tokens land in must be writable by the request (write_denied otherwise); every other page
/// must be read-only or the request's own (read_denied otherwise). Without `writers` every
/// request reads as nobody: pages that a request holds write rights to fail the check.
struct TagCheckArguments {
  PageTableView table;                      ///< device arrays (upload_page_table)
  const DeviceTagArray* page_tags = nullptr;
  RequestStatus* statuses = nullptr;        ///< device, [table.batch_size]
  std::int32_t* aborted_count = nullptr;    ///< device, [1], optional: number of failing requests
  const WriterId* writers = nullptr;        ///< device, [table.batch_size], optional
  const std::int32_t* append_indptr = nullptr;  ///< device, [table.batch_size + 1], optional
  /// Device-held lengths: also compare each row with the fill the device recorded for its
  /// pages (DeviceTagArray::fills(), written by append_kv / copy_pages / import_request /
  /// swap-in when they are given it): a read of a slot never written in the page's current
  /// generation fails (unwritten_slots), and so does an append that does not start at the
  /// page's next unwritten slot (append_not_next). Only for engines whose page-writing kernels
  /// all record fills.
  bool check_fill = false;
  /// A mirror that knows its age: table_age(pool) taken when the table was built. The check
  /// refuses on the host (failed_precondition, nothing launched) a table built after changes
  /// the last sync did not carry, or from another pool than the one synced.
  TableAge built_at{};
};

/// The same for the 2-D block-table form.
struct BlockTagCheckArguments {
  BlockTableView table;                     ///< device arrays (upload_block_table)
  const DeviceTagArray* page_tags = nullptr;
  RequestStatus* statuses = nullptr;        ///< device, [table.batch_size]
  std::int32_t* aborted_count = nullptr;    ///< device, [1], optional: number of failing requests
  const WriterId* writers = nullptr;        ///< device, [table.batch_size], optional
  const std::int32_t* append_indptr = nullptr;  ///< device, [table.batch_size + 1], optional
  bool check_fill = false;                  ///< as TagCheckArguments::check_fill
  TableAge built_at{};                      ///< as TagCheckArguments::built_at
  /// As PageTableView::built_at (the 2-D view has no room for it): the table's age on the
  /// device, [1] (BlockTableStorage::device().built_at after upload_block_table copied it),
  /// compared with the device tags' synced_age(); every request is refused
  /// (tags_not_synced) when it is newer. Null: not compared on the device.
  const TableAge* device_built_at = nullptr;
};

/// Preflight only (pointers, sizes); nothing is launched. check_page_tags runs it first.
Status can_implement(const TagCheckArguments& arguments);
Status can_implement(const BlockTagCheckArguments& arguments);

/// Enqueues the check on `stream`. Host preflight only (pointers, sizes); the verdicts are on
/// the device when the stream reaches them.
Status check_page_tags(const TagCheckArguments& arguments, cudaStream_t stream);
Status check_page_tags(const BlockTagCheckArguments& arguments, cudaStream_t stream);

/// Copies `host.size()` statuses from the device (asynchronously; pinned host memory for a
/// true async copy).
Status copy_statuses_to_host(const RequestStatus* device_statuses, std::span<RequestStatus> host,
                             cudaStream_t stream);

constexpr std::string_view to_string(RequestState state) noexcept {
  switch (state) {
    case RequestState::ok: return "ok";
    case RequestState::stale_tag: return "stale tag";
    case RequestState::page_out_of_range: return "page out of range";
    case RequestState::bad_page_table: return "bad page table";
    case RequestState::guard_page: return "guard page inside the request's pages";
    case RequestState::write_denied: return "write to a page the request does not own";
    case RequestState::read_denied: return "read of a page another request is writing";
    case RequestState::unwritten_slots: return "length past the slots written in the page";
    case RequestState::append_not_next: return "append not at the page's next unwritten slot";
    case RequestState::record_mismatch: return "record of another request, stale or corrupted";
    case RequestState::tags_not_synced: return "table built after changes the device tags lack";
  }
  return "unknown";
}

struct AbortedRequest {
  std::int32_t request = 0;  ///< index in the batch
  RequestStatus status{};
};

/// The requests whose status is not ok (after the copy completed); `out` is cleared first.
void collect_aborted(std::span<const RequestStatus> statuses, std::vector<AbortedRequest>& out);

}  // namespace kv
SLIMSERVE_NAMESPACE_END
