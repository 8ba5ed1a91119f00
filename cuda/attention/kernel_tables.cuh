#pragma once
// Typed dispatch tables of the attention kernels: one entry per (stored type, activation type,
// head_dim) instantiation, looked up at run time by the façade. Each decode table lives in its
// own translation unit (decode_<type>.cu, made for every format of SLIMSERVE_KV_FORMAT_LIST by
// tools/gen_kv_formats.py) so the instantiations compile in parallel.

#include <cstdint>
#include <span>

#include "slimserve/attention/kernels/append_kernel.cuh"
#include "slimserve/attention/kernels/decode_kernel.cuh"
#include "slimserve/attention/kernels/dequantize_kernel.cuh"
#include "slimserve/kv/kv_cache_view.hpp"
#include "slimserve/kv/kv_format.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/runtime/launch.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::detail {

/// The KvDtype of a stored type: its KvFormat trait's.
template <class T> struct kv_dtype_of { static constexpr KvDtype value = KvFormat<T>::dtype; };

template <class T> struct activation_dtype_of;
template <> struct activation_dtype_of<bf16> { static constexpr ActivationDtype value = ActivationDtype::bf16; };
template <> struct activation_dtype_of<fp16> { static constexpr ActivationDtype value = ActivationDtype::fp16; };

/// The fields every page-touching kernel's Params share (cache storage, scales, page table,
/// tag-check verdicts), filled from the façade's arguments in one place.
template <class Params>
void fill_paged_cache_fields(Params& params, const PagedKVCacheView& cache,
                             const kv::PageTableView& table,
                             const kv::RequestStatus* request_status) {
  params.k_pages = cache.k_pages;
  params.v_pages = cache.v_pages;
  params.k_scale = cache.k_scale;
  params.v_scale = cache.v_scale;
  params.k_token_scales = cache.k_token_scales;
  params.v_token_scales = cache.v_token_scales;
  params.num_pages = cache.num_pages;
  params.layout = cache.layout;
  params.scale_mode = cache.scale_mode;
  params.indptr = table.indptr;
  params.indices = table.indices;
  params.last_page_len = table.last_page_len;
  params.status = request_status;
}

// ---- decode ---------------------------------------------------------------------------------
using DecodeLauncher = Status (*)(const kernels::DecodeParams&, dim3 grid, dim3 block,
                                  cudaStream_t stream);
struct DecodeKernelEntry {
  KvDtype kv_dtype;
  ActivationDtype q_dtype;
  std::int32_t head_dim;
  DecodeLauncher launch;
};

template <class KvT, class QT, int HeadDim>
Status launch_decode(const kernels::DecodeParams& params, dim3 grid, dim3 block, cudaStream_t stream) {
  return rt::launch(kernels::decode_kernel<KvT, QT, HeadDim>,
                    rt::LaunchConfig{grid, block, sizeof(kernels::DecodeSharedStorage<KvT, HeadDim>), stream},
                    params);
}

template <class KvT, class QT, int HeadDim>
constexpr DecodeKernelEntry decode_entry() {
  return {kv_dtype_of<KvT>::value, activation_dtype_of<QT>::value, HeadDim,
          &launch_decode<KvT, QT, HeadDim>};
}

/// The six decode instantiations (2 query types x 3 head dims) of one stored type; none for a
/// format whose trait does not list KvKernel::decode (its preflight refuses it).
template <class KvT>
std::span<const DecodeKernelEntry> decode_kernels() {
  if constexpr (format_has_kernel<KvT>(KvKernel::decode)) {
    static constexpr DecodeKernelEntry table[] = {
        decode_entry<KvT, bf16, 64>(), decode_entry<KvT, bf16, 128>(), decode_entry<KvT, bf16, 256>(),
        decode_entry<KvT, fp16, 64>(), decode_entry<KvT, fp16, 128>(), decode_entry<KvT, fp16, 256>(),
    };
    return table;
  } else {
    return {};
  }
}
// Instantiated once per format, in decode_<format>.cu.
#define SLIMSERVE_DECODE_EXTERN(name, ...) \
  extern template std::span<const DecodeKernelEntry> decode_kernels<::slimserve::name>();
SLIMSERVE_KV_FORMAT_LIST(SLIMSERVE_DECODE_EXTERN)
#undef SLIMSERVE_DECODE_EXTERN

/// The decode table of a cache's format (empty for a value outside the list).
inline std::span<const DecodeKernelEntry> decode_table(KvDtype dtype) {
  std::span<const DecodeKernelEntry> table;
  for_each_kv_format([&]<class KvT>() {
    if (kv_dtype_of<KvT>::value == dtype) table = decode_kernels<KvT>();
  });
  return table;
}

}  // namespace attention::detail
SLIMSERVE_NAMESPACE_END
