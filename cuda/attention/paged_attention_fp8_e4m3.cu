// Tensor-core paged attention instantiations for a fp8_e4m3 cache.
#include "paged_attention_tables.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::detail {
template std::span<const PagedAttentionKernelEntry> paged_attention_kernels<fp8_e4m3>();
}  // namespace attention::detail
SLIMSERVE_NAMESPACE_END
