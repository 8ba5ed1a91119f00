#pragma once
/// \file
/// \brief Where a request's pages are, for kernels that take the page table in either form:
/// CSR (`indptr`, `indices`, `last_page_len`; FlashInfer's) or a 2-D block table
/// (`block_table` [B, block_table_stride], `seq_lens`; vLLM's). The same field names as
/// MlaDecodeParams; a Params type with these fields works with both functions.
///
/// The form is chosen once per request (indptr null or not), outside any loop: the kernel gets
/// a pointer to the request's row of page ids and its length, and its producer indexes that
/// row by page number whatever the form, so the steady-state loop is the same code for both.

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// Tokens of request b per the device page table; -1 when the table is inconsistent (CSR:
/// indptr decreasing or last_page_len outside [1, page_size]; block table: seq_len < 0 or
/// more tokens than the row's block_table_stride pages hold).
template <class Params>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE std::int64_t located_request_length(const Params& p, std::int32_t b) {
  if (p.indptr != nullptr) {
    const std::int32_t pages = p.indptr[b + 1] - p.indptr[b];
    if (pages == 0) return 0;
    const std::int32_t last = p.last_page_len[b];
    if (pages < 0 || last < 1 || last > p.page_size) return -1;
    return (static_cast<std::int64_t>(pages - 1) << p.page_shift) + last;
  }
  const std::int32_t len = p.seq_lens[b];
  if (len < 0 || static_cast<std::int64_t>(len) > (static_cast<std::int64_t>(p.block_table_stride) << p.page_shift)) {
    return -1;
  }
  return len;
}

/// Request b's page ids in order ([pages of its length]); only entries below
/// ceil(length / page_size) may be read, which is all the tag check covers.
template <class Params>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE const std::int32_t* located_request_pages(const Params& p, std::int32_t b) {
  return p.indptr != nullptr ? p.indices + p.indptr[b]
                             : p.block_table + static_cast<std::int64_t>(b) * p.block_table_stride;
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
