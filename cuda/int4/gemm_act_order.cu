// Act-order support: gathers A's columns into the packed row order of the weights.
#include <algorithm>
#include <cstdint>

#include "slimserve/int4/gemm.hpp"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {
namespace {

/// out[row, i] = a[row, k_order[i]]; one thread per output element (16-bit values).
__global__ void gather_columns_kernel(const std::uint16_t* __restrict__ a,        // [m, k]
                                      const std::int32_t* __restrict__ k_order,  // [k]
                                      std::uint16_t* __restrict__ out,           // [m, k]
                                      std::int64_t m, std::int64_t k) {
  const std::int64_t count = m * k;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride) {
    const std::int64_t row = i / k;
    const std::int64_t column = k_order[i % k];
    // A corrupt order must not read outside A: such columns become NaN (0xFFFF in BF16 and
    // FP16) so the error shows in C instead of reading another tensor's memory.
    out[i] = (column >= 0 && column < k) ? a[row * k + column] : std::uint16_t{0xFFFF};
  }
}

#if defined(SLIMSERVE_PLATFORM_CUDA)
constexpr std::int64_t max_blocks = 4096;
#else
constexpr std::int64_t max_blocks = 16;  // emulated grids stay small; the loop strides
#endif
constexpr unsigned block_threads = 256;

}  // namespace

Status gather_activation_columns(const void* a, const std::int32_t* k_order, void* out,
                                 std::int64_t m, std::int64_t k, cudaStream_t stream) {
  if (a == nullptr || k_order == nullptr || out == nullptr) {
    return make_status(StatusCode::invalid_argument,
                       "gather_activation_columns needs a, k_order and out");
  }
  if (a == out) {
    return make_status(StatusCode::invalid_argument,
                       "gather_activation_columns cannot work in place (a == out)");
  }
  if (m < 1 || k < 1) {
    return make_status(StatusCode::invalid_argument, "gather_activation_columns: m = ", m,
                       ", k = ", k);
  }
  const auto blocks = static_cast<unsigned>(std::clamp<std::int64_t>(
      (m * k + block_threads - 1) / block_threads, 1, max_blocks));
  return rt::launch(gather_columns_kernel,
                    rt::LaunchConfig{dim3(blocks), dim3(block_threads), 0, stream},
                    static_cast<const std::uint16_t*>(a), k_order, static_cast<std::uint16_t*>(out),
                    m, k);
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
