#pragma once
/// \file
/// \brief Copies a page table built on the host (page_table_builder.hpp) into caller-owned
/// device buffers on a stream, and returns the view kernels take.
///
/// The copies are asynchronous: the host arrays (pinned, for a true async copy) must stay
/// unchanged until the stream has passed them. The host table is validated again before the
/// copy, so nothing unchecked reaches the device.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/kv/detail/pinned_array.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

/// Caller-owned device arrays for the CSR form (same capacities as the host buffers).
struct PageTableDeviceBuffers {
  std::int32_t* indptr = nullptr;         ///< [max_batch + 1]
  PageId* indices = nullptr;              ///< [max_entries]
  std::int32_t* last_page_len = nullptr;  ///< [max_batch]
  PageTag* expected_tags = nullptr;       ///< [max_entries]
  std::int32_t max_batch = 0;
  std::int64_t max_entries = 0;
  /// [1], optional: receives the entry count, so the tag check bounds every row by it
  /// (PageTableView::num_entries) and by max_entries.
  std::int32_t* num_entries = nullptr;
  /// [1], optional: receives the table's age (PageTableView::built_at) when the host table
  /// has one, for the check's device-side comparison with the tags' synced_age().
  TableAge* built_at = nullptr;
};

/// Caller-owned device arrays for the 2-D form.
struct BlockTableDeviceBuffers {
  PageId* block_table = nullptr;     ///< [max_batch, max_pages_per_request]
  PageTag* expected_tags = nullptr;  ///< [max_batch, max_pages_per_request]
  std::int32_t* seq_lens = nullptr;  ///< [max_batch]
  std::int32_t max_batch = 0;
  std::int32_t max_pages_per_request = 0;
  /// [1], optional: receives the table's age (upload_block_table's `built_at`), for
  /// BlockTagCheckArguments::device_built_at.
  TableAge* built_at = nullptr;
};

namespace detail {
/// Replaces `buffer` with a new one of `count` elements (pinned host or device array).
template <class Buffer>
Status assign_buffer(Buffer& buffer, std::size_t count) {
  auto made = Buffer::create(count);
  if (!made.ok()) return made.status();
  buffer = std::move(made).value();
  return {};
}
}  // namespace detail

/// Owns a matching pair of CSR buffer sets: pinned host staging for build_page_table and
/// device arrays for upload_page_table, both sized once for the largest batch.
class PageTableStorage {
 public:
  static Result<PageTableStorage> create(std::int32_t max_batch, std::int64_t max_entries) {
    if (max_batch < 1 || max_entries < 1) {
      return make_status(StatusCode::invalid_argument, "PageTableStorage needs max_batch >= 1 ",
                         "and max_entries >= 1, got ", max_batch, " and ", max_entries);
    }
    PageTableStorage storage;
    storage.max_batch_ = max_batch;
    storage.max_entries_ = max_entries;
    const auto rows = static_cast<std::size_t>(max_batch);
    const auto entries = static_cast<std::size_t>(max_entries);
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.h_indptr_, rows + 1));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.h_last_, rows));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.h_indices_, entries));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.h_tags_, entries));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.d_indptr_, rows + 1));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.d_last_, rows));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.d_indices_, entries));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.d_tags_, entries));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.h_count_, 1));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.d_count_, 1));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.h_age_, 1));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.d_age_, 1));
    *storage.h_age_.data() = TableAge{};  // not recorded until the engine writes it
    return Result<PageTableStorage>(std::move(storage));
  }
  PageTableHostBuffers host() const noexcept {
    return {h_indptr_.data(), h_indices_.data(), h_last_.data(), h_tags_.data(), max_batch_,
            max_entries_,     h_count_.data(), h_age_.data()};
  }
  PageTableDeviceBuffers device() const noexcept {
    return {d_indptr_.data(), d_indices_.data(), d_last_.data(), d_tags_.data(), max_batch_,
            max_entries_,     d_count_.data(), d_age_.data()};
  }

 private:
  std::int32_t max_batch_ = 0;
  std::int64_t max_entries_ = 0;
  detail::PinnedArray<std::int32_t> h_indptr_, h_last_, h_count_;
  detail::PinnedArray<PageId> h_indices_;
  detail::PinnedArray<PageTag> h_tags_;
  detail::PinnedArray<TableAge> h_age_;
  rt::DeviceBuffer<std::int32_t> d_indptr_, d_last_, d_count_;
  rt::DeviceBuffer<PageId> d_indices_;
  rt::DeviceBuffer<PageTag> d_tags_;
  rt::DeviceBuffer<TableAge> d_age_;
};

/// The 2-D form's twin of PageTableStorage: pinned host staging for build_block_table and
/// device arrays for upload_block_table, both [max_batch, max_pages_per_request] (upload
/// requires the host and device rows to have the same width, so one storage gives both).
class BlockTableStorage {
 public:
  static Result<BlockTableStorage> create(std::int32_t max_batch,
                                          std::int32_t max_pages_per_request) {
    if (max_batch < 1 || max_pages_per_request < 1) {
      return make_status(StatusCode::invalid_argument, "BlockTableStorage needs max_batch >= 1 ",
                         "and max_pages_per_request >= 1, got ", max_batch, " and ",
                         max_pages_per_request);
    }
    BlockTableStorage storage;
    storage.max_batch_ = max_batch;
    storage.max_pages_per_request_ = max_pages_per_request;
    const auto rows = static_cast<std::size_t>(max_batch);
    const auto entries = rows * static_cast<std::size_t>(max_pages_per_request);
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.h_block_table_, entries));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.h_tags_, entries));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.h_seq_lens_, rows));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.d_block_table_, entries));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.d_tags_, entries));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.d_seq_lens_, rows));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.h_age_, 1));
    SLIMSERVE_RETURN_IF_ERROR(detail::assign_buffer(storage.d_age_, 1));
    storage.h_age_.data()[0] = TableAge{};  // not recorded until the caller writes it
    return Result<BlockTableStorage>(std::move(storage));
  }

  BlockTableHostBuffers host() const noexcept {
    return {h_block_table_.data(), h_tags_.data(), h_seq_lens_.data(), max_batch_,
            max_pages_per_request_, h_age_.data()};
  }
  BlockTableDeviceBuffers device() const noexcept {
    return {d_block_table_.data(), d_tags_.data(), d_seq_lens_.data(), max_batch_,
            max_pages_per_request_, d_age_.data()};
  }

 private:
  std::int32_t max_batch_ = 0;
  std::int32_t max_pages_per_request_ = 0;
  detail::PinnedArray<PageId> h_block_table_;
  detail::PinnedArray<PageTag> h_tags_;
  detail::PinnedArray<std::int32_t> h_seq_lens_;
  detail::PinnedArray<TableAge> h_age_;
  rt::DeviceBuffer<PageId> d_block_table_;
  rt::DeviceBuffer<PageTag> d_tags_;
  rt::DeviceBuffer<std::int32_t> d_seq_lens_;
  rt::DeviceBuffer<TableAge> d_age_;
};

inline Result<PageTableView> upload_page_table(const PageTableView& host_table,
                                               std::int32_t num_pages,
                                               const PageTableDeviceBuffers& device,
                                               cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(validate_page_table(host_table, num_pages));
  const std::int32_t batch = host_table.batch_size;
  const std::int64_t entries = host_table.indptr[batch];
  if (batch > device.max_batch || entries > device.max_entries) {
    return make_status(StatusCode::resource_exhausted, "table of ", batch, " requests and ",
                       entries, " pages does not fit device buffers of ", device.max_batch,
                       " requests and ", device.max_entries, " pages");
  }
  if (device.indptr == nullptr || device.indices == nullptr || device.last_page_len == nullptr ||
      device.expected_tags == nullptr) {
    return make_status(StatusCode::invalid_argument, "a page-table device buffer is null");
  }
  using rt::CopyDirection;
  const auto ints = sizeof(std::int32_t);
  const auto page_count = static_cast<std::size_t>(entries);
  SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(device.indptr, host_table.indptr, (batch + 1) * ints,
                                           CopyDirection::host_to_device, stream));
  SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(device.last_page_len, host_table.last_page_len,
                                           batch * ints, CopyDirection::host_to_device, stream));
  SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(device.indices, host_table.indices,
                                           page_count * sizeof(PageId),
                                           CopyDirection::host_to_device, stream));
  SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(device.expected_tags, host_table.expected_tags,
                                           page_count * sizeof(PageTag),
                                           CopyDirection::host_to_device, stream));
  if (device.num_entries != nullptr) {
    // The count validated above, from its own word (the builder's) when the table has one.
    const std::int32_t* count =
        host_table.num_entries != nullptr ? host_table.num_entries : host_table.indptr + batch;
    SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(device.num_entries, count, ints,
                                             CopyDirection::host_to_device, stream));
  }
  const bool aged = device.built_at != nullptr && host_table.built_at != nullptr;
  if (aged) {
    SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(device.built_at, host_table.built_at, sizeof(TableAge),
                                             CopyDirection::host_to_device, stream));
  }
  return PageTableView{device.indptr,        device.indices, device.last_page_len,
                       device.expected_tags, batch,          host_table.page_size,
                       device.num_entries,   device.max_entries,
                       aged ? device.built_at : nullptr};
}

/// Uploads a 2-D table; with `built_at` (host, [1]: the table's age, e.g.
/// BlockTableStorage::host().built_at) and device.built_at, also its age word (the view has
/// no field for it: pass device.built_at as BlockTagCheckArguments::device_built_at).
inline Result<BlockTableView> upload_block_table(const BlockTableView& host_table,
                                                 std::int32_t num_pages,
                                                 const BlockTableDeviceBuffers& device,
                                                 cudaStream_t stream,
                                                 const TableAge* built_at = nullptr) {
  SLIMSERVE_RETURN_IF_ERROR(validate_block_table(host_table, num_pages));
  if (host_table.batch_size > device.max_batch ||
      host_table.max_pages_per_request != device.max_pages_per_request) {
    // Rows are copied as one block, so the widths must be equal, not merely fit.
    return make_status(StatusCode::resource_exhausted, "block table [", host_table.batch_size,
                       ", ", host_table.max_pages_per_request, "] does not match device buffers [",
                       device.max_batch, ", ", device.max_pages_per_request,
                       "]: the batch must fit and the rows must have the same width "
                       "(max_pages_per_request); BlockTableStorage gives both sides one shape");
  }
  if (device.block_table == nullptr || device.expected_tags == nullptr ||
      device.seq_lens == nullptr) {
    return make_status(StatusCode::invalid_argument, "a block-table device buffer is null");
  }
  using rt::CopyDirection;
  const auto entries = static_cast<std::size_t>(host_table.batch_size) *
                       static_cast<std::size_t>(host_table.max_pages_per_request);
  SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(device.block_table, host_table.block_table,
                                           entries * sizeof(PageId),
                                           CopyDirection::host_to_device, stream));
  SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(device.expected_tags, host_table.expected_tags,
                                           entries * sizeof(PageTag),
                                           CopyDirection::host_to_device, stream));
  SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(device.seq_lens, host_table.seq_lens,
                                           host_table.batch_size * sizeof(std::int32_t),
                                           CopyDirection::host_to_device, stream));
  if (built_at != nullptr && device.built_at != nullptr) {
    SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(device.built_at, built_at, sizeof(TableAge),
                                             CopyDirection::host_to_device, stream));
  }
  return BlockTableView{device.block_table,     device.expected_tags,
                        device.seq_lens,        host_table.batch_size,
                        host_table.max_pages_per_request, host_table.page_size};
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
