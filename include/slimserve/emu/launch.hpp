#pragma once
/// \file
/// \brief The emulator's kernel launch and "device" memory.

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

#include "slimserve/config.hpp"
#include "slimserve/emu/scheduler.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu {

/// Host memory standing in for device memory: 256-byte aligned and poisoned (0xFF bytes:
/// NaN floats, -1 integers), like the garbage in fresh GPU memory.
inline Status device_malloc(void** ptr, std::size_t bytes) {
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (*ptr == nullptr) {
    return make_status(StatusCode::resource_exhausted, "emulated device malloc of ", bytes,
                       " bytes failed");
  }
  std::memset(*ptr, 0xFF, bytes);
  return {};
}
inline Status device_free(void* ptr) {
  std::free(ptr);
  return {};
}

namespace detail {

template <class... Params>
struct BoundKernel {
  void (*kernel)(Params...);
  std::tuple<std::decay_t<Params>...> arguments;

  static void run(const void* self) {
    const auto& bound = *static_cast<const BoundKernel*>(self);
    std::apply(bound.kernel, bound.arguments);  // each thread gets its own copies
  }
};

struct AlignedBytesDelete {
  void operator()(unsigned char* bytes) const noexcept {
    ::operator delete(bytes, std::align_val_t{128});
  }
};

inline Status check_launch_shape(dim3 grid, dim3 block, std::size_t dynamic_smem_bytes) {
  const unsigned long long threads =
      static_cast<unsigned long long>(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0) {
    return make_status(StatusCode::invalid_argument, "emulated launch: empty grid (", grid.x,
                       ',', grid.y, ',', grid.z, ") or block (", block.x, ',', block.y, ',',
                       block.z, ')');
  }
  if (threads > max_threads_per_block || block.z > 64 || grid.y > 65535 || grid.z > 65535) {
    return make_status(StatusCode::invalid_argument, "emulated launch: block (", block.x, ',',
                       block.y, ',', block.z, ") or grid (", grid.x, ',', grid.y, ',', grid.z,
                       ") exceeds the CUDA limits (1024 threads per block)");
  }
  if (dynamic_smem_bytes > max_shared_memory_bytes) {
    return make_status(StatusCode::resource_exhausted, "emulated launch: ", dynamic_smem_bytes,
                       " bytes of dynamic shared memory; the limit is ", max_shared_memory_bytes);
  }
  return {};
}

}  // namespace detail

/// Runs kernel<<<grid, block, dynamic_smem_bytes>>>(args...) on the CPU, synchronously.
/// Errors found while running (divergent barriers, bad warp masks, deadlocks, traps) come
/// back as StatusCode::device_error naming the block and thread.
template <class... Params, class... Args>
Status launch(dim3 grid, dim3 block, std::size_t dynamic_smem_bytes, void (*kernel)(Params...),
              Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "wrong number of kernel arguments");
  SLIMSERVE_RETURN_IF_ERROR(detail::check_launch_shape(grid, block, dynamic_smem_bytes));
  const detail::BoundKernel<Params...> bound{kernel, {std::forward<Args>(args)...}};
  // Exactly sized, so ASan reports any access past the requested bytes.
  std::unique_ptr<unsigned char, detail::AlignedBytesDelete> shared_memory(
      static_cast<unsigned char*>(::operator new(dynamic_smem_bytes, std::align_val_t{128})));
  detail::LaunchState state;
  state.grid_dim = grid;
  state.block_dim = block;
  state.dynamic_smem = shared_memory.get();
  state.dynamic_smem_bytes = dynamic_smem_bytes;
  state.run_kernel = &detail::BoundKernel<Params...>::run;
  state.bound_kernel = &bound;
  return detail::Scheduler::for_this_thread().run(state);
}

}  // namespace emu
SLIMSERVE_NAMESPACE_END
