// Planted bug for the TSan build: a producer warpgroup arrives at the "stage full" named
// barrier before it writes the stage, so the consumer warpgroup's reads after its bar.sync
// are not ordered after the writes. The emulator's named barriers order only what comes
// before an arrival, so TSan must report a data race. Registered only when
// SLIMSERVE_SANITIZE contains "thread"; passes when TSan's report appears in the output.
#include <cstdio>
#include <vector>

#include "slimserve/arch/named_barrier.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/runtime/shared_memory.cuh"

namespace rt = slimserve::rt;
namespace arch = slimserve::arch;

struct Shared {
  float stage[128];
};

__global__ void early_arrive_kernel(const float* in, float* out) {
  auto& shared = rt::shared_storage<Shared>();
  const unsigned t = threadIdx.x % 128;
  if (threadIdx.x < 128) {
    arch::named_barrier_arrive(1, 256);  // BUG (planted): arrives before the stage is written
    shared.stage[t] = in[t];
  } else {
    arch::named_barrier_sync(1, 256);
    out[t] = shared.stage[(t + 1) % 128];
  }
}

int main() {
  std::vector<float> host(128, 1.0f);
  auto in = rt::DeviceBuffer<float>::create(128);
  auto out = rt::DeviceBuffer<float>::create(128);
  if (!in.ok() || !out.ok() || !in->upload(host).ok()) return 1;
  const slimserve::Status status = rt::launch(
      &early_arrive_kernel, {dim3(1), dim3(256), sizeof(Shared), nullptr}, in->data(), out->data());
  std::printf("launch: %s\n", status.to_string().c_str());
  return status.ok() ? 0 : 1;
}
