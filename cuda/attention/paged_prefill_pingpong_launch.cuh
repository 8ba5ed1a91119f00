#pragma once
// Launcher of the ping-pong wgmma prefill kernel (kernels/paged_prefill_pingpong_kernel.cuh)
// for the tensor-core paged attention table: 384 threads, sizeof(PagedPingPongSharedStorage)
// dynamic bytes, the same grid as the one-warpgroup wgmma kernel.

#include "slimserve/attention/head_dims.hpp"
#include "slimserve/attention/kernels/paged_prefill_pingpong_kernel.cuh"
#include "slimserve/runtime/launch.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::detail {

template <class KvT, class QT, int HeadDim>
Status launch_paged_prefill_pingpong(const kernels::PagedAttentionParams& params, dim3 grid, cudaStream_t stream) {
  using Tile = kernels::PagedPingPongTile<KvT, HeadDim>;
  return rt::launch(kernels::paged_prefill_pingpong_kernel<KvT, QT, HeadDim>,
                    rt::LaunchConfig{grid, dim3(Tile::threads),
                                     sizeof(kernels::PagedPingPongSharedStorage<KvT, HeadDim>), stream},
                    params);
}

/// Null where PagedWgmmaHeadDims lacks the head_dim (as the one-warpgroup kernel).
template <class KvT, class QT, int HeadDim>
constexpr Status (*paged_pingpong_launcher())(const kernels::PagedAttentionParams&, dim3, cudaStream_t) {
  if constexpr (PagedWgmmaHeadDims::contains(HeadDim)) {
    return &launch_paged_prefill_pingpong<KvT, QT, HeadDim>;
  } else {
    return nullptr;
  }
}

}  // namespace attention::detail
SLIMSERVE_NAMESPACE_END
