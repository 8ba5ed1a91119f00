// Decode attention instantiations for a fp8_e4m3 cache (both query types, head_dim 64/128/256).
#include "kernel_tables.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::detail {
template std::span<const DecodeKernelEntry> decode_kernels<fp8_e4m3>();
}  // namespace attention::detail
SLIMSERVE_NAMESPACE_END
