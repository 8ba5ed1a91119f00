#pragma once
// The append kernels' launchers, shared by the façade (append.cu: the plain kernels) and the
// rotated kernels' own translation unit (append_rotated.cu), so the two sets compile in
// parallel.

#include <cstdint>

#include "kernel_tables.cuh"
#include "slimserve/attention/rotation.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::detail {

using AppendLauncher = Status (*)(const kernels::AppendParams&, dim3 grid, dim3 block, cudaStream_t stream);

/// The rotated append kernel for (stored format, input type, head_dim, rotation != none), or
/// null when none is built for it (head dims outside RotationHeadDims).
AppendLauncher rotated_append_launcher(KvDtype kv_dtype, ActivationDtype input_dtype, std::int32_t head_dim,
                                       KvRotation rotation);

}  // namespace attention::detail
SLIMSERVE_NAMESPACE_END
