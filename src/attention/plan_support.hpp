#pragma once
// Pieces the attention plans share (paged attention and MLA decode): workspace alignment, and
// the search for the KV split chunk. Private to the library's plan sources.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::detail {

/// num_sms 0 (in a plan's arguments or a workspace bound) is the current device's SM count,
/// asked here once per call (the emulator's emulated count); a positive value stays.
inline Status resolve_num_sms(std::int32_t& num_sms) {
  if (num_sms != 0) return {};
  Result<std::int32_t> count = rt::current_device_sm_count();
  if (!count.ok()) return count.status();
  num_sms = *count;
  return {};
}

/// Every region of a plan's workspace starts on this boundary.
inline constexpr std::size_t plan_workspace_alignment = 256;

constexpr std::size_t align_workspace(std::size_t bytes) {
  return (bytes + plan_workspace_alignment - 1) / plan_workspace_alignment * plan_workspace_alignment;
}

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

/// The split chunk, in granules: the smallest count in [min_granules, max_granules] (the lower
/// end clamped to [1, max_granules]) for which `fits(granules)` holds — the most parallelism
/// whose work items fit one wave. `fits` must be monotone (longer chunks, fewer items); when
/// nothing fits, max_granules (no split).
template <class Fits>
std::int64_t smallest_fitting_chunk(std::int64_t min_granules, std::int64_t max_granules, Fits&& fits) {
  std::int64_t lo = std::min(max_granules, std::max<std::int64_t>(1, min_granules));
  std::int64_t hi = max_granules;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

}  // namespace attention::detail
SLIMSERVE_NAMESPACE_END
