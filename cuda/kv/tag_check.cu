// Launch wrappers of the GPU tag check and the device tag-array updates.
#include <algorithm>

#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/tag_check.cuh"
#include "slimserve/kv/tag_check.hpp"
#include "slimserve/runtime/launch.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

namespace {
constexpr int scatter_block_threads = 128;
constexpr int check_block_threads = 128;
// Grid-stride loops cover any size; more blocks than this would only queue.
constexpr unsigned max_grid_blocks = 1024;

unsigned blocks_for(std::int64_t items, std::int64_t per_block) {
  return static_cast<unsigned>(
      std::clamp<std::int64_t>((items + per_block - 1) / per_block, 1, max_grid_blocks));
}
}  // namespace

// --- DeviceTagArray ------------------------------------------------------------------------

Result<DeviceTagArray> DeviceTagArray::create(std::int32_t num_pages) {
  if (num_pages < 2) {
    return make_status(StatusCode::invalid_argument, "DeviceTagArray: num_pages must be >= 2, got ",
                       num_pages);
  }
  DeviceTagArray array;
  array.num_pages_ = num_pages;
  // A scatter entry (12 bytes) costs 1.5 tag words (8 bytes) and a kernel: past half the
  // pages a whole copy is cheaper.
  array.scatter_capacity_ = std::max(1, num_pages / 2);
  const auto slot = static_cast<std::size_t>(tag_batch_header_slots + array.scatter_capacity_);
  auto tags = rt::DeviceBuffer<DevicePageTag>::create(static_cast<std::size_t>(num_pages));
  if (!tags.ok()) return tags.status();
  auto fills = rt::DeviceBuffer<PageFillWord>::create(static_cast<std::size_t>(num_pages));
  if (!fills.ok()) return fills.status();
  // Tag 0 is never a real page's handle: a zero fill says "nothing written" to every table.
  SLIMSERVE_RETURN_IF_ERROR(fills->fill_bytes(0));
  auto updates = rt::DeviceBuffer<TagUpdate>::create(2 * slot);
  if (!updates.ok()) return updates.status();
  auto staging = detail::PinnedArray<TagUpdate>::create(2 * slot);
  if (!staging.ok()) return staging.status();
  auto mirror = detail::PinnedArray<DevicePageTag>::create(2 * static_cast<std::size_t>(num_pages));
  if (!mirror.ok()) return mirror.status();
  auto age = rt::DeviceBuffer<TableAge>::create(1);
  if (!age.ok()) return age.status();
  SLIMSERVE_RETURN_IF_ERROR(age->fill_bytes(0));  // never synced: every recorded age is newer
  auto age_staging = detail::PinnedArray<TableAge>::create(2);
  if (!age_staging.ok()) return age_staging.status();
  array.tags_ = std::move(tags).value();
  array.fills_ = std::move(fills).value();
  array.updates_ = std::move(updates).value();
  array.staging_ = std::move(staging).value();
  array.mirror_ = std::move(mirror).value();
  array.age_ = std::move(age).value();
  array.age_staging_ = std::move(age_staging).value();
  return Result<DeviceTagArray>(std::move(array));
}

Status DeviceTagArray::sync(PagePool& pool, cudaStream_t stream) {
  if (pool.num_pages() != num_pages_) {
    return make_status(StatusCode::invalid_argument, "DeviceTagArray of ", num_pages_,
                       " pages synced with a pool of ", pool.num_pages());
  }
  const std::span<const PageId> dirty = pool.dirty_pages();
  const std::size_t count = dirty.size();  // <= num_pages: each page is listed once
  if (count == 0) {
    last_sync_ = LastSync::nothing;
    if (!synced_ || synced_pool_ != pool.tag_base()) {
      // Nothing dirty but another pool (or never synced): the device may hold anything.
      pool.mark_all_dirty();
      return sync(pool, stream);
    }
    synced_epoch_ = pool.change_epoch();
    return upload_age(pool, stream);
  }
  const int slot = next_slot_;
  if (count > static_cast<std::size_t>(scatter_capacity_)) {
    DevicePageTag* mirror = mirror_.data() + static_cast<std::size_t>(slot) * num_pages_;  // [num_pages]
    for (PageId page = 0; page < num_pages_; ++page) {
      mirror[page] = DevicePageTag{pool.tag(page), pool.writer(page)};
    }
    SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(tags_.data(), mirror, tags_.size_bytes(),
                                             rt::CopyDirection::host_to_device, stream));
    last_sync_ = LastSync::whole_array;
  } else {
    const std::size_t slot_entries = tag_batch_header_slots + scatter_capacity_;
    TagUpdate* host_batch = staging_.data() + slot * slot_entries;  // [1 + count]
    TagUpdate* device_batch = updates_.data() + slot * slot_entries;
    host_batch[0] = TagUpdate{static_cast<PageId>(count), 0, no_writer};
    for (std::size_t i = 0; i < count; ++i) {
      host_batch[tag_batch_header_slots + i] =
          TagUpdate{dirty[i], pool.tag(dirty[i]), pool.writer(dirty[i])};
    }
    SLIMSERVE_RETURN_IF_ERROR(rt::copy_async(
        device_batch, host_batch, (tag_batch_header_slots + count) * sizeof(TagUpdate),
        rt::CopyDirection::host_to_device, stream));
    const TagScatterParams params{device_batch, tags_.data(), num_pages_};
    SLIMSERVE_RETURN_IF_ERROR(rt::launch(
        scatter_page_tags_kernel<scatter_block_threads>,
        rt::LaunchConfig{dim3(blocks_for(static_cast<std::int64_t>(count), scatter_block_threads)),
                         dim3(scatter_block_threads), 0, stream},
        params));
    last_sync_ = LastSync::scatter;
  }
  pool.clear_dirty();
  synced_epoch_ = pool.change_epoch();
  synced_pool_ = pool.tag_base();
  synced_ = true;
  return upload_age(pool, stream);  // switches the staging slot
}

// The device's record of what it holds, after the tags on the same stream: a table built at
// this epoch (or earlier) passes the device-side age check from here on.
Status DeviceTagArray::upload_age(const PagePool& pool, cudaStream_t stream) {
  const int slot = next_slot_;
  TableAge* staged = age_staging_.data() + slot;
  *staged = TableAge{synced_epoch_, pool.tag_base()};
  next_slot_ = 1 - slot;
  return rt::copy_async(age_.data(), staged, sizeof(TableAge), rt::CopyDirection::host_to_device,
                        stream);
}

// --- Tag check -----------------------------------------------------------------------------

namespace {

// Shared by both table forms: preflight of what they have in common.
Status check_common(const DeviceTagArray* page_tags, std::int32_t batch_size,
                    const RequestStatus* statuses) {
  if (page_tags == nullptr || page_tags->data() == nullptr) {
    return make_status(StatusCode::invalid_argument, "check_page_tags: no device tag array");
  }
  if (batch_size > 0 && statuses == nullptr) {
    return make_status(StatusCode::invalid_argument, "check_page_tags: statuses is null");
  }
  return {};
}

// A mirror that knows its age: the device tags must carry every change the table saw.
Status check_table_age(const DeviceTagArray& tags, const TableAge& built_at) {
  if (built_at.epoch == 0) return {};
  if (!tags.synced() || tags.synced_pool() != built_at.pool) {
    return make_status(StatusCode::failed_precondition, "check_page_tags: the table was built ",
                       "from the pool with tag base ", built_at.pool, "; the device tags ",
                       tags.synced() ? "were last synced from another pool" : "were never synced",
                       ": sync them from this pool first; nothing was launched");
  }
  if (built_at.epoch > tags.synced_epoch()) {
    return make_status(StatusCode::failed_precondition, "check_page_tags: the table was built ",
                       "at pool epoch ", built_at.epoch, ", the device tags were last synced at ",
                       "epoch ", tags.synced_epoch(), ": changes made since would be checked ",
                       "against stale device tags; sync before the check; nothing was launched");
  }
  return {};
}

// Shared by both table forms: the launch, after can_implement.
template <class Rows>
Status launch_tag_check(const Rows& rows, const DeviceTagArray* page_tags,
                        const WriterId* writers, const std::int32_t* append_indptr,
                        bool check_fill, RequestStatus* statuses, std::int32_t* aborted_count,
                        cudaStream_t stream) {
  if (aborted_count != nullptr) {
    SLIMSERVE_RETURN_IF_ERROR(rt::memset_async(aborted_count, 0, sizeof(std::int32_t), stream));
  }
  if (rows.batch_size() == 0) return {};
  const TagCheckParams<Rows> params{rows,
                                    page_tags->data(),
                                    page_tags->num_pages(),
                                    writers,
                                    append_indptr,
                                    check_fill ? page_tags->fills() : nullptr,
                                    page_tags->synced_age(),
                                    statuses,
                                    aborted_count};
  // One block per request: the launch shape depends only on the batch size (graph-safe).
  return rt::launch(check_page_tags_kernel<check_block_threads, Rows>,
                    rt::LaunchConfig{dim3(static_cast<unsigned>(rows.batch_size())),
                                     dim3(check_block_threads), sizeof(TagCheckSharedStorage),
                                     stream},
                    params);
}

}  // namespace

Status can_implement(const TagCheckArguments& arguments) {
  const PageTableView& table = arguments.table;
  if (table.batch_size < 0 || table.page_size < 1) {
    return make_status(StatusCode::invalid_argument, "check_page_tags: batch_size ",
                       table.batch_size, ", page_size ", table.page_size);
  }
  if (table.batch_size > 0 && (table.indptr == nullptr || table.last_page_len == nullptr ||
                               table.indices == nullptr || table.expected_tags == nullptr)) {
    return make_status(StatusCode::invalid_argument, "check_page_tags: a page-table array is null");
  }
  return check_common(arguments.page_tags, table.batch_size, arguments.statuses);
}

Status check_page_tags(const TagCheckArguments& arguments, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(can_implement(arguments));
  SLIMSERVE_RETURN_IF_ERROR(check_table_age(*arguments.page_tags, arguments.built_at));
  return launch_tag_check(CsrRows{arguments.table}, arguments.page_tags, arguments.writers,
                          arguments.append_indptr, arguments.check_fill, arguments.statuses,
                          arguments.aborted_count, stream);
}

Status can_implement(const BlockTagCheckArguments& arguments) {
  const BlockTableView& table = arguments.table;
  if (table.batch_size < 0 || table.page_size < 1 || table.max_pages_per_request < 0) {
    return make_status(StatusCode::invalid_argument, "check_page_tags: batch_size ",
                       table.batch_size, ", page_size ", table.page_size,
                       ", max_pages_per_request ", table.max_pages_per_request);
  }
  if (table.batch_size > 0 && (table.block_table == nullptr || table.expected_tags == nullptr ||
                               table.seq_lens == nullptr)) {
    return make_status(StatusCode::invalid_argument, "check_page_tags: a block-table array is null");
  }
  return check_common(arguments.page_tags, table.batch_size, arguments.statuses);
}

Status check_page_tags(const BlockTagCheckArguments& arguments, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(can_implement(arguments));
  SLIMSERVE_RETURN_IF_ERROR(check_table_age(*arguments.page_tags, arguments.built_at));
  return launch_tag_check(BlockRows{arguments.table, arguments.device_built_at}, arguments.page_tags, arguments.writers,
                          arguments.append_indptr, arguments.check_fill, arguments.statuses,
                          arguments.aborted_count, stream);
}

Status copy_statuses_to_host(const RequestStatus* device_statuses, std::span<RequestStatus> host,
                             cudaStream_t stream) {
  if (host.empty()) return {};
  if (device_statuses == nullptr) {
    return make_status(StatusCode::invalid_argument, "copy_statuses_to_host: null statuses");
  }
  return rt::copy_async(host.data(), device_statuses, host.size_bytes(),
                        rt::CopyDirection::device_to_host, stream);
}

void collect_aborted(std::span<const RequestStatus> statuses, std::vector<AbortedRequest>& out) {
  out.clear();
  for (std::size_t b = 0; b < statuses.size(); ++b) {
    if (!request_ok(statuses[b])) out.push_back({static_cast<std::int32_t>(b), statuses[b]});
  }
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
