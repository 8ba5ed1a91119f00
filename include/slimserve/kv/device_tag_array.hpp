#pragma once
/// \file
/// \brief The device's copy of every page's current generation tag and write owner
/// (DevicePageTag), kept in step with a PagePool on a stream.
///
/// `sync(pool, stream)` uploads what changed since the last sync: only the changed entries
/// (a small scatter kernel) when few changed, the whole array (one copy) when that is cheaper.
/// Call it once per scheduler step, before the step's tag check, on the same stream.
///
/// Staging memory is double-buffered pinned host memory: the buffer written by sync N is
/// written again by sync N+2, so sync N's copy must have completed by then (engines that wait
/// for each step's output, as all do, satisfy this).

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/kv/detail/pinned_array.hpp"
#include "slimserve/kv/page_pool.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/kv/tag_update.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

/// What to record when building a step's tables from `pool` (TableAge: page_table_view.hpp).
inline TableAge table_age(const PagePool& pool) noexcept {
  return TableAge{pool.change_epoch(), pool.tag_base()};
}

class DeviceTagArray {
 public:
  /// Device and staging memory for a pool of `num_pages` pages (guard page included).
  static Result<DeviceTagArray> create(std::int32_t num_pages);

  /// Uploads the pool's changed tags and clears the pool's dirty list.
  Status sync(PagePool& pool, cudaStream_t stream);

  /// Device tags and write owners, [num_pages].
  const DevicePageTag* data() const noexcept { return tags_.data(); }
  /// Device-held fill of every page, [num_pages] (page_access.hpp): written by the kernels
  /// that write pages, never by sync. All zero (nothing written) at creation.
  PageFillWord* fills() const noexcept { return fills_.data(); }
  std::int32_t num_pages() const noexcept { return num_pages_; }
  /// Above this many changed entries, sync uploads the whole array.
  std::int32_t scatter_capacity() const noexcept { return scatter_capacity_; }

  /// The pool epoch (PagePool::change_epoch) the device tags reflect, and which pool
  /// (tag_base); synced() is false before the first sync.
  std::uint64_t synced_epoch() const noexcept { return synced_epoch_; }
  PageTag synced_pool() const noexcept { return synced_pool_; }
  bool synced() const noexcept { return synced_; }
  /// The same on the device ([1], written by every sync on its stream; epoch 0 before the
  /// first): what the check compares a table's PageTableView::built_at with.
  const TableAge* synced_age() const noexcept { return age_.data(); }

  /// For tests: how the last sync travelled.
  enum class LastSync { nothing, scatter, whole_array };
  LastSync last_sync() const noexcept { return last_sync_; }

 private:
  Status upload_age(const PagePool& pool, cudaStream_t stream);

  rt::DeviceBuffer<DevicePageTag> tags_;        // [num_pages]
  rt::DeviceBuffer<PageFillWord> fills_;        // [num_pages], device-written only
  rt::DeviceBuffer<TagUpdate> updates_;         // [2, 1 + scatter_capacity]: header, entries
  detail::PinnedArray<TagUpdate> staging_;      // [2, 1 + scatter_capacity]: header, entries
  detail::PinnedArray<DevicePageTag> mirror_;   // [2, num_pages]
  rt::DeviceBuffer<TableAge> age_;              // [1]: the epoch and pool of the last sync
  detail::PinnedArray<TableAge> age_staging_;   // [2], used in turn like the staging above
  std::int32_t num_pages_ = 0;
  std::int32_t scatter_capacity_ = 0;
  int next_slot_ = 0;
  std::uint64_t synced_epoch_ = 0;
  PageTag synced_pool_ = 0;
  bool synced_ = false;
  LastSync last_sync_ = LastSync::nothing;
};

}  // namespace kv
SLIMSERVE_NAMESPACE_END
