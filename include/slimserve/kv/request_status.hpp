#pragma once
/// \file
/// \brief The per-request verdict of the GPU tag check, read by every kernel that touches pages.
///
/// The tag-check kernel writes one RequestStatus per request before attention or append runs.
/// Kernels that read or write KV pages take a `const RequestStatus*` (device memory) and skip a
/// request whose state is not `ok`: they touch none of its pages and mark its output instead.
/// Plain C++: usable on the host, in nvcc device code and in the CPU emulator.

#include <cstdint>

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

enum class RequestState : std::int32_t {
  ok = 0,
  stale_tag = 1,          ///< a page's current tag differs from the tag the page table expects
  page_out_of_range = 2,  ///< a page id outside [0, num_pages)
  bad_page_table = 3,     ///< indptr/last_page_len inconsistent (caught on device as a backstop)
  guard_page = 4,         ///< the guard page (page 0) inside the request's pages: padding only
  write_denied = 5,       ///< a page this step writes is not exclusively the request's (shared,
                          ///< cached, free, or writable by another request)
  read_denied = 6,        ///< a page another request holds write rights to
  unwritten_slots = 7,    ///< the row claims more tokens in a page than the device recorded
                          ///< written in its generation (a length past the request: +1)
  append_not_next = 8,    ///< an append that does not start at the page's next unwritten slot
                          ///< (a shortened or replayed table would overwrite written tokens)
  record_mismatch = 9,    ///< swap-in / import: the record's header names another request, pool,
                          ///< sequence, index or length, or its checksum fails (nothing written)
  tags_not_synced = 10,   ///< the table was built after changes the device tags were never
                          ///< synced with, or from another pool (a replay after a skipped sync)
};

struct RequestStatus {
  RequestState state;
  std::int32_t failed_slot;  ///< index into the request's page list that failed; -1 when ok
};
static_assert(sizeof(RequestStatus) == 8, "RequestStatus is shared with device code");

SLIMSERVE_HOST_DEVICE constexpr bool request_ok(const RequestStatus& status) {
  return status.state == RequestState::ok;
}

/// THE gate of every kernel that reads or writes a request's pages after the tag check: true
/// when the check let request `request` through (or no statuses were given). The check already
/// applied each page's access rule (reads: generation matches and the page is read-only or the
/// request's own; writes: the request holds the page's write right), so one call per request
/// is the whole gate. Kernels that take their page list outside a checked page table (page
/// copies, swaps, exports) gate each page with kv::page_access_verdict (page_access.hpp).
SLIMSERVE_HOST_DEVICE constexpr bool may_touch_pages(const RequestStatus* statuses, int request) {
  return statuses == nullptr || statuses[request].state == RequestState::ok;
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
