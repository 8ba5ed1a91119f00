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
};

struct RequestStatus {
  RequestState state;
  std::int32_t failed_slot;  ///< index into the request's page list that failed; -1 when ok
};
static_assert(sizeof(RequestStatus) == 8, "RequestStatus is shared with device code");

SLIMSERVE_HOST_DEVICE constexpr bool request_ok(const RequestStatus& status) {
  return status.state == RequestState::ok;
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
