// Launch wrappers of the page-movement kernels: copy_pages, swap_pages, export/import.
#include <cstdint>

#include "slimserve/detail/preflight.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_movement.cuh"
#include "slimserve/kv/page_movement.hpp"
#include "slimserve/runtime/launch.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv {

namespace {
constexpr int move_block_threads = 128;

using preflight::aligned16;

Status check_common(const attention::PagedKVCacheView& cache, const DeviceTagArray* tags,
                    const char* what) {
  SLIMSERVE_RETURN_IF_ERROR(attention::validate_cache_view(cache));
  SLIMSERVE_RETURN_IF_ERROR(attention::require_packed_pages(cache, what));
  if (tags == nullptr || tags->data() == nullptr) {
    return make_status(StatusCode::invalid_argument, what, ": no device tag array");
  }
  if (tags->num_pages() != cache.num_pages) {
    return make_status(StatusCode::invalid_argument, what, ": the tag array covers ",
                       tags->num_pages(), " pages, the cache ", cache.num_pages);
  }
  const bool scales = cache.scale_mode == attention::KvScaleMode::per_token;
  if (!aligned16(cache.k_pages) || !aligned16(cache.v_pages) ||
      (scales && (!aligned16(cache.k_token_scales) || !aligned16(cache.v_token_scales)))) {
    return make_status(StatusCode::invalid_argument, what,
                       ": the K/V pages (and per-token scales) must be 16-byte aligned");
  }
  return {};
}

PageMoveParams base_params(const attention::PagedKVCacheView& cache, const DeviceTagArray& tags) {
  PageMoveParams p{};
  PageGeometry& g = p.geometry;
  const bool scales = cache.scale_mode == attention::KvScaleMode::per_token;
  g.num_arrays = scales ? 4 : 2;
  g.page_size = cache.page_size;
  g.num_kv_heads = cache.num_kv_heads;
  g.hnd = cache.layout == attention::KvLayout::hnd;
  const auto data_unit = static_cast<std::int32_t>(attention::head_vector_bytes(cache.dtype, cache.head_dim));
  unsigned char* arrays[4] = {static_cast<unsigned char*>(cache.k_pages),
                              static_cast<unsigned char*>(cache.v_pages),
                              reinterpret_cast<unsigned char*>(cache.k_token_scales),
                              reinterpret_cast<unsigned char*>(cache.v_token_scales)};
  std::int64_t offset = 0;
  for (int a = 0; a < 4; ++a) {
    g.arrays[a] = a < g.num_arrays ? arrays[a] : nullptr;
    g.unit_bytes[a] = a < 2 ? data_unit : static_cast<std::int32_t>(sizeof(float));
    g.array_bytes[a] = a < g.num_arrays ? static_cast<std::int64_t>(g.unit_bytes[a]) *
                                              cache.page_size * cache.num_kv_heads
                                        : 0;
    g.record_offset[a] = offset;
    offset += g.array_bytes[a];
  }
  g.record_bytes = offset;
  p.slot_bytes = kv_record_header_bytes + offset;
  p.pool = tags.synced_pool();
  p.page_tags = tags.data();
  p.page_fills = tags.fills();
  p.num_pages = tags.num_pages();
  return p;
}

template <MoveKind Kind>
Status launch_moves(const PageMoveParams& params, cudaStream_t stream) {
  if constexpr (Kind == MoveKind::import_request) {
    // The request's status starts as "no record failed" (state ok, slot no_failed_record).
    RequestStatus* status = params.statuses;
    SLIMSERVE_RETURN_IF_ERROR(rt::memset_async(&status->state, 0, sizeof status->state, stream));
    SLIMSERVE_RETURN_IF_ERROR(
        rt::memset_async(&status->failed_slot, 0x7F, sizeof status->failed_slot, stream));
  }
  if constexpr (Kind == MoveKind::swap_in || Kind == MoveKind::import_request) {
    // Every record's header and checksum before any byte lands.
    SLIMSERVE_RETURN_IF_ERROR(rt::launch(
        verify_records_kernel<move_block_threads, Kind>,
        rt::LaunchConfig{dim3(static_cast<unsigned>(params.count)), dim3(move_block_threads),
                         sizeof(RecordVerifySharedStorage), stream},
        params));
  }
  // Swap-out and export write each record's header from the copy itself (one read per byte).
  SLIMSERVE_RETURN_IF_ERROR(
      rt::launch(move_pages_kernel<move_block_threads, Kind>,
                 rt::LaunchConfig{dim3(static_cast<unsigned>(params.count)),
                                  dim3(move_block_threads), sizeof(PageMoveSharedStorage), stream},
                 params));
  if constexpr (Kind == MoveKind::copy || Kind == MoveKind::swap_in ||
                Kind == MoveKind::import_request) {
    // Device-held lengths of the written pages (the check compares later tables with them).
    constexpr int threads = 128;
    return rt::launch(record_move_fills_kernel<threads, Kind>,
                      rt::LaunchConfig{dim3(static_cast<unsigned>((params.count + threads - 1) / threads)),
                                       dim3(threads), 0, stream},
                      params);
  }
  return {};
}

Status check_request(const RequestPagesView& r, std::int32_t page_size, const void* buffer,
                     std::int64_t buffer_bytes, std::int64_t needed, const RequestStatus* status,
                     const char* what) {
  if (r.num_pages < 1 || r.pages == nullptr || r.tags == nullptr) {
    return make_status(StatusCode::invalid_argument, what, ": a request needs >= 1 page and ",
                       "non-null page and tag arrays, got ", r.num_pages, " pages");
  }
  if (r.num_tokens <= static_cast<std::int64_t>(r.num_pages - 1) * page_size ||
      r.num_tokens > static_cast<std::int64_t>(r.num_pages) * page_size) {
    return make_status(StatusCode::invalid_argument, what, ": ", r.num_tokens,
                       " tokens do not fill ", r.num_pages, " pages of ", page_size);
  }
  if (buffer == nullptr || !aligned16(buffer) || buffer_bytes < needed) {
    return make_status(StatusCode::invalid_argument, what, ": the buffer must be non-null, ",
                       "16-byte aligned and hold ", needed, " bytes, got ", buffer_bytes);
  }
  if (status == nullptr) {
    return make_status(StatusCode::invalid_argument, what, ": status is null");
  }
  return {};
}
}  // namespace

Status copy_pages(const CopyPagesArguments& a, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(check_common(a.cache, a.page_tags, "copy_pages"));
  if (a.num_copies < 0 || (a.num_copies > 0 && (a.copies == nullptr || a.statuses == nullptr))) {
    return make_status(StatusCode::invalid_argument, "copy_pages: ", a.num_copies,
                       " copies need non-null copies and statuses");
  }
  if (a.num_copies == 0) return {};
  PageMoveParams p = base_params(a.cache, *a.page_tags);
  p.count = a.num_copies;
  p.copies = a.copies;
  p.statuses = a.statuses;
  return launch_moves<MoveKind::copy>(p, stream);
}

Status swap_pages(const SwapPagesArguments& a, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(check_common(a.cache, a.page_tags, "swap_pages"));
  if (!is_valid(a.direction)) {  // checked as one direction, launched as the other otherwise
    return make_status(StatusCode::invalid_argument, "swap_pages: unknown direction ",
                       static_cast<int>(a.direction));
  }
  if (a.num_swaps < 0 || (a.num_swaps > 0 && (a.swaps == nullptr || a.statuses == nullptr ||
                                              a.host_records == nullptr || a.host_slots < 1))) {
    return make_status(StatusCode::invalid_argument, "swap_pages: ", a.num_swaps,
                       " swaps need non-null swaps, statuses and host records (", a.host_slots,
                       " slots)");
  }
  if (!aligned16(a.host_records)) {
    return make_status(StatusCode::invalid_argument, "swap_pages: host records must be 16-byte aligned");
  }
  if (a.num_swaps == 0) return {};
  PageMoveParams p = base_params(a.cache, *a.page_tags);
  p.count = a.num_swaps;
  p.swaps = a.swaps;
  p.records = static_cast<unsigned char*>(a.host_records);
  p.host_slots = a.host_slots;
  p.identities = a.identities;
  p.statuses = a.statuses;
  switch (a.direction) {
    case SwapDirection::device_to_host: return launch_moves<MoveKind::swap_out>(p, stream);
    case SwapDirection::host_to_device: return launch_moves<MoveKind::swap_in>(p, stream);
  }
  return make_status(StatusCode::internal, "swap_pages: direction checked above");
}

Status export_request(const ExportRequestArguments& a, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(check_common(a.cache, a.page_tags, "export_request"));
  SLIMSERVE_RETURN_IF_ERROR(check_request(a.request, a.cache.page_size, a.buffer, a.buffer_bytes,
                                          export_buffer_bytes(a.cache, a.request.num_pages),
                                          a.status, "export_request"));
  PageMoveParams p = base_params(a.cache, *a.page_tags);
  p.count = a.request.num_pages;
  p.request_pages = a.request.pages;
  p.request_tags = a.request.tags;
  p.request_tokens = a.request.num_tokens;
  p.request_writer = a.request.writer;
  p.header = static_cast<unsigned char*>(a.buffer);
  p.records = static_cast<unsigned char*>(a.buffer) + kv_buffer_header_bytes;
  p.descriptor = describe_export(a.cache, a.request.num_pages, a.request.num_tokens);
  // Without an identity the records name the exporting request (the mover) in this pool.
  p.identity = a.identity.writer != no_writer
                   ? a.identity
                   : RecordIdentity{a.page_tags->synced_pool(), a.request.writer, 0};
  p.statuses = a.status;
  return launch_moves<MoveKind::export_request>(p, stream);
}

Status import_request(const ImportRequestArguments& a, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(check_common(a.cache, a.page_tags, "import_request"));
  SLIMSERVE_RETURN_IF_ERROR(check_import_compatible(a.descriptor, a.cache));
  if (a.descriptor.num_pages != a.request.num_pages ||
      a.descriptor.num_tokens != a.request.num_tokens) {
    return make_status(StatusCode::invalid_argument, "import_request: the buffer holds ",
                       a.descriptor.num_tokens, " tokens in ", a.descriptor.num_pages,
                       " pages, the request has ", a.request.num_tokens, " tokens in ",
                       a.request.num_pages, " pages");
  }
  if (a.request.writer == no_writer) {
    return make_status(StatusCode::invalid_argument,
                       "import_request: no writer identity (imported pages must be writable by it)");
  }
  if (a.expected.writer == no_writer) {
    return make_status(StatusCode::invalid_argument, "import_request: no expected identity ",
                       "(expected.writer: whose export this must be)");
  }
  SLIMSERVE_RETURN_IF_ERROR(check_request(a.request, a.cache.page_size, a.buffer, a.buffer_bytes,
                                          export_buffer_bytes(a.cache, a.request.num_pages),
                                          a.status, "import_request"));
  PageMoveParams p = base_params(a.cache, *a.page_tags);
  p.count = a.request.num_pages;
  p.request_pages = a.request.pages;
  p.request_tags = a.request.tags;
  p.request_tokens = a.request.num_tokens;
  p.request_writer = a.request.writer;
  // Read only: the kernel compares the header and reads the records.
  p.header = static_cast<unsigned char*>(const_cast<void*>(a.buffer));
  p.records = p.header + kv_buffer_header_bytes;
  p.descriptor = a.descriptor;
  p.identity = a.expected;
  p.statuses = a.status;
  return launch_moves<MoveKind::import_request>(p, stream);
}

}  // namespace kv
SLIMSERVE_NAMESPACE_END
