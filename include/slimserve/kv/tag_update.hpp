#pragma once
/// \file
/// \brief The record that carries changed page tags to the device (shared by the host-side
/// DeviceTagArray and the scatter kernel).

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/kv/page_access.hpp"
#include "slimserve/kv/page_table_view.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

/// One changed entry of the device tag array: the page's tag and write owner.
struct TagUpdate {
  PageId page;
  PageTag tag;
  WriterId writer;
};
static_assert(sizeof(TagUpdate) == 12, "TagUpdate is copied to the device as is");

/// A batch of changes travels in one copy as `TagUpdate[1 + count]`: entry 0 is a header
/// whose `page` field holds `count` (so the scatter kernel reads the count on the device),
/// then the changed entries.
inline constexpr PageId tag_batch_header_slots = 1;

}  // namespace kv
SLIMSERVE_NAMESPACE_END
