#pragma once
/// \file
/// \brief Dequantize listed cache pages into BF16 (real value = stored * scale).

#include <cstdint>

#include "slimserve/attention/detail/stream.hpp"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/config.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

/// k_out/v_out: [num_listed, page_size, num_kv_heads, head_dim] (NHD whatever the cache layout).
/// A listed id outside [0, cache.num_pages) produces a NaN page instead of a read.
Status dequantize_pages(const PagedKVCacheView& cache, const std::int32_t* page_ids,
                        std::int32_t num_listed, bf16* k_out, bf16* v_out, cudaStream_t stream);

}  // namespace attention
SLIMSERVE_NAMESPACE_END
