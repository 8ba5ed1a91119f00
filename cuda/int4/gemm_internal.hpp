#pragma once
// Internal glue between the GEMM façade's translation units (not installed).
#include <cstddef>

#include "slimserve/int4/gemm.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4::detail {

/// The one function that lays out the workspace: plan_gemm sizes it, run_gemm carves it.
GemmWorkspaceLayout layout_workspace(const GemmArguments& args, const GemmPlan& plan);

/// Dequantize-to-dense then dense GEMM (cuBLASLt on the GPU, a tiled kernel in the emulator).
Status run_expansion_path(const GemmArguments& args, const GemmWorkspaceLayout& layout,
                          unsigned char* workspace, cudaStream_t stream);

/// cuBLASLt scratch the expansion path asks for (0 in the emulator).
std::size_t dense_library_workspace_bytes();

}  // namespace int4::detail
SLIMSERVE_NAMESPACE_END
