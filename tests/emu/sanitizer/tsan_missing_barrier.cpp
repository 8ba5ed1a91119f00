// Planted bug for the TSan build: the kernel reads its neighbour's shared-memory slot without
// the __syncthreads() that should separate the write from the read. The emulator runs each
// thread as a TSan fiber and only barriers order them, so TSan must report a data race.
// Registered only when SLIMSERVE_SANITIZE contains "thread"; passes when TSan's report
// appears in the output.
#include <cstdio>
#include <vector>

#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/runtime/shared_memory.cuh"

namespace rt = slimserve::rt;

struct Shared {
  float values[64];
};

__global__ void missing_barrier_kernel(const float* in, float* out) {
  auto& shared = rt::shared_storage<Shared>();
  const unsigned t = threadIdx.x;
  shared.values[t] = in[t];
  // BUG (planted): __syncthreads() missing here.
  out[t] = shared.values[(t + 1) % 64];
}

int main() {
  std::vector<float> host(64, 1.0f);
  auto in = rt::DeviceBuffer<float>::create(64);
  auto out = rt::DeviceBuffer<float>::create(64);
  if (!in.ok() || !out.ok() || !in->upload(host).ok()) return 1;
  const slimserve::Status status = rt::launch(
      &missing_barrier_kernel, {dim3(1), dim3(64), sizeof(Shared), nullptr}, in->data(), out->data());
  std::printf("launch: %s\n", status.to_string().c_str());
  return status.ok() ? 0 : 1;
}
