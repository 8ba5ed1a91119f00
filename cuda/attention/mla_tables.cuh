#pragma once
// Typed dispatch tables of the MLA kernels. The supported (latent type x CTA rows) decode
// instantiations and the latent types of append/gather are listed once, in
// `for_each_mla_latent` and `for_each_mla_warps_m`; every table is generated from them.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

// The kernels first: kernel_tables.cuh opens attention::detail, which would shadow the
// formats' detail:: names that the fragment helpers use.
#include "slimserve/attention/kernels/mla_cache_kernels.cuh"
#include "slimserve/attention/kernels/mla_decode_kernel.cuh"
#include "slimserve/attention/kernels/mla_wgmma_decode_kernel.cuh"
#include "kernel_tables.cuh"
#include "slimserve/attention/mla.hpp"
#include "slimserve/runtime/launch.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::detail {

/// Latent types of the MLA cache: adding one is one edit here (and in validate_mla_cache_view).
template <class F>
constexpr void for_each_mla_latent(F&& f) {
  f.template operator()<bf16>();
  f.template operator()<fp8_e4m3>();
  f.template operator()<nvfp4>();
}
inline constexpr std::size_t mla_latent_count = [] {
  std::size_t count = 0;
  for_each_mla_latent([&]<class>() { ++count; });
  return count;
}();
/// CTA shapes of the decode kernel: 16 or 32 packed (query token x head) rows.
template <class F>
constexpr void for_each_mla_warps_m(F&& f) {
  f.template operator()<1>();
  f.template operator()<2>();
}

using MlaDecodeLauncher = Status (*)(const kernels::MlaDecodeParams&, dim3 grid, cudaStream_t stream);
struct MlaDecodeKernelEntry {
  KvDtype kv_dtype;
  std::int32_t warps_m;
  std::size_t shared_bytes;
  MlaDecodeLauncher launch;
};

/// Shared memory of one SM (cc 9.0), of which each resident CTA also takes 1 KiB.
inline constexpr std::size_t mla_sm_shared_bytes = 228 * 1024;
inline constexpr std::size_t mla_cta_reserved_shared_bytes = 1024;

template <class KvT, int WarpsM>
Status launch_mla_decode(const kernels::MlaDecodeParams& params, dim3 grid, cudaStream_t stream) {
  using Tile = kernels::MlaDecodeTile<KvT, WarpsM>;
  // The plan fills mla_decode_resident_ctas CTA slots per SM: the kernel must hold that many.
  static_assert(Tile::min_ctas_per_sm == mla_decode_resident_ctas(kv_dtype_of<KvT>::value, WarpsM));
  static_assert(Tile::min_ctas_per_sm * (sizeof(kernels::MlaDecodeSharedStorage<KvT, WarpsM>) +
                                         mla_cta_reserved_shared_bytes) <=
                mla_sm_shared_bytes);
  return rt::launch(kernels::mla_decode_kernel<KvT, bf16, WarpsM>,
                    rt::LaunchConfig{grid, dim3(Tile::threads), sizeof(kernels::MlaDecodeSharedStorage<KvT, WarpsM>),
                                     stream},
                    params);
}

/// The wgmma kernel's entry: 64 rows per CTA (MlaDecodePlan::warps_m == 4).
inline constexpr std::int32_t mla_wgmma_warps_m = 4;
template <class KvT>
Status launch_mla_wgmma_decode(const kernels::MlaDecodeParams& params, dim3 grid, cudaStream_t stream) {
  using Tile = kernels::MlaWgmmaTile<KvT>;
  static_assert(mla_decode_resident_ctas(kv_dtype_of<KvT>::value, mla_wgmma_warps_m) == 1);
  return rt::launch(kernels::mla_wgmma_decode_kernel<KvT>,
                    rt::LaunchConfig{grid, dim3(Tile::threads), Tile::shared_bytes, stream}, params);
}

inline std::span<const MlaDecodeKernelEntry> mla_decode_kernels() {
  static const auto table = [] {
    // Per latent type: the mma.sync CTA shapes and the wgmma kernel.
    constexpr std::size_t shapes = [] {
      std::size_t count = 1;  // the wgmma kernel
      for_each_mla_warps_m([&]<int>() { ++count; });
      return count;
    }();
    std::array<MlaDecodeKernelEntry, shapes * mla_latent_count> entries{};
    std::size_t count = 0;
    for_each_mla_latent([&]<class KvT>() {
      for_each_mla_warps_m([&]<int WarpsM>() {
        entries[count++] = {kv_dtype_of<KvT>::value, WarpsM, sizeof(kernels::MlaDecodeSharedStorage<KvT, WarpsM>),
                            &launch_mla_decode<KvT, WarpsM>};
      });
      entries[count++] = {kv_dtype_of<KvT>::value, mla_wgmma_warps_m, kernels::MlaWgmmaTile<KvT>::shared_bytes,
                          &launch_mla_wgmma_decode<KvT>};
    });
    return entries;
  }();
  return {table.data(), table.size()};
}

using MlaAppendLauncher = Status (*)(const kernels::MlaAppendParams&, dim3 grid, cudaStream_t stream);
struct MlaAppendKernelEntry {
  KvDtype kv_dtype;
  ActivationDtype input_dtype;
  MlaAppendLauncher launch;
};
template <class KvT, class InT>
Status launch_mla_append(const kernels::MlaAppendParams& params, dim3 grid, cudaStream_t stream) {
  return rt::launch(kernels::mla_append_kernel<KvT, InT>,
                    rt::LaunchConfig{grid, dim3(kernels::mla_token_threads), 0, stream}, params);
}
inline std::span<const MlaAppendKernelEntry> mla_append_kernels() {
  static const auto table = [] {
    std::array<MlaAppendKernelEntry, 2 * mla_latent_count> entries{};
    std::size_t count = 0;
    for_each_mla_latent([&]<class KvT>() {
      entries[count++] = {kv_dtype_of<KvT>::value, ActivationDtype::bf16, &launch_mla_append<KvT, bf16>};
      entries[count++] = {kv_dtype_of<KvT>::value, ActivationDtype::fp16, &launch_mla_append<KvT, fp16>};
    });
    return entries;
  }();
  return {table.data(), table.size()};
}

using MlaGatherLauncher = Status (*)(const kernels::MlaGatherParams&, dim3 grid, cudaStream_t stream);
struct MlaGatherKernelEntry {
  KvDtype kv_dtype;
  MlaGatherLauncher launch;
};
template <class KvT>
Status launch_mla_gather(const kernels::MlaGatherParams& params, dim3 grid, cudaStream_t stream) {
  return rt::launch(kernels::mla_gather_kernel<KvT>,
                    rt::LaunchConfig{grid, dim3(kernels::mla_token_threads), 0, stream}, params);
}
inline std::span<const MlaGatherKernelEntry> mla_gather_kernels() {
  static const auto table = [] {
    std::array<MlaGatherKernelEntry, mla_latent_count> entries{};
    std::size_t count = 0;
    for_each_mla_latent([&]<class KvT>() { entries[count++] = {kv_dtype_of<KvT>::value, &launch_mla_gather<KvT>}; });
    return entries;
  }();
  return {table.data(), table.size()};
}

}  // namespace attention::detail
SLIMSERVE_NAMESPACE_END
