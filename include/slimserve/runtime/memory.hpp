#pragma once
/// \file
/// \brief Device memory, copies and stream sync, the same on the GPU and on the CPU emulator.
///
/// On the emulator "device" memory is host memory that starts poisoned (0xFF bytes: NaN for
/// floats, -1 for integers), as freshly allocated GPU memory holds garbage, so a kernel that
/// reads what nothing wrote produces visibly wrong results. All emulated operations complete
/// before they return, which is one legal schedule of an asynchronous stream.

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "slimserve/config.hpp"
#include "slimserve/runtime/stream.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace rt {

enum class CopyDirection { host_to_device, device_to_host, device_to_device };

// Defined once per platform in the compiled library (src/runtime/memory.cpp): the CUDA runtime
// in slimserve::slimserve, the emulator in slimserve::emulated. Declaring them here, out of
// line, is what lets host code include this header (and the kv headers built on it) with a
// plain C++ compiler.

/// GPUs visible to the process; 0 without a GPU and always 0 in the emulator.
int device_count() noexcept;
/// What the emulator reports as its SM count: it has none, and a small number keeps the grids
/// the plans size from it small.
inline constexpr std::int32_t emulated_sm_count = 8;
/// Streaming multiprocessors of the current device (emulated_sm_count in the emulator): what
/// num_sms 0 in a plan's arguments or a workspace bound resolves to. device_error when the
/// runtime cannot say (no device).
Result<std::int32_t> current_device_sm_count();
Status device_malloc(void** ptr, std::size_t bytes);
Status device_free(void* ptr);
/// Page-locked host memory (ordinary host memory in the emulator).
Status pinned_malloc(void** ptr, std::size_t bytes);
Status pinned_free(void* ptr);
Status copy_async(void* dst, const void* src, std::size_t bytes, CopyDirection direction,
                  cudaStream_t stream);
Status memset_async(void* dst, int value, std::size_t bytes, cudaStream_t stream);
Status stream_synchronize(cudaStream_t stream);

/// Calls made through the functions above since the process started (both platforms): what a
/// test reads around a run to prove it neither synchronized nor allocated. Relaxed counts.
struct RuntimeCounters {
  std::int64_t synchronizations = 0;  ///< stream_synchronize
  std::int64_t allocations = 0;       ///< device_malloc and pinned_malloc
  std::int64_t frees = 0;             ///< device_free and pinned_free
  std::int64_t copies = 0;            ///< copy_async
};
RuntimeCounters runtime_counters() noexcept;

/// Owning, move-only device allocation of `count` elements of T.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> create(std::size_t count) {
    DeviceBuffer buffer;
    // Explicit moves: nvcc's front end does not apply C++20's implicit move to a return
    // that goes through Result's converting constructor.
    if (count == 0) return Result<DeviceBuffer>(std::move(buffer));
    void* ptr = nullptr;
    Status status = device_malloc(&ptr, count * sizeof(T));
    if (!status.ok()) return status;
    buffer.data_ = static_cast<T*>(ptr);
    buffer.size_ = count;
    return Result<DeviceBuffer>(std::move(buffer));
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }

  Status upload(std::span<const T> host, cudaStream_t stream = nullptr) {
    if (host.size() > size_) {
      return make_status(StatusCode::out_of_range, "upload of ", host.size(),
                         " elements into a device buffer of ", size_);
    }
    return copy_async(data_, host.data(), host.size_bytes(), CopyDirection::host_to_device,
                      stream);
  }
  Status download(std::span<T> host, cudaStream_t stream = nullptr) const {
    if (host.size() > size_) {
      return make_status(StatusCode::out_of_range, "download of ", host.size(),
                         " elements from a device buffer of ", size_);
    }
    return copy_async(host.data(), data_, host.size_bytes(), CopyDirection::device_to_host,
                      stream);
  }
  /// Fills every byte with `byte` (tests poison outputs with this before each run).
  Status fill_bytes(int byte, cudaStream_t stream = nullptr) {
    return memset_async(data_, byte, size_bytes(), stream);
  }

 private:
  void reset() noexcept {
    if (data_ != nullptr) (void)device_free(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace rt
SLIMSERVE_NAMESPACE_END
