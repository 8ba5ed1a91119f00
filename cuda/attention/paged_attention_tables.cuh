#pragma once
// Typed dispatch table of the tensor-core paged attention kernel: one entry per (stored type,
// activation type, head_dim) instantiation. The supported combinations are listed once, in
// `paged_attention_instantiations` below; each stored type's entries compile in their own
// translation unit (paged_attention_<type>.cu) so they build in parallel.

#include <array>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "kernel_tables.cuh"
#include "slimserve/attention/kernels/paged_attention_kernel.cuh"
#include "slimserve/attention/kernels/paged_prefill_wgmma_kernel.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::detail {

using PagedAttentionLauncher = Status (*)(const kernels::PagedAttentionParams&, dim3 grid,
                                          cudaStream_t stream);
struct PagedAttentionKernelEntry {
  KvDtype kv_dtype;
  ActivationDtype q_dtype;
  std::int32_t head_dim;
  std::size_t shared_bytes;
  PagedAttentionLauncher launch;
  PagedAttentionLauncher launch_fused;  ///< fused prefill (quantize-and-append of the chunk)
  /// The wgmma prefill kernel (64-row schedules), or null where PagedWgmmaHeadDims lacks the
  /// head_dim.
  PagedAttentionLauncher launch_wgmma;
};

template <class KvT, class QT, int HeadDim>
Status launch_paged_attention(const kernels::PagedAttentionParams& params, dim3 grid, cudaStream_t stream) {
  using Tile = kernels::PagedAttentionTile<KvT, HeadDim>;
  return rt::launch(kernels::paged_attention_kernel<KvT, QT, HeadDim>,
                    rt::LaunchConfig{grid, dim3(Tile::threads),
                                     sizeof(kernels::PagedAttentionSharedStorage<KvT, HeadDim>), stream},
                    params);
}

template <class KvT, class QT, int HeadDim>
Status launch_paged_prefill_fused(const kernels::PagedAttentionParams& params, dim3 grid, cudaStream_t stream) {
  using Tile = kernels::PagedAttentionTile<KvT, HeadDim>;
  return rt::launch(kernels::paged_prefill_fused_kernel<KvT, QT, HeadDim>,
                    rt::LaunchConfig{grid, dim3(Tile::threads),
                                     sizeof(kernels::PagedAttentionSharedStorage<KvT, HeadDim>), stream},
                    params);
}

template <class KvT, class QT, int HeadDim>
Status launch_paged_prefill_wgmma(const kernels::PagedAttentionParams& params, dim3 grid, cudaStream_t stream) {
  using Tile = kernels::PagedWgmmaTile<KvT, HeadDim>;
  return rt::launch(kernels::paged_prefill_wgmma_kernel<KvT, QT, HeadDim>,
                    rt::LaunchConfig{grid, dim3(Tile::threads), Tile::shared_bytes, stream}, params);
}

template <class KvT, class QT, int HeadDim>
constexpr PagedAttentionLauncher paged_wgmma_launcher() {
  if constexpr (PagedWgmmaHeadDims::contains(HeadDim)) {
    return &launch_paged_prefill_wgmma<KvT, QT, HeadDim>;
  } else {
    return nullptr;
  }
}

template <class KvT, class QT, int HeadDim>
constexpr PagedAttentionKernelEntry paged_attention_entry() {
  return {kv_dtype_of<KvT>::value, activation_dtype_of<QT>::value, HeadDim,
          sizeof(kernels::PagedAttentionSharedStorage<KvT, HeadDim>),
          &launch_paged_attention<KvT, QT, HeadDim>, &launch_paged_prefill_fused<KvT, QT, HeadDim>,
          paged_wgmma_launcher<KvT, QT, HeadDim>()};
}

/// Activation types a cache computes with: 16-bit caches their own type, FP8 caches either.
template <class KvT, class F>
constexpr void for_each_activation(F&& f) {
  if constexpr (std::is_same_v<KvT, bf16> || std::is_same_v<KvT, fp16>) {
    f.template operator()<KvT>();
  } else {
    f.template operator()<bf16>();
    f.template operator()<fp16>();
  }
}

/// Every instantiation of one stored type.
template <class KvT>
std::span<const PagedAttentionKernelEntry> paged_attention_kernels() {
  static const auto table = [] {
    std::array<PagedAttentionKernelEntry, 2 * PagedHeadDims::size> entries{};
    std::size_t count = 0;
    for_each_activation<KvT>([&]<class QT>() {
      PagedHeadDims::for_each([&]<int HeadDim>() {
        entries[count++] = paged_attention_entry<KvT, QT, HeadDim>();
      });
    });
    return std::pair{entries, count};
  }();
  return {table.first.data(), table.second};
}
extern template std::span<const PagedAttentionKernelEntry> paged_attention_kernels<bf16>();
extern template std::span<const PagedAttentionKernelEntry> paged_attention_kernels<fp16>();
extern template std::span<const PagedAttentionKernelEntry> paged_attention_kernels<fp8_e4m3>();
extern template std::span<const PagedAttentionKernelEntry> paged_attention_kernels<fp8_e5m2>();

}  // namespace attention::detail
SLIMSERVE_NAMESPACE_END
