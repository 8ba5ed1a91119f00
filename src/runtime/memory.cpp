// The runtime's memory calls, compiled once per platform: against the CUDA runtime for
// slimserve::slimserve, against the CPU emulator (SLIMSERVE_EMULATE) for slimserve::emulated.
#include "slimserve/runtime/memory.hpp"

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

#if defined(SLIMSERVE_EMULATE)
#include "slimserve/emu/cuda_emu.hpp"
#else
#include <cuda_runtime.h>
#endif

SLIMSERVE_NAMESPACE_BEGIN
namespace rt {

namespace {
// What runtime_counters reports: calls made through this file, on either platform.
std::atomic<std::int64_t> synchronizations{0};
std::atomic<std::int64_t> allocations{0};
std::atomic<std::int64_t> frees{0};
std::atomic<std::int64_t> copies{0};
void count(std::atomic<std::int64_t>& counter) { counter.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

RuntimeCounters runtime_counters() noexcept {
  return {synchronizations.load(std::memory_order_relaxed), allocations.load(std::memory_order_relaxed),
          frees.load(std::memory_order_relaxed), copies.load(std::memory_order_relaxed)};
}

#if defined(SLIMSERVE_EMULATE)
namespace {
// The emulator's live allocations, so that a pointer freed twice (or never allocated here) is
// refused with a status instead of reaching free(), which aborts the process on a double free.
enum class MemoryKind { device, pinned };
struct LiveAllocations {
  std::mutex mutex;
  std::unordered_map<void*, MemoryKind> kinds;
};
LiveAllocations& live_allocations() {
  static LiveAllocations* live = new LiveAllocations;  // never destroyed: frees may run at exit
  return *live;
}
Status allocate(void** ptr, std::size_t bytes, MemoryKind kind) {
  SLIMSERVE_RETURN_IF_ERROR(emu::device_malloc(ptr, bytes));
  count(allocations);
  LiveAllocations& live = live_allocations();
  const std::lock_guard<std::mutex> lock(live.mutex);
  live.kinds[*ptr] = kind;
  return {};
}
Status release(void* ptr, MemoryKind kind) {
  if (ptr == nullptr) return {};
  {
    LiveAllocations& live = live_allocations();
    const std::lock_guard<std::mutex> lock(live.mutex);
    const auto found = live.kinds.find(ptr);
    if (found == live.kinds.end() || found->second != kind) {
      return make_status(StatusCode::failed_precondition, "pointer ", ptr, " is not a live ",
                         kind == MemoryKind::device ? "device" : "pinned host",
                         " allocation (freed already, or not allocated by slimserve)");
    }
    live.kinds.erase(found);
  }
  count(frees);
  return emu::device_free(ptr);
}
}  // namespace

int device_count() noexcept { return 0; }  // the emulator is not a GPU
Result<std::int32_t> current_device_sm_count() { return emulated_sm_count; }
Status device_malloc(void** ptr, std::size_t bytes) { return allocate(ptr, bytes, MemoryKind::device); }
Status device_free(void* ptr) { return release(ptr, MemoryKind::device); }
Status pinned_malloc(void** ptr, std::size_t bytes) { return allocate(ptr, bytes, MemoryKind::pinned); }
Status pinned_free(void* ptr) { return release(ptr, MemoryKind::pinned); }
// Every emulated operation completes before it returns: one legal schedule of a stream.
Status copy_async(void* dst, const void* src, std::size_t bytes, CopyDirection, cudaStream_t) {
  count(copies);
  if (bytes != 0) std::memmove(dst, src, bytes);
  return {};
}
Status memset_async(void* dst, int value, std::size_t bytes, cudaStream_t) {
  if (bytes != 0) std::memset(dst, value, bytes);
  return {};
}
Status stream_synchronize(cudaStream_t) {
  count(synchronizations);
  return {};
}
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
  count(allocations);
  return cuda_status(cudaMalloc(ptr, bytes), "cudaMalloc");
}
Status device_free(void* ptr) {
  count(frees);
  return cuda_status(cudaFree(ptr), "cudaFree");
}
Status pinned_malloc(void** ptr, std::size_t bytes) {
  count(allocations);
  return cuda_status(cudaMallocHost(ptr, bytes), "cudaMallocHost");
}
Status pinned_free(void* ptr) {
  count(frees);
  return cuda_status(cudaFreeHost(ptr), "cudaFreeHost");
}
Status copy_async(void* dst, const void* src, std::size_t bytes, CopyDirection direction,
                  cudaStream_t stream) {
  count(copies);
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
  count(synchronizations);
  return cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}
#endif

}  // namespace rt
SLIMSERVE_NAMESPACE_END
