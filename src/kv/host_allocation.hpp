#pragma once
// Host bookkeeping of the KV factories: a size the machine cannot hold is refused with
// resource_exhausted before anything is allocated, and an allocation that still fails is
// caught here, so std::bad_alloc never leaves the API (engines built without exception
// handling would terminate).
#include <cstdint>
#include <new>
#include <stdexcept>

#include <unistd.h>

#include "slimserve/config.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv::detail {

/// The machine's physical memory in bytes (0 when unknown: no bound is applied).
inline std::uint64_t physical_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_bytes = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_bytes);
}

/// Refuses `bytes` of host bookkeeping for `what` when they exceed the physical memory: such
/// an allocation either fails or, with overcommit, is killed when first touched.
inline Status check_host_bytes(std::uint64_t bytes, const char* what) {
  const std::uint64_t physical = physical_memory_bytes();
  if (physical != 0 && bytes > physical) {
    return make_status(StatusCode::resource_exhausted, what, " needs ", bytes,
                       " bytes of host memory; the machine has ", physical);
  }
  return {};
}

/// Runs `allocate` (which sizes containers), turning allocation failures into
/// resource_exhausted naming `what`.
template <class Allocate>
Status allocate_or_refuse(const char* what, std::uint64_t bytes, Allocate&& allocate) noexcept {
  try {
    allocate();
    return {};
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  return make_status(StatusCode::resource_exhausted, what, ": allocating ", bytes,
                     " bytes of host memory failed");
}

}  // namespace kv::detail
SLIMSERVE_NAMESPACE_END
