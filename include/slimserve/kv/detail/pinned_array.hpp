#pragma once
/// \file
/// \brief Owning, move-only page-locked host array: the staging memory of asynchronous
/// host-to-device copies.

#include <cstddef>
#include <utility>

#include "slimserve/config.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace kv::detail {

template <class T>
class PinnedArray {
 public:
  PinnedArray() = default;
  static Result<PinnedArray> create(std::size_t count) {
    PinnedArray array;
    if (count == 0) return Result<PinnedArray>(std::move(array));
    void* ptr = nullptr;
    Status status = rt::pinned_malloc(&ptr, count * sizeof(T));
    if (!status.ok()) return status;
    array.data_ = static_cast<T*>(ptr);
    array.size_ = count;
    return Result<PinnedArray>(std::move(array));
  }
  PinnedArray(PinnedArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  PinnedArray& operator=(PinnedArray&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  ~PinnedArray() { reset(); }

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  T& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  void reset() noexcept {
    if (data_ != nullptr) (void)rt::pinned_free(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kv::detail
SLIMSERVE_NAMESPACE_END
