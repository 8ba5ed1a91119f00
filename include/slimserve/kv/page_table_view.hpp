#pragma once
/// \file
/// \brief Non-owning views of a batch's page table in device memory, as kernels take them.
///
/// CSR form (FlashInfer's and most engines'): request b owns pages
/// `indices[indptr[b] .. indptr[b+1])`, in order; its length in tokens is
/// `(indptr[b+1] - indptr[b] - 1) * page_size + last_page_len[b]` with
/// `1 <= last_page_len[b] <= page_size`; a request with no pages has length 0 and
/// `last_page_len[b] == 0` (the host validators, the planners and the GPU tag check all
/// enforce this one rule).
/// `expected_tags[j]` is the generation tag the owner recorded for `indices[j]`; the GPU tag
/// check compares it with the page's current tag. All arrays are int32/uint32 device pointers.

#include <cstdint>

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

using PageId = std::int32_t;
using PageTag = std::uint32_t;

inline constexpr PageId guard_page_id = 0;
inline constexpr PageTag guard_page_tag = 0;
/// The tag no handle of a real page carries (the first pool's never-owned pages have it).
inline constexpr PageTag never_owned_tag = 0;

/// The age of a step's tables: the pool's epoch (PagePool::change_epoch) and identity
/// (tag_base) when they were built (kv::table_age). The tag check refuses tables built at a
/// later epoch than the device tags were synced at (changes the device has not seen), or for
/// another pool: on the host when given as the check's built_at, on the device when the table
/// carries it (PageTableView::built_at, compared with DeviceTagArray::synced_age()).
struct TableAge {
  std::uint64_t epoch = 0;  ///< 0: not recorded (no refusal)
  PageTag pool = 0;
  std::uint32_t reserved = 0;  ///< no padding: the word is copied to the device as bytes
};
static_assert(sizeof(TableAge) == 16, "TableAge is one 16-byte device word");

/// The device-side rule, the same as the host's: refuse a table built after the last sync
/// (or from another pool). `synced` is what the last sync uploaded (epoch 0: never synced).
SLIMSERVE_HOST_DEVICE constexpr bool table_is_newer_than_tags(const TableAge& built,
                                                              const TableAge& synced) {
  return built.epoch != 0 && (built.pool != synced.pool || built.epoch > synced.epoch);
}

struct PageTableView {
  const std::int32_t* indptr = nullptr;         ///< [batch_size + 1]
  const PageId* indices = nullptr;              ///< [indptr[batch_size]]
  const std::int32_t* last_page_len = nullptr;  ///< [batch_size]
  const PageTag* expected_tags = nullptr;       ///< [indptr[batch_size]], parallel to indices
  std::int32_t batch_size = 0;
  std::int32_t page_size = 0;  ///< tokens per page
  /// Bounded rows. The entries built for this table (one int32, [1], next to the arrays: the
  /// builder writes it and the upload copies it, separately from indptr) and the capacity of
  /// the indices / expected_tags buffers. The tag check refuses (bad_page_table) a request
  /// whose indptr range leaves [0, *num_entries) or [0, entry_capacity), so a corrupted indptr
  /// cannot reach entries left in the buffer by an earlier, larger table. Null / 0: unbounded
  /// (tables assembled by hand, the C ABI).
  const std::int32_t* num_entries = nullptr;
  std::int64_t entry_capacity = 0;
  /// A mirror that knows its age, on the device: the table's TableAge (one word, [1], copied
  /// with the table). The check refuses every request (tags_not_synced) when it is newer than
  /// the device tags' synced_age(), so a captured graph replayed after a skipped sync touches
  /// no page. Null: not compared on the device.
  const TableAge* built_at = nullptr;
};

/// 2-D block-table form ([batch_size, max_pages_per_request], row-major) for engines that use it.
struct BlockTableView {
  const PageId* block_table = nullptr;        ///< [batch_size, max_pages_per_request]
  const PageTag* expected_tags = nullptr;     ///< [batch_size, max_pages_per_request]
  const std::int32_t* seq_lens = nullptr;     ///< [batch_size] tokens per request
  std::int32_t batch_size = 0;
  std::int32_t max_pages_per_request = 0;
  std::int32_t page_size = 0;
  // (No age word here: the C ABI's slimserve_block_table_view shares this layout.)
};

/// Tokens in request b (reads the view's arrays: call where they are addressable).
SLIMSERVE_HOST_DEVICE constexpr std::int64_t request_length(const PageTableView& table, int b) {
  const std::int32_t pages = table.indptr[b + 1] - table.indptr[b];
  return pages == 0 ? 0
                    : static_cast<std::int64_t>(pages - 1) * table.page_size +
                          table.last_page_len[b];
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
