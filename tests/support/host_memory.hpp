#pragma once
// The machine's physical memory, for tests that ask a factory for more than the host holds.
#include <cstdint>

#include <unistd.h>

namespace slimserve_test {

inline std::uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_bytes > 0
             ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_bytes)
             : 0;
}

}  // namespace slimserve_test
