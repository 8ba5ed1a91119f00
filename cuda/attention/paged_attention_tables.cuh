#pragma once
// Typed dispatch table of the tensor-core paged attention kernel: one entry per (stored type,
// activation type, head_dim) instantiation: every format of SLIMSERVE_KV_FORMAT_LIST x
// for_each_activation x PagedHeadDims. Each stored type's entries compile in their own
// translation unit (paged_attention_<type>.cu, made by tools/gen_kv_formats.py) so they build
// in parallel.

#include <array>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "kernel_tables.cuh"
#include "slimserve/attention/kernels/paged_attention_kernel.cuh"
#include "slimserve/attention/kernels/paged_prefill_wgmma_kernel.cuh"
#include "paged_prefill_pingpong_launch.cuh"

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
  /// Fused prefill (quantize-and-append of the chunk), every format (NVFP4: chunk tiles in the
  /// NVFP4 d order, the append's block quantizer; chunk_kv.cuh).
  PagedAttentionLauncher launch_fused;
  /// The wgmma prefill kernel (64-row schedules), or null where PagedWgmmaHeadDims lacks the
  /// head_dim or the format is NVFP4 (the plan then keeps the mma.sync kernel).
  PagedAttentionLauncher launch_wgmma;
  PagedAttentionLauncher launch_wgmma_ping_pong;  ///< the same, warp-specialized (paged_prefill_pingpong_launch.cuh)
  /// Attention over a rotated cache (paged_attention_rotated_kernel); null outside RotationHeadDims.
  PagedAttentionLauncher launch_rotated;
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
Status launch_paged_attention_rotated(const kernels::PagedAttentionParams& params, dim3 grid, cudaStream_t stream) {
  using Tile = kernels::PagedAttentionTile<KvT, HeadDim>;
  return rt::launch(kernels::paged_attention_rotated_kernel<KvT, QT, HeadDim>,
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

/// Formats whose head vectors carry in-vector block scales (NVFP4): read by the mma.sync
/// kernel only.
template <class KvT>
inline constexpr bool block_scaled_format = KvFormat<KvT>::scales == KvScaleGeometry::per_block;

template <class KvT, class QT, int HeadDim>
constexpr PagedAttentionLauncher paged_wgmma_launcher() {
  if constexpr (PagedWgmmaHeadDims::contains(HeadDim) && !block_scaled_format<KvT>) {
    return &launch_paged_prefill_wgmma<KvT, QT, HeadDim>;
  } else {
    return nullptr;
  }
}

template <class KvT, class QT, int HeadDim>
constexpr PagedAttentionKernelEntry paged_attention_entry() {
  PagedAttentionLauncher ping_pong = nullptr, rotated = nullptr;
  if constexpr (RotationHeadDims::contains(HeadDim)) rotated = &launch_paged_attention_rotated<KvT, QT, HeadDim>;
  if constexpr (!block_scaled_format<KvT>) ping_pong = paged_pingpong_launcher<KvT, QT, HeadDim>();
  return {kv_dtype_of<KvT>::value, activation_dtype_of<QT>::value, HeadDim,
          sizeof(kernels::PagedAttentionSharedStorage<KvT, HeadDim>),
          &launch_paged_attention<KvT, QT, HeadDim>, &launch_paged_prefill_fused<KvT, QT, HeadDim>,
          paged_wgmma_launcher<KvT, QT, HeadDim>(), ping_pong, rotated};
}

/// head_dims a format's head vector fits: whole 4-byte words (NVFP4 at 96 would be 54 bytes,
/// refused by validate_cache_view, so not instantiated).
template <class KvT, int HeadDim>
inline constexpr bool paged_head_dim_fits = HeadDim * KvFormat<KvT>::bits / 8 % 32 == 0 &&
                                            (!block_scaled_format<KvT> || HeadDim * 9 / 16 % 4 == 0);

/// Activation types a cache computes with: 16-bit caches their own type, FP8 caches either.
template <class KvT, class F>
constexpr void for_each_activation(F&& f) {
  if constexpr (KvFormat<KvT>::computes_in_storage_type) {
    f.template operator()<KvT>();
  } else {
    f.template operator()<bf16>();
    f.template operator()<fp16>();
  }
}

/// Every instantiation of one stored type; none for a format whose trait does not list
/// KvKernel::paged_attention (its preflight refuses it).
template <class KvT>
std::span<const PagedAttentionKernelEntry> paged_attention_kernels() {
  if constexpr (format_has_kernel<KvT>(KvKernel::paged_attention)) {
    static const auto table = [] {
      std::array<PagedAttentionKernelEntry, 2 * PagedHeadDims::size> entries{};
      std::size_t count = 0;
      for_each_activation<KvT>([&]<class QT>() {
        PagedHeadDims::for_each([&]<int HeadDim>() {
          if constexpr (paged_head_dim_fits<KvT, HeadDim>) entries[count++] = paged_attention_entry<KvT, QT, HeadDim>();
        });
      });
      return std::pair{entries, count};
    }();
    return {table.first.data(), table.second};
  } else {
    return {};
  }
}
// Instantiated once per format, in paged_attention_<format>.cu.
#define SLIMSERVE_PAGED_ATTENTION_EXTERN(name, ...) \
  extern template std::span<const PagedAttentionKernelEntry> paged_attention_kernels<::slimserve::name>();
SLIMSERVE_KV_FORMAT_LIST(SLIMSERVE_PAGED_ATTENTION_EXTERN)
#undef SLIMSERVE_PAGED_ATTENTION_EXTERN

/// The paged attention table of a cache's format (empty for a value outside the list).
inline std::span<const PagedAttentionKernelEntry> paged_attention_table(KvDtype dtype) {
  std::span<const PagedAttentionKernelEntry> table;
  for_each_kv_format([&]<class KvT>() {
    if (kv_dtype_of<KvT>::value == dtype) table = paged_attention_kernels<KvT>();
  });
  return table;
}

}  // namespace attention::detail
SLIMSERVE_NAMESPACE_END
