#pragma once
/// \file
/// \brief The head dims each attention kernel family is instantiated for, as typed lists: the
/// dispatch tables are generated from them and the preflights consult them, so adding a
/// head_dim to a family is one edit here. Plain C++ (no CUDA header).

#include "slimserve/config.hpp"
#include "slimserve/kv/cache_head_dims.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

// HeadDimList and PagedHeadDims (the paged cache's head dims): kv/cache_head_dims.hpp.

/// The CUDA-core decode kernel (a head vector is a power-of-two group of lanes, its dot
/// products butterflies): paged attention serves the other head dims of PagedHeadDims, and
/// the plan never picks the CUDA-core kernel for them.
using VectorKernelHeadDims = HeadDimList<64, 128, 256>;

/// The warpgroup-MMA (wgmma) prefill kernel (kernels/paged_prefill_wgmma_kernel.cuh): head
/// dims of whole 128-byte swizzle atoms whose O accumulator fits one m64nD (D <= 256). A
/// subset of PagedHeadDims; the plan keeps the mma.sync kernel for the others.
using PagedWgmmaHeadDims = HeadDimList<128>;

}  // namespace attention
SLIMSERVE_NAMESPACE_END
