#pragma once
/// \file
/// \brief Builds a batch's page table, CSR or 2-D block table, with the expected tag of every
/// entry, into caller-owned host buffers (pinned, so the upload can be asynchronous).
///
/// Everything is validated before a byte is written: a bad batch returns an error and leaves
/// the buffers untouched. `upload_page_table` / `upload_block_table` (device_page_table.hpp)
/// then copy the host arrays to the device on a stream. Plain C++: no CUDA headers.

#include <cstdint>
#include <span>

#include "slimserve/config.hpp"
#include "slimserve/kv/page_pool.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

/// One request of the batch, as the scheduler holds it.
struct RequestPages {
  std::span<const PageHandle> pages;  ///< in sequence order
  std::int64_t num_tokens = 0;        ///< tokens stored in those pages (0 when no pages)
};

/// Caller-owned host arrays for the CSR form.
struct PageTableHostBuffers {
  std::int32_t* indptr = nullptr;         ///< [max_batch + 1]
  PageId* indices = nullptr;              ///< [max_entries]
  std::int32_t* last_page_len = nullptr;  ///< [max_batch]
  PageTag* expected_tags = nullptr;       ///< [max_entries]
  std::int32_t max_batch = 0;
  std::int64_t max_entries = 0;
  /// [1], optional: the builder writes the entry count here too, so the table carries it
  /// apart from indptr (PageTableView::num_entries).
  std::int32_t* num_entries = nullptr;
  /// [1], optional: the table's age. The caller writes `*built_at = kv::table_age(pool)` when
  /// it builds the step's table; the table view carries the pointer and upload_page_table
  /// copies the word, so the check compares it with the device tags' age on the device.
  TableAge* built_at = nullptr;
};

/// Caller-owned host arrays for the 2-D form; unused entries of a row get the guard page.
struct BlockTableHostBuffers {
  PageId* block_table = nullptr;      ///< [max_batch, max_pages_per_request]
  PageTag* expected_tags = nullptr;   ///< [max_batch, max_pages_per_request]
  std::int32_t* seq_lens = nullptr;   ///< [max_batch]
  std::int32_t max_batch = 0;
  std::int32_t max_pages_per_request = 0;
  /// [1], optional: the table's age, as PageTableHostBuffers::built_at (the caller writes
  /// `*built_at = kv::table_age(pool)` when it builds the step's table); upload_block_table
  /// copies it when given it.
  TableAge* built_at = nullptr;
};

/// The shape every table shares: tokens per page and the pool's page count (ids are checked
/// against it).
struct PageTableShape {
  std::int32_t page_size = 0;
  std::int32_t num_pages = 0;
};

/// Fills `host` with the CSR table of `requests` and returns a view of the host arrays.
Result<PageTableView> build_page_table(std::span<const RequestPages> requests,
                                       const PageTableShape& shape,
                                       const PageTableHostBuffers& host);

/// Fills `host` with the 2-D table of `requests` and returns a view of the host arrays.
Result<BlockTableView> build_block_table(std::span<const RequestPages> requests,
                                         const PageTableShape& shape,
                                         const BlockTableHostBuffers& host);

/// Checks a CSR table in host memory (one an engine built itself, or before an upload):
/// indptr starts at 0 and never decreases, last_page_len in 1..page_size (0 for a request
/// with no pages), page ids in [0, num_pages), no guard page (page 0) inside a request's pages
/// and no page carrying never_owned_tag. The row structure is checked before any entry is read;
/// give `max_entries` (the length of indices / expected_tags) to also bound indptr[batch_size].
/// A table that carries its bounds (num_entries, entry_capacity) is also checked against them.
Status validate_page_table(const PageTableView& host_table, std::int32_t num_pages,
                           std::int64_t max_entries = -1);

/// The same checks for the 2-D form: seq_lens fit in max_pages_per_request pages; entries past
/// a request's pages may be anything, since kernels never read them.
Status validate_block_table(const BlockTableView& host_table, std::int32_t num_pages);

}  // namespace kv
SLIMSERVE_NAMESPACE_END
