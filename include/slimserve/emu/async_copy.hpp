#pragma once
/// \file
/// \brief Emulated cp.async: copies are queued per thread and happen only at the wait that
/// covers their group, so reading shared memory without the wait sees the 0xFF poison.
/// Copies still pending when the thread exits are dropped.

#include <cstdint>
#include <cstring>
#include <string>

#include "slimserve/config.hpp"
#include "slimserve/emu/scheduler.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

/// One copy of `bytes` (4, 8 or 16; PTX requires both addresses aligned to it).
inline void async_copy(void* destination, const void* source, unsigned bytes, bool zero_fill,
                       const char* what) {
  EmulatedThread& self = this_thread(what);
  const auto dst = reinterpret_cast<std::uintptr_t>(destination);
  const auto src = reinterpret_cast<std::uintptr_t>(source);
  if (dst % bytes != 0 || (!zero_fill && src % bytes != 0)) {
    fail_this_thread(std::string(what) + ": addresses must be " + std::to_string(bytes) +
                     "-byte aligned (shared " + std::to_string(dst) + ", global " + std::to_string(src) + ")");
  }
  self.async_copies.copies.push_back(AsyncCopy{destination, source, zero_fill, 0, bytes});
}

inline void async_copy_16(void* destination, const void* source, bool zero_fill,
                          const char* what) {
  async_copy(destination, source, 16, zero_fill, what);
}

inline void async_copy_commit() {
  AsyncCopyQueue& queue = this_thread("cp_async_commit").async_copies;
  ++queue.committed_groups;
  for (AsyncCopy& copy : queue.copies) {
    if (copy.group == 0) copy.group = queue.committed_groups;
  }
}

/// Completes the oldest committed groups until at most `pending` remain.
inline void async_copy_wait(int pending) {
  AsyncCopyQueue& queue = this_thread("cp_async_wait").async_copies;
  const auto allowed = static_cast<std::uint64_t>(pending < 0 ? 0 : pending);
  while (queue.committed_groups - queue.completed_groups > allowed) {
    ++queue.completed_groups;
    std::size_t done = 0;
    for (const AsyncCopy& copy : queue.copies) {
      if (copy.group != queue.completed_groups) break;
      if (copy.zero_fill) {
        std::memset(copy.destination, 0, copy.bytes);
      } else {
        std::memcpy(copy.destination, copy.source, copy.bytes);
      }
      ++done;
    }
    queue.copies.erase(queue.copies.begin(),
                       queue.copies.begin() + static_cast<std::ptrdiff_t>(done));
  }
}

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END
