#pragma once
// PLACEHOLDER: the CPU kernel emulator is being written; this stub only fixes its interface.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include "slimserve/config.hpp"
#include "slimserve/status.hpp"

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;

SLIMSERVE_NAMESPACE_BEGIN
namespace emu {
inline Status device_malloc(void** ptr, std::size_t bytes) {
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (*ptr == nullptr) return Status(StatusCode::resource_exhausted, "emulated malloc failed");
  std::memset(*ptr, 0xFF, bytes);
  return {};
}
inline Status device_free(void* ptr) { std::free(ptr); return {}; }
template <class... P, class... A>
Status launch(dim3, dim3, std::size_t, void (*)(P...), A&&...) {
  return Status(StatusCode::unsupported, "emulator not written yet");
}
}  // namespace emu
SLIMSERVE_NAMESPACE_END
