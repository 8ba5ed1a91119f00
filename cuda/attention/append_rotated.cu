// The rotated append kernels (K, or K and V, Walsh-Hadamard rotated before quantization):
// every format with an append kernel, both input types, the head dims of RotationHeadDims.
#include <array>
#include <cstddef>

#include "append_launchers.cuh"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::detail {
namespace {

struct RotatedAppendEntry {
  KvDtype kv_dtype;
  ActivationDtype input_dtype;
  std::int32_t head_dim;
  KvRotation rotation;
  AppendLauncher launch;
};

template <class KvT, class InT, int HeadDim, bool RotateValues>
Status launch_rotated_append(const kernels::AppendParams& params, dim3 grid, dim3 block, cudaStream_t stream) {
  return rt::launch(kernels::rotated_append_kernel<KvT, InT, HeadDim, RotateValues>,
                    rt::LaunchConfig{grid, block, 0, stream}, params);
}

const auto& rotated_append_table() {
  static const auto table = [] {
    std::array<RotatedAppendEntry, 2 * 2 * kv_format_count * RotationHeadDims::size> entries{};
    std::size_t count = 0;
    auto add = [&]<class KvT>() {
      if constexpr (format_has_kernel<KvT>(KvKernel::append)) {
        RotationHeadDims::for_each([&]<int HeadDim>() {
          entries[count++] = {kv_dtype_of<KvT>::value, ActivationDtype::bf16, HeadDim, KvRotation::keys,
                              &launch_rotated_append<KvT, bf16, HeadDim, false>};
          entries[count++] = {kv_dtype_of<KvT>::value, ActivationDtype::fp16, HeadDim, KvRotation::keys,
                              &launch_rotated_append<KvT, fp16, HeadDim, false>};
          entries[count++] = {kv_dtype_of<KvT>::value, ActivationDtype::bf16, HeadDim, KvRotation::keys_and_values,
                              &launch_rotated_append<KvT, bf16, HeadDim, true>};
          entries[count++] = {kv_dtype_of<KvT>::value, ActivationDtype::fp16, HeadDim, KvRotation::keys_and_values,
                              &launch_rotated_append<KvT, fp16, HeadDim, true>};
        });
      }
    };
    for_each_kv_format(add);
    return entries;
  }();
  return table;
}

}  // namespace

AppendLauncher rotated_append_launcher(KvDtype kv_dtype, ActivationDtype input_dtype, std::int32_t head_dim,
                                       KvRotation rotation) {
  for (const auto& entry : rotated_append_table()) {
    if (entry.launch != nullptr && entry.kv_dtype == kv_dtype && entry.input_dtype == input_dtype &&
        entry.head_dim == head_dim && entry.rotation == rotation) {
      return entry.launch;
    }
  }
  return nullptr;
}

}  // namespace attention::detail
SLIMSERVE_NAMESPACE_END
