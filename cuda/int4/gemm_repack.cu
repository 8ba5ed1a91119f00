// Device repack: plain INT4 codes in device memory -> the GEMM layout.
#include <algorithm>
#include <cstdint>

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/int4/gemm.hpp"
#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {
namespace {

/// One thread per packed word: gathers its 8 codes (gemm_layout::code_position) from the
/// plain [k/8, n] words, through the act-order row order when there is one.
__global__ void repack_codes_kernel(const std::uint32_t* __restrict__ codes,   // [k/8, n]
                                    const std::int32_t* __restrict__ k_order,  // [k] or null
                                    std::uint32_t* __restrict__ packed,        // [k/16, n/16, 32]
                                    std::int64_t k, std::int64_t n) {
  const std::int64_t words = k / 8 * n;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       index < words; index += stride) {
    const int lane = static_cast<int>(index % gemm_layout::words_per_tile);
    const std::int64_t tile = index / gemm_layout::words_per_tile;
    const std::int64_t tile_row = tile / (n / gemm_layout::tile_n);
    const std::int64_t tile_col = tile % (n / gemm_layout::tile_n);
    std::uint32_t word = 0;
    for (int nibble = 0; nibble < gemm_layout::codes_per_word; ++nibble) {
      const gemm_layout::TileCoord at = gemm_layout::code_position(lane, nibble);
      const std::int64_t packed_row = tile_row * gemm_layout::tile_k + at.k;
      const std::int64_t row = k_order != nullptr ? k_order[packed_row] : packed_row;
      const std::int64_t col = tile_col * gemm_layout::tile_n + at.n;
      // A corrupt order (checked on the host, but this is device memory) reads nothing
      // outside `codes`; its nibble stays 0.
      if (row < 0 || row >= k) continue;
      const std::uint32_t code = (codes[(row / 8) * n + col] >> (4 * (row % 8))) & 0xFu;
      word |= code << (4 * nibble);
    }
    packed[index] = word;
  }
}

/// FP32 scales and uint8 zero points -> the activation type (round to nearest even).
template <class T>
__global__ void convert_scales_kernel(const float* __restrict__ scales,        // [count]
                                      const std::uint8_t* __restrict__ zeros,  // [count] or null
                                      std::uint16_t* __restrict__ scales_out,  // [count]
                                      std::uint16_t* __restrict__ zeros_out,   // [count] or null
                                      std::int64_t count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride) {
    scales_out[i] = from_float<T>(scales[i]).bits;
    if (zeros != nullptr) zeros_out[i] = from_float<T>(static_cast<float>(zeros[i])).bits;
  }
}

#if defined(SLIMSERVE_PLATFORM_CUDA)
constexpr std::int64_t max_blocks = 4096;
#else
constexpr std::int64_t max_blocks = 16;  // emulated grids stay small; the loops stride
#endif
constexpr unsigned block_threads = 256;

unsigned grid_for(std::int64_t items) {
  return static_cast<unsigned>(
      std::clamp<std::int64_t>((items + block_threads - 1) / block_threads, 1, max_blocks));
}

}  // namespace

Status repack_for_gemm_on_device(const DeviceQuantizedMatrix& input, ActivationType activation,
                                 const DeviceGemmWeights& output, cudaStream_t stream) {
  const std::int64_t k = input.k;
  const std::int64_t n = input.n;
  if (k <= 0 || n <= 0 || k % gemm_layout::tile_k != 0 || n % gemm_layout::tile_n != 0) {
    return make_status(StatusCode::unsupported, "weight shape k = ", k, ", n = ", n,
                       ": the GEMM layout needs k and n to be positive multiples of 16");
  }
  const std::int64_t group_size = input.group_size;
  if (!gemm_layout::supported_group_size(k, group_size)) {
    return make_status(StatusCode::unsupported, "group_size ", group_size, " with k = ", k,
                       ": the GEMM needs a power of two >= 16 that divides k, or k itself");
  }
  if (input.codes == nullptr || input.scales == nullptr || output.packed == nullptr ||
      output.scales == nullptr) {
    return make_status(StatusCode::invalid_argument,
                       "device repack needs codes, scales and their outputs");
  }
  if ((input.zeros == nullptr) != (output.zeros == nullptr)) {
    return make_status(StatusCode::invalid_argument,
                       "device repack: output zeros must be given exactly when input zeros are");
  }
  SLIMSERVE_RETURN_IF_ERROR(rt::launch(
      repack_codes_kernel, rt::LaunchConfig{dim3(grid_for(k / 8 * n)), dim3(block_threads), 0, stream},
      input.codes, input.k_order, output.packed, k, n));
  const std::int64_t count = k / group_size * n;
  const rt::LaunchConfig config{dim3(grid_for(count)), dim3(block_threads), 0, stream};
  auto* scales_out = static_cast<std::uint16_t*>(output.scales);
  auto* zeros_out = static_cast<std::uint16_t*>(output.zeros);
  if (activation == ActivationType::bf16) {
    return rt::launch(convert_scales_kernel<bf16>, config, input.scales, input.zeros, scales_out,
                      zeros_out, count);
  }
  return rt::launch(convert_scales_kernel<fp16>, config, input.scales, input.zeros, scales_out,
                    zeros_out, count);
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
