#pragma once
/// \file
/// \brief Fused quantize-and-append of new K/V tokens into a paged cache.
///
/// Each new token's K and V ([num_tokens, num_kv_heads, head_dim], BF16 or FP16) are divided
/// by the cache scale, rounded to nearest even with saturation to the format's largest finite
/// value, and written into the slot the page table gives it. Destinations, in one of two forms:
///   - explicit: token t goes to request token_request[t] at position token_position[t];
///   - slot: token t goes to flat slot slot_mapping[t] = page * page_size + offset (vLLM);
///   - chunk (prefill chunks, and decode with append_indptr = 0..B): request b's tokens are
///     rows [append_indptr[b], append_indptr[b+1]) of k_new/v_new and fill the LAST slots of
///     the request as the page table describes it (the table already includes them).
/// A token is skipped (nothing written) when its request failed the tag check, or its
/// position, page index or page id is outside what the device page table gives that request:
/// the kernel never writes outside the pages it was handed. `check_append_destinations` runs
/// the same checks on host copies, all or nothing, before any launch.

#include <cstdint>
#include <span>

#include "slimserve/attention/detail/stream.hpp"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/attention/rotation.hpp"
#include "slimserve/config.hpp"
#include "slimserve/kv/page_access.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

struct AppendArguments {
  PagedKVCacheView cache;
  kv::PageTableView table;                          ///< device arrays; expected_tags unused
  const kv::RequestStatus* request_status = nullptr;  ///< [batch_size] device, or null (no check)
  const void* k_new = nullptr;  ///< [num_tokens, num_kv_heads, head_dim], 16-byte aligned
  const void* v_new = nullptr;  ///< same shape
  /// Elements from one token's row to the next in k_new / v_new (a row: num_kv_heads x
  /// head_dim contiguous elements); 0: packed (num_kv_heads * head_dim). A multiple of 8 of at
  /// least a row: the K and V slices of a fused QKV projection's output are read in place.
  std::int64_t k_row_stride = 0;
  std::int64_t v_row_stride = 0;
  ActivationDtype input_dtype = ActivationDtype::bf16;
  std::int32_t num_tokens = 0;
  const std::int32_t* token_request = nullptr;   ///< [num_tokens] explicit form
  const std::int32_t* token_position = nullptr;  ///< [num_tokens] explicit form
  const std::int32_t* append_indptr = nullptr;   ///< [batch_size + 1] chunk form
  /// [num_tokens] slot form (vLLM's slot_mapping): token t goes to page slot_mapping[t] /
  /// page_size, slot slot_mapping[t] % page_size; -1 (any negative) or a page past num_pages
  /// skips it. No page table is read (table may be empty) and no tag verdict applies.
  const std::int64_t* slot_mapping = nullptr;
  /// Device-held lengths (kv::DeviceTagArray::fills()), optional: each written token records
  /// its slot in its page's fill under the table's expected tag (table.expected_tags is then
  /// required), which the tag check's `check_fill` compares later rows with.
  kv::PageFillWord* page_fills = nullptr;
  /// Head vectors stored rotated (attention/rotation.hpp): keys, or keys_and_values, are
  /// multiplied by H / sqrt(head_dim) in registers before the amax and the scale are taken,
  /// for every format; head_dim 64, 128 or 256 (RotationHeadDims), others refused. A NaN or
  /// infinity anywhere in a rotated vector spreads to the whole vector. The cache's readers
  /// must then get queries rotated the same way (rotate_heads), and with keys_and_values
  /// rotate the attention output back.
  KvRotation rotation = KvRotation::none;
};

/// Preflight only (shapes, enum ranges, types, pointers, alignment); nothing is launched.
Status can_implement(const AppendArguments& args);

/// Preflight (can_implement) and launch of the append kernel.
Status append_kv(const AppendArguments& args, cudaStream_t stream);

/// Host copies of what append_kv reads, for an all-or-nothing check before launching.
struct AppendDestinationsHost {
  std::span<const std::int32_t> indptr;         ///< [batch_size + 1]
  std::span<const std::int32_t> indices;        ///< [indptr[batch_size]]
  std::span<const std::int32_t> last_page_len;  ///< [batch_size]
  std::span<const std::int32_t> token_request;   ///< explicit form, or empty
  std::span<const std::int32_t> token_position;  ///< explicit form, or empty
  std::span<const std::int32_t> append_indptr;   ///< chunk form, or empty
  std::int32_t num_tokens = 0;
  std::int32_t page_size = 0;
  std::int32_t num_pages = 0;
};

/// Every token lands inside its request's pages, on a page id < num_pages, and no two tokens
/// share a slot. The first violation is reported with its token, request and position.
Status check_append_destinations(const AppendDestinationsHost& host);

}  // namespace attention
SLIMSERVE_NAMESPACE_END
