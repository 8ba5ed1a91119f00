#pragma once
/// \file
/// \brief rotate_heads' kernel: one head vector per head_dim / 8 consecutive threads, 8
/// elements (one 16-byte load) each, rotated in registers and shuffles (hadamard_rotate).
///
/// Grid: ceil(num_vectors / vectors_per_block) blocks of 128 threads. Threads past the last
/// vector load zeros and take part in the shuffles (whole warps), then store nothing. In
/// place is safe: a lane stores only the 16 bytes it loaded, after its vector's shuffles.

#include <cstdint>

#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/formats/hadamard.cuh"
#include "slimserve/formats/packed.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

struct RotateHeadsParams {
  const void* input;   // input[t * input_row_stride + h * D + d]
  void* output;        // output[t * output_row_stride + h * D + d]
  std::int64_t input_row_stride;  // elements (the host resolves 0 to num_heads * D)
  std::int64_t output_row_stride;
  std::int64_t num_vectors;  // num_tokens * num_heads
  std::int32_t num_heads;
};

template <class T, int HeadDim>
__global__ void rotate_heads_kernel(const RotateHeadsParams p) {
  constexpr int lanes = HeadDim / 8;
  const int per_block = static_cast<int>(blockDim.x) / lanes;
  const std::int64_t vector = static_cast<std::int64_t>(blockIdx.x) * per_block + static_cast<int>(threadIdx.x) / lanes;
  const int lane = static_cast<int>(threadIdx.x) % lanes;
  const bool active = vector < p.num_vectors;
  const std::int64_t token = active ? vector / p.num_heads : 0;
  const std::int64_t head_offset = (active ? vector % p.num_heads : 0) * HeadDim + lane * 8;
  float v[8] = {};
  if (active) {
    const Vec16 in = load16(static_cast<const T*>(p.input) + token * p.input_row_stride + head_offset);
SLIMSERVE_ATTENTION_UNROLL
    for (int i = 0; i < 8; ++i) v[i] = element_to_float<T>(in, i);
  }
  hadamard_rotate<HeadDim>(v);
  if (!active) return;  // after the shuffles
  Vec16 out;
SLIMSERVE_ATTENTION_UNROLL
  for (int w = 0; w < 4; ++w) out.word[w] = from_float2<T>(f32x2{v[2 * w], v[2 * w + 1]});
  store16(static_cast<T*>(p.output) + token * p.output_row_stride + head_offset, out);
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
