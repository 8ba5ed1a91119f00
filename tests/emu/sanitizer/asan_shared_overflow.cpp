// Planted bug for the ASan build: one thread writes one element past the block's dynamic
// shared memory. The emulator allocates exactly the launch's bytes, so ASan must report a
// heap-buffer-overflow. Registered only when SLIMSERVE_SANITIZE contains "address".
#include <cstdio>

#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/runtime/shared_memory.cuh"

namespace rt = slimserve::rt;

struct Shared {
  float values[64];
};

__global__ void shared_overflow_kernel(float* out) {
  auto& shared = rt::shared_storage<Shared>();
  const unsigned t = threadIdx.x;
  shared.values[t] = 1.0f;
  float* row = shared.values;
  if (t == 63) row[t + 1] = 2.0f;  // BUG (planted): one past the end
  __syncthreads();
  out[t] = shared.values[t];
}

int main() {
  auto out = rt::DeviceBuffer<float>::create(64);
  if (!out.ok()) return 1;
  const slimserve::Status status =
      rt::launch(&shared_overflow_kernel, {dim3(1), dim3(64), sizeof(Shared), nullptr}, out->data());
  std::printf("launch: %s\n", status.to_string().c_str());
  return status.ok() ? 0 : 1;
}
