// The NVFP4 widening probe, compiled into an object of the default build so the SASS report
// prices the register widening (formats/nvfp4_widen.cuh) before an attention kernel uses it
// (tests/perf/CMakeLists.txt). Not part of the library; sm_90a only.
//
// nvfp4_widen_probe_kernel<T>: what an attention kernel's "dequantize the K/V tile once into
// 16-bit shared memory" step does at head_dim 128. Per tile step each thread loads two chunks
// of 16 B of codes (32 elements: two 16-element blocks, a quarter of a head vector) and their
// 2 scale bytes each, widens them to 64 B of T each (exact; see nvfp4_widen.cuh) and stores
// those to a double-buffered shared tile; one barrier per step, as a tile loop has.
#include <cstdint>

#include "slimserve/formats/nvfp4_widen.cuh"

namespace slimserve_calibration {

inline constexpr int probe_threads = 256;
inline constexpr int probe_unroll = 2;  // 16-byte chunks per thread per tile step

/// Widens one chunk (32 codes, 2 blocks) into 4 x 16 B of T at `tile`.
template <class T>
__device__ __forceinline__ void widen_chunk(uint4 c, std::uint16_t scales, uint4* tile) {
  std::uint32_t operand[2];
  slimserve::nvfp4_scale_operands<T>(scales, operand);
  std::uint32_t r[4][4];
  slimserve::nvfp4_widen8<T>(c.x, operand[0], r[0]);
  slimserve::nvfp4_widen8<T>(c.y, operand[0], r[1]);
  slimserve::nvfp4_widen8<T>(c.z, operand[1], r[2]);
  slimserve::nvfp4_widen8<T>(c.w, operand[1], r[3]);
  for (int w = 0; w < 4; ++w) tile[w] = make_uint4(r[w][0], r[w][1], r[w][2], r[w][3]);
}

/// Full tiles of probe_unroll x probe_threads chunks only (a probe for the SASS report, never
/// launched on a partial tile).
template <class T>
__global__ void __launch_bounds__(probe_threads)
    nvfp4_widen_probe_kernel(const uint4* __restrict__ codes,             // [n] 32 codes each
                             const std::uint16_t* __restrict__ scales,    // [n] 2 E4M3 each
                             uint4* __restrict__ sink, int n) {
  __shared__ uint4 tile[2][probe_unroll * probe_threads * 4];  // [buffer][chunk][4 x 16 B]
  constexpr int step = probe_unroll * probe_threads;
  int buffer = 0;
  for (int base = static_cast<int>(blockIdx.x) * step; base + step <= n;
       base += static_cast<int>(gridDim.x) * step) {
    for (int u = 0; u < probe_unroll; ++u) {
      const int chunk = u * probe_threads + static_cast<int>(threadIdx.x);
      widen_chunk<T>(codes[base + chunk], scales[base + chunk], &tile[buffer][chunk * 4]);
    }
    __syncthreads();
    buffer ^= 1;
  }
  // Keep the tile live: one 16-byte read back per thread.
  sink[blockIdx.x * probe_threads + threadIdx.x] = tile[buffer ^ 1][(threadIdx.x * 5) % (step * 4)];
}

template __global__ void nvfp4_widen_probe_kernel<slimserve::fp16>(const uint4*, const std::uint16_t*,
                                                                   uint4*, int);
template __global__ void nvfp4_widen_probe_kernel<slimserve::bf16>(const uint4*, const std::uint16_t*,
                                                                   uint4*, int);

}  // namespace slimserve_calibration
