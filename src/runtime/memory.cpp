// The runtime's memory calls, compiled once per platform: against the CUDA runtime for
// slimserve::slimserve, against the CPU emulator (SLIMSERVE_EMULATE) for slimserve::emulated.
#include "slimserve/runtime/memory.hpp"

#include <cstring>

#if defined(SLIMSERVE_EMULATE)
#include "slimserve/emu/cuda_emu.hpp"
#else
#include <cuda_runtime.h>
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace rt {

#if defined(SLIMSERVE_EMULATE)
int device_count() noexcept { return 0; }  // the emulator is not a GPU
Result<std::int32_t> current_device_sm_count() { return emulated_sm_count; }
Status device_malloc(void** ptr, std::size_t bytes) { return emu::device_malloc(ptr, bytes); }
Status device_free(void* ptr) { return emu::device_free(ptr); }
Status pinned_malloc(void** ptr, std::size_t bytes) { return emu::device_malloc(ptr, bytes); }
Status pinned_free(void* ptr) { return emu::device_free(ptr); }
// Every emulated operation completes before it returns: one legal schedule of a stream.
Status copy_async(void* dst, const void* src, std::size_t bytes, CopyDirection, cudaStream_t) {
  if (bytes != 0) std::memmove(dst, src, bytes);
  return {};
}
Status memset_async(void* dst, int value, std::size_t bytes, cudaStream_t) {
  if (bytes != 0) std::memset(dst, value, bytes);
  return {};
}
Status stream_synchronize(cudaStream_t) { return {}; }
#else
namespace {
Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return {};
  return make_status(StatusCode::device_error, what, ": ", cudaGetErrorString(err));
}
}  // namespace

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}
Result<std::int32_t> current_device_sm_count() {
  int device = 0;
  int count = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // no sticky error for the caller's next call
    return cuda_status(err, "the current device's SM count");
  }
  return std::int32_t{count};
}
Status device_malloc(void** ptr, std::size_t bytes) {
  return cuda_status(cudaMalloc(ptr, bytes), "cudaMalloc");
}
Status device_free(void* ptr) { return cuda_status(cudaFree(ptr), "cudaFree"); }
Status pinned_malloc(void** ptr, std::size_t bytes) {
  return cuda_status(cudaMallocHost(ptr, bytes), "cudaMallocHost");
}
Status pinned_free(void* ptr) { return cuda_status(cudaFreeHost(ptr), "cudaFreeHost"); }
Status copy_async(void* dst, const void* src, std::size_t bytes, CopyDirection direction,
                  cudaStream_t stream) {
  const cudaMemcpyKind kind = direction == CopyDirection::host_to_device ? cudaMemcpyHostToDevice
                              : direction == CopyDirection::device_to_host
                                  ? cudaMemcpyDeviceToHost
                                  : cudaMemcpyDeviceToDevice;
  return cuda_status(cudaMemcpyAsync(dst, src, bytes, kind, stream), "cudaMemcpyAsync");
}
Status memset_async(void* dst, int value, std::size_t bytes, cudaStream_t stream) {
  return cuda_status(cudaMemsetAsync(dst, value, bytes, stream), "cudaMemsetAsync");
}
Status stream_synchronize(cudaStream_t stream) {
  return cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}
#endif

}  // namespace rt
SLIMSERVE_NAMESPACE_END
