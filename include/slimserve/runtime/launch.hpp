#pragma once
/// \file
/// \brief The one launcher every slimserve kernel goes through.
///
/// On the GPU it is cudaLaunchKernelEx on the caller's stream (so launches can be captured in
/// a CUDA graph); on the CPU emulator it runs the grid synchronously. Library code calls
/// `rt::launch` and does not know which.

#include <cstddef>
#include <utility>

#include "slimserve/runtime/platform.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace rt {

struct LaunchConfig {
  dim3 grid{1, 1, 1};
  dim3 block{1, 1, 1};
  std::size_t dynamic_smem_bytes = 0;
  cudaStream_t stream = nullptr;
};

/// Dynamic shared memory above this needs an explicit opt-in on the GPU.
inline constexpr std::size_t default_dynamic_smem_limit = 48 * 1024;
/// The most a Hopper block may opt into (227 KB); the emulator enforces the same limit.
inline constexpr std::size_t max_dynamic_smem_bytes = 227 * 1024;

template <class... KernelParams, class... Args>
Status launch(void (*kernel)(KernelParams...), const LaunchConfig& config, Args&&... args) {
  if (config.dynamic_smem_bytes > max_dynamic_smem_bytes) {
    return make_status(StatusCode::resource_exhausted, "kernel asks for ",
                       config.dynamic_smem_bytes, " bytes of dynamic shared memory; the limit is ",
                       max_dynamic_smem_bytes);
  }
#if defined(SLIMSERVE_PLATFORM_CUDA)
  if (config.dynamic_smem_bytes > default_dynamic_smem_limit) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(config.dynamic_smem_bytes));
    if (err != cudaSuccess) {
      return make_status(StatusCode::device_error, "cudaFuncSetAttribute: ",
                         cudaGetErrorString(err));
    }
  }
  cudaLaunchConfig_t cuda_config{};
  cuda_config.gridDim = config.grid;
  cuda_config.blockDim = config.block;
  cuda_config.dynamicSmemBytes = config.dynamic_smem_bytes;
  cuda_config.stream = config.stream;
  cudaError_t err = cudaLaunchKernelEx(&cuda_config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    return make_status(StatusCode::device_error, "kernel launch failed: ", cudaGetErrorString(err));
  }
  return {};
#else
  return emu::launch(config.grid, config.block, config.dynamic_smem_bytes, kernel,
                     static_cast<KernelParams>(std::forward<Args>(args))...);
#endif
}

}  // namespace rt
SLIMSERVE_NAMESPACE_END
