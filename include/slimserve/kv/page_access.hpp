#pragma once
/// \file
/// \brief Who may touch a page: the device copy of a page's generation tag and write owner, and
/// the one rule every page-touching kernel applies to it.
///
/// A page is either *exclusively owned* by one request, identified by a WriterId (the only
/// request allowed to write it, and the only one allowed to read it while it is writable), or
/// *read-only* (writer == no_writer: shared by several holders, kept by the prefix cache, or
/// free). PagePool keeps both fields per page; DeviceTagArray mirrors them on the device as one
/// 8-byte DevicePageTag, so a check costs one load per page-table entry.
///
/// The rule (page_access_verdict), for request `me` touching entry (page, expected tag):
///   - page outside [0, num_pages)            -> page_out_of_range
///   - page 0, the guard page                 -> guard_page (padding only, never inside a range)
///   - tag != expected, or expected is 0      -> stale_tag (the page has had another owner)
///   - write: writer != me (or me is none)    -> write_denied
///   - read:  writer is another request       -> read_denied
/// Plain C++: usable on the host, in nvcc device code and in the CPU emulator.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/kv/request_status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

/// A request's identity as a page writer. Issued by PagePool::new_writer (RequestPageSets does
/// it on admit and resume): never reused within 2^32 - 1 identities of a pool, so a reused
/// request slot is a new identity.
using WriterId = std::uint32_t;
/// Nobody may write the page (shared, cached or free); every holder of its tag may read it.
inline constexpr WriterId no_writer = 0;

/// The device's view of one page: its generation tag and its write owner.
struct alignas(8) DevicePageTag {
  PageTag tag = 0;
  WriterId writer = no_writer;
};
static_assert(sizeof(DevicePageTag) == 8, "one 8-byte load per page-table entry");

enum class PageAccess : std::uint8_t { read, write };

/// Device-held fill: how many slots of a page are written, and in which generation (the tag
/// the writer's table expected). Written only by device kernels (append, copy_pages,
/// import_request, swap-in: page_fill.cuh), never by the host, so a table cannot claim more
/// than was written: a slot count is only believed under the page's current tag, and a page
/// with a new owner (a new tag) starts with nothing written. One 8-byte word per page (the
/// tag in the low half, the count in the high half), updated with a compare-and-swap.
using PageFillWord = unsigned long long;
SLIMSERVE_HOST_DEVICE constexpr PageFillWord pack_page_fill(PageTag tag, std::int32_t filled) {
  return static_cast<PageFillWord>(static_cast<std::uint32_t>(filled)) << 32 | tag;
}
/// Slots of the page written under generation `expected` (0 when the page's fill belongs to
/// another generation).
SLIMSERVE_HOST_DEVICE constexpr std::int32_t written_slots(PageFillWord fill, PageTag expected) {
  return static_cast<PageTag>(fill) == expected ? static_cast<std::int32_t>(fill >> 32) : 0;
}

/// The access rule above. `page_tags` is the device tag array ([num_pages]); the page's entry
/// is read only when `page` is in range.
SLIMSERVE_HOST_DEVICE constexpr RequestState page_access_verdict(const DevicePageTag* page_tags,
                                                                 std::int32_t num_pages,
                                                                 PageId page, PageTag expected,
                                                                 WriterId me,
                                                                 PageAccess access) {
  if (page < 0 || page >= num_pages) return RequestState::page_out_of_range;
  if (page == guard_page_id) return RequestState::guard_page;
  const DevicePageTag current = page_tags[page];
  if (current.tag != expected || expected == never_owned_tag) return RequestState::stale_tag;
  if (access == PageAccess::write) {
    return me != no_writer && current.writer == me ? RequestState::ok
                                                   : RequestState::write_denied;
  }
  return current.writer == no_writer || current.writer == me ? RequestState::ok
                                                             : RequestState::read_denied;
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
