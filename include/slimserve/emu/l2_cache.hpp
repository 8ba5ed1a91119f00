#pragma once
/// \file
/// \brief Emulated L2 cache controls. The emulator has no L2: a cache policy is a token, a
/// hinted store is the plain store, and `discard.global.L2` does what the PTX ISA allows
/// the hardware to do at its worst: the 128 bytes become indeterminate. They are filled with
/// 0xFF (an FP32 NaN), so a kernel that reads a line after discarding it fails its test.

#include <cstdint>
#include <cstring>
#include <string>

#include "slimserve/config.hpp"
#include "slimserve/emu/scheduler.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

inline constexpr std::size_t l2_line_bytes = 128;

inline void discard_l2_line(void* line, const char* what) {
  this_thread(what);
  const auto address = reinterpret_cast<std::uintptr_t>(line);
  if (line == nullptr || address % l2_line_bytes != 0) {
    fail_this_thread(std::string(what) + ": the address must be a non-null global address " +
                     "aligned to 128 bytes (got " + std::to_string(address) + ")");
  }
  std::memset(line, 0xFF, l2_line_bytes);
}

inline void check_store_alignment(const void* address, std::size_t alignment, const char* what) {
  this_thread(what);
  const auto value = reinterpret_cast<std::uintptr_t>(address);
  if (address == nullptr || value % alignment != 0) {
    fail_this_thread(std::string(what) + ": the address must be " + std::to_string(alignment) +
                     "-byte aligned (got " + std::to_string(value) + ")");
  }
}

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END
