#pragma once
/// \file
/// \brief The device-side update of a page's fill (page_access.hpp: PageFillWord): what the
/// kernels that write pages (append, copy_pages, import_request, swap-in) call after a write.
///
/// Within one launch every writer of a page carries the same tag (the table's expected tag,
/// which the check matched against the page), so the update keeps the largest count of that
/// generation and replaces a fill of any other generation. Launches on one stream are ordered,
/// so no generation ever races another; a compare-and-swap (not a max over the packed word)
/// keeps the rule correct when tags start over after ~4 billion.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/kv/page_access.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

/// Records that slots [0, filled) of `page` hold generation `tag`'s tokens.
SLIMSERVE_DEVICE inline void record_page_fill(PageFillWord* fills, PageId page, PageTag tag,
                                              std::int32_t filled) {
  PageFillWord seen = atomicAdd(fills + page, PageFillWord{0});  // an atomic load
  for (;;) {
    const std::int32_t kept = written_slots(seen, tag);
    if (static_cast<PageTag>(seen) == tag && kept >= filled) return;
    const PageFillWord wanted = pack_page_fill(tag, filled);
    const PageFillWord previous = atomicCAS(fills + page, seen, wanted);
    if (previous == seen) return;
    seen = previous;
  }
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
