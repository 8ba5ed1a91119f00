// Tensor-core paged attention instantiations for a bf16 cache.
#include "paged_attention_tables.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::detail {
template std::span<const PagedAttentionKernelEntry> paged_attention_kernels<bf16>();
}  // namespace attention::detail
SLIMSERVE_NAMESPACE_END
