// Page-table building and validation: every check runs before the first write.
#include "slimserve/kv/page_table_builder.hpp"

#include <limits>

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

namespace {

Status check_shape(const PageTableShape& shape) {
  if (shape.page_size < 1) {
    return make_status(StatusCode::invalid_argument, "page_size must be >= 1, got ",
                       shape.page_size);
  }
  if (shape.num_pages < 1) {
    return make_status(StatusCode::invalid_argument, "num_pages must be >= 1, got ",
                       shape.num_pages);
  }
  return {};
}

/// One table entry: the id is in range, the tag is one a handle of that page can carry.
Status check_entry(PageId page, PageTag tag, std::int32_t num_pages, std::int64_t request,
                   std::int64_t slot) {
  if (page < 0 || page >= num_pages) [[unlikely]] {
    return make_status(StatusCode::out_of_range, "request ", request, " slot ", slot,
                       ": page id ", page, " outside [0, ", num_pages, ")");
  }
  if (page == guard_page_id) [[unlikely]] {
    return make_status(StatusCode::invalid_argument, "request ", request, " slot ", slot,
                       ": the guard page (page 0) inside the request's pages; it only pads ",
                       "tables past a request's last page");
  }
  if (tag == never_owned_tag) [[unlikely]] {
    return make_status(StatusCode::invalid_argument, "request ", request, " slot ", slot,
                       ": page ", page, " with tag ", tag, " (no owner ever holds this tag)");
  }
  return {};
}

/// Pages and token count agree: a request with p > 0 pages holds (p-1)*page_size + 1 to
/// p*page_size tokens.
Status check_length(std::int64_t pages, std::int64_t tokens, std::int32_t page_size,
                    std::int64_t request) {
  const bool fits = pages == 0 ? tokens == 0
                               : tokens > (pages - 1) * page_size && tokens <= pages * page_size;
  if (!fits) [[unlikely]] {
    return make_status(StatusCode::invalid_argument, "request ", request, ": ", tokens,
                       " tokens do not fill ", pages, " pages of ", page_size,
                       " tokens (need 1..", page_size, " tokens in the last page)");
  }
  return {};
}

Status check_requests(std::span<const RequestPages> requests, const PageTableShape& shape) {
  for (std::size_t b = 0; b < requests.size(); ++b) {
    const RequestPages& request = requests[b];
    const auto count = static_cast<std::int64_t>(request.pages.size());
    const auto index = static_cast<std::int64_t>(b);
    SLIMSERVE_RETURN_IF_ERROR(check_length(count, request.num_tokens, shape.page_size, index));
    // Branch-free scan first (the hot path); the slow loop below only names the culprit.
    bool bad = false;
    for (const PageHandle page : request.pages) {
      bad |= static_cast<std::uint32_t>(page.id) >= static_cast<std::uint32_t>(shape.num_pages);
      bad |= page.id == guard_page_id;  // padding only, never inside a request's pages
      bad |= page.tag == never_owned_tag;
    }
    if (!bad) [[likely]] continue;
    for (std::int64_t slot = 0; slot < count; ++slot) {
      const PageHandle page = request.pages[static_cast<std::size_t>(slot)];
      SLIMSERVE_RETURN_IF_ERROR(check_entry(page.id, page.tag, shape.num_pages, index, slot));
    }
  }
  return {};
}

std::int32_t last_page_length(std::int64_t pages, std::int64_t tokens, std::int32_t page_size) {
  return pages == 0 ? 0 : static_cast<std::int32_t>(tokens - (pages - 1) * page_size);
}

}  // namespace

Result<PageTableView> build_page_table(std::span<const RequestPages> requests,
                                       const PageTableShape& shape,
                                       const PageTableHostBuffers& host) {
  SLIMSERVE_RETURN_IF_ERROR(check_shape(shape));
  if (host.indptr == nullptr || host.indices == nullptr || host.last_page_len == nullptr ||
      host.expected_tags == nullptr) {
    return make_status(StatusCode::invalid_argument, "a page-table host buffer is null");
  }
  if (static_cast<std::int64_t>(requests.size()) > host.max_batch) {
    return make_status(StatusCode::resource_exhausted, "batch of ", requests.size(),
                       " requests exceeds the table's capacity of ", host.max_batch);
  }
  std::int64_t entries = 0;
  for (const RequestPages& request : requests) {
    entries += static_cast<std::int64_t>(request.pages.size());
  }
  if (entries > host.max_entries || entries > std::numeric_limits<std::int32_t>::max()) {
    return make_status(StatusCode::resource_exhausted, "batch holds ", entries,
                       " pages; the table has room for ", host.max_entries);
  }
  SLIMSERVE_RETURN_IF_ERROR(check_requests(requests, shape));

  std::int32_t offset = 0;
  host.indptr[0] = 0;
  for (std::size_t b = 0; b < requests.size(); ++b) {
    const RequestPages& request = requests[b];
    for (const PageHandle page : request.pages) {
      host.indices[offset] = page.id;
      host.expected_tags[offset] = page.tag;
      ++offset;
    }
    host.indptr[b + 1] = offset;
    host.last_page_len[b] = last_page_length(static_cast<std::int64_t>(request.pages.size()),
                                             request.num_tokens, shape.page_size);
  }
  if (host.num_entries != nullptr) *host.num_entries = offset;
  return PageTableView{host.indptr,        host.indices,
                       host.last_page_len, host.expected_tags,
                       static_cast<std::int32_t>(requests.size()), shape.page_size,
                       host.num_entries,   host.max_entries,
                       host.built_at};
}

Result<BlockTableView> build_block_table(std::span<const RequestPages> requests,
                                         const PageTableShape& shape,
                                         const BlockTableHostBuffers& host) {
  SLIMSERVE_RETURN_IF_ERROR(check_shape(shape));
  if (host.block_table == nullptr || host.expected_tags == nullptr || host.seq_lens == nullptr) {
    return make_status(StatusCode::invalid_argument, "a block-table host buffer is null");
  }
  if (static_cast<std::int64_t>(requests.size()) > host.max_batch) {
    return make_status(StatusCode::resource_exhausted, "batch of ", requests.size(),
                       " requests exceeds the table's capacity of ", host.max_batch);
  }
  for (std::size_t b = 0; b < requests.size(); ++b) {
    if (static_cast<std::int64_t>(requests[b].pages.size()) > host.max_pages_per_request ||
        requests[b].num_tokens > std::numeric_limits<std::int32_t>::max()) {
      return make_status(StatusCode::resource_exhausted, "request ", b, " holds ",
                         requests[b].pages.size(), " pages; a row has room for ",
                         host.max_pages_per_request);
    }
  }
  SLIMSERVE_RETURN_IF_ERROR(check_requests(requests, shape));

  const auto width = static_cast<std::size_t>(host.max_pages_per_request);
  for (std::size_t b = 0; b < requests.size(); ++b) {
    PageId* ids = host.block_table + b * width;
    PageTag* tags = host.expected_tags + b * width;
    const std::span<const PageHandle> pages = requests[b].pages;
    for (std::size_t slot = 0; slot < pages.size(); ++slot) {
      ids[slot] = pages[slot].id;
      tags[slot] = pages[slot].tag;
    }
    for (std::size_t slot = pages.size(); slot < width; ++slot) {  // padding: the guard page
      ids[slot] = guard_page_id;
      tags[slot] = guard_page_tag;
    }
    host.seq_lens[b] = static_cast<std::int32_t>(requests[b].num_tokens);
  }
  return BlockTableView{host.block_table,
                        host.expected_tags,
                        host.seq_lens,
                        static_cast<std::int32_t>(requests.size()),
                        host.max_pages_per_request,
                        shape.page_size};
}

Status validate_page_table(const PageTableView& table, std::int32_t num_pages,
                           std::int64_t max_entries) {
  SLIMSERVE_RETURN_IF_ERROR(check_shape(PageTableShape{table.page_size, num_pages}));
  if (table.batch_size < 0) {
    return make_status(StatusCode::invalid_argument, "batch_size ", table.batch_size, " < 0");
  }
  if (table.indptr == nullptr || table.last_page_len == nullptr ||
      (table.batch_size > 0 && (table.indices == nullptr || table.expected_tags == nullptr))) {
    return make_status(StatusCode::invalid_argument, "a page-table array is null");
  }
  if (table.indptr[0] != 0) {
    return make_status(StatusCode::invalid_argument, "indptr[0] must be 0, got ",
                       table.indptr[0]);
  }
  // Pass 1: the row structure, so no entry is read through a bad indptr.
  for (std::int32_t b = 0; b < table.batch_size; ++b) {
    const std::int32_t begin = table.indptr[b];
    const std::int32_t end = table.indptr[b + 1];
    if (end < begin) {
      return make_status(StatusCode::invalid_argument, "indptr decreases at request ", b, ": ",
                         begin, " then ", end);
    }
    const std::int32_t len = table.last_page_len[b];
    const bool len_ok = end == begin ? len == 0 : len >= 1 && len <= table.page_size;
    if (!len_ok) {
      return make_status(StatusCode::invalid_argument, "request ", b, ": last_page_len ", len,
                         " outside 1..", table.page_size, " for ", end - begin, " pages");
    }
  }
  const std::int64_t entries = table.indptr[table.batch_size];
  if (table.num_entries != nullptr && entries != *table.num_entries) {
    return make_status(StatusCode::out_of_range, "indptr[", table.batch_size, "] = ", entries,
                       " entries, the table was built with ", *table.num_entries);
  }
  if (table.entry_capacity > 0 && entries > table.entry_capacity) {
    return make_status(StatusCode::out_of_range, "indptr[", table.batch_size, "] = ", entries,
                       " entries, the table's buffers hold ", table.entry_capacity);
  }
  if (max_entries >= 0 && entries > max_entries) {
    return make_status(StatusCode::out_of_range, "indptr[", table.batch_size, "] = ", entries,
                       " entries, the arrays hold ", max_entries);
  }
  // Pass 2: the entries.
  for (std::int32_t b = 0; b < table.batch_size; ++b) {
    for (std::int32_t j = table.indptr[b]; j < table.indptr[b + 1]; ++j) {
      SLIMSERVE_RETURN_IF_ERROR(check_entry(table.indices[j], table.expected_tags[j], num_pages,
                                            b, j - table.indptr[b]));
    }
  }
  return {};
}

Status validate_block_table(const BlockTableView& table, std::int32_t num_pages) {
  SLIMSERVE_RETURN_IF_ERROR(check_shape(PageTableShape{table.page_size, num_pages}));
  if (table.batch_size < 0 || table.max_pages_per_request < 0) {
    return make_status(StatusCode::invalid_argument, "negative batch_size ", table.batch_size,
                       " or max_pages_per_request ", table.max_pages_per_request);
  }
  if (table.batch_size > 0 &&
      (table.block_table == nullptr || table.expected_tags == nullptr || table.seq_lens == nullptr)) {
    return make_status(StatusCode::invalid_argument, "a block-table array is null");
  }
  const auto width = static_cast<std::int64_t>(table.max_pages_per_request);
  for (std::int32_t b = 0; b < table.batch_size; ++b) {
    const std::int64_t tokens = table.seq_lens[b];
    if (tokens < 0 || tokens > width * table.page_size) {
      return make_status(StatusCode::invalid_argument, "request ", b, ": seq_len ", tokens,
                         " outside 0..", width * table.page_size, " (", width, " pages of ",
                         table.page_size, ")");
    }
    const std::int64_t pages = (tokens + table.page_size - 1) / table.page_size;
    for (std::int64_t slot = 0; slot < pages; ++slot) {
      const std::int64_t at = b * width + slot;
      SLIMSERVE_RETURN_IF_ERROR(
          check_entry(table.block_table[at], table.expected_tags[at], num_pages, b, slot));
    }
  }
  return {};
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
