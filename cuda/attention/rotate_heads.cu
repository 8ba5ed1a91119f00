// Façade of rotate_heads: preflight, then the (dtype, head_dim) instantiation.
#include <array>
#include <cstddef>
#include <cstdint>

#include "slimserve/attention/kernels/rotate_heads_kernel.cuh"
#include "slimserve/attention/rotate_heads.hpp"
#include "slimserve/detail/preflight.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/runtime/launch.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {
namespace {

constexpr int rotate_threads = 128;

using RotateLauncher = Status (*)(const kernels::RotateHeadsParams&, dim3 grid, cudaStream_t stream);
struct RotateKernelEntry {
  ActivationDtype dtype;
  std::int32_t head_dim;
  RotateLauncher launch;
};
template <class T, int HeadDim>
Status launch_rotate(const kernels::RotateHeadsParams& params, dim3 grid, cudaStream_t stream) {
  return rt::launch(kernels::rotate_heads_kernel<T, HeadDim>, rt::LaunchConfig{grid, dim3(rotate_threads), 0, stream},
                    params);
}
/// Both activation types at every head_dim of RotationHeadDims.
const auto& rotate_table() {
  static const auto table = [] {
    std::array<RotateKernelEntry, 2 * RotationHeadDims::size> entries{};
    std::size_t count = 0;
    RotationHeadDims::for_each([&]<int HeadDim>() {
      entries[count++] = {ActivationDtype::bf16, HeadDim, &launch_rotate<bf16, HeadDim>};
      entries[count++] = {ActivationDtype::fp16, HeadDim, &launch_rotate<fp16, HeadDim>};
    });
    return entries;
  }();
  return table;
}

using preflight::aligned16;

}  // namespace

Status can_implement(const RotateHeadsArguments& a) {
  if (!is_valid(a.dtype)) {
    return make_status(StatusCode::invalid_argument, "rotate_heads: unknown dtype ", static_cast<int>(a.dtype));
  }
  if (!RotationHeadDims::contains(a.head_dim)) {
    return make_status(StatusCode::unsupported, "rotate_heads: head_dim must be one of ", RotationHeadDims::describe(),
                       " (a Walsh-Hadamard transform of a power-of-two length), got ", a.head_dim);
  }
  if (a.num_tokens < 0) {
    return make_status(StatusCode::invalid_argument, "rotate_heads: num_tokens ", a.num_tokens, " < 0");
  }
  if (a.num_heads < 1) {
    return make_status(StatusCode::invalid_argument, "rotate_heads: num_heads ", a.num_heads, " < 1");
  }
  const std::int64_t row = static_cast<std::int64_t>(a.num_heads) * a.head_dim;
  SLIMSERVE_RETURN_IF_ERROR(preflight::check_row_stride(a.input_row_stride, "rotate_heads", "input_row_stride", row,
                                                       "num_heads x head_dim"));
  SLIMSERVE_RETURN_IF_ERROR(preflight::check_row_stride(a.output_row_stride, "rotate_heads", "output_row_stride", row,
                                                       "num_heads x head_dim"));
  if (a.num_tokens == 0) return {};
  if (a.input == nullptr || a.output == nullptr) {
    return make_status(StatusCode::invalid_argument, "rotate_heads: input and output must be non-null");
  }
  if (!aligned16(a.input) || !aligned16(a.output)) {
    return make_status(StatusCode::invalid_argument, "rotate_heads: input and output must be 16-byte aligned");
  }
  const std::int64_t in_stride = a.input_row_stride != 0 ? a.input_row_stride : row;
  const std::int64_t out_stride = a.output_row_stride != 0 ? a.output_row_stride : row;
  const auto in = reinterpret_cast<std::uintptr_t>(a.input);
  const auto out = reinterpret_cast<std::uintptr_t>(a.output);
  if (in == out) {
    if (in_stride != out_stride) {
      return make_status(StatusCode::invalid_argument, "rotate_heads: in place (output == input) needs equal row strides, got ",
                         in_stride, " and ", out_stride);
    }
  } else {
    // Bytes each spans, first element to one past the last: an out-of-place rotation whose
    // output overlaps its input would read rotated values.
    const auto span = [&](std::int64_t stride) {
      return static_cast<std::uintptr_t>(((a.num_tokens - 1) * stride + row) * 2);
    };
    if (in < out + span(out_stride) && out < in + span(in_stride)) {
      return make_status(StatusCode::invalid_argument,
                         "rotate_heads: output overlaps input without being it (pass output == input to rotate in place)");
    }
  }
  const std::int64_t vectors = static_cast<std::int64_t>(a.num_tokens) * a.num_heads;
  const std::int64_t blocks = (vectors + rotate_threads / (a.head_dim / 8) - 1) / (rotate_threads / (a.head_dim / 8));
  if (blocks > 0x7FFFFFFF) {
    return make_status(StatusCode::invalid_argument, "rotate_heads: ", vectors, " head vectors exceed one launch");
  }
  return {};
}

Status rotate_heads(const RotateHeadsArguments& a, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(can_implement(a));
  if (a.num_tokens == 0) return {};
  const std::int64_t row = static_cast<std::int64_t>(a.num_heads) * a.head_dim;
  kernels::RotateHeadsParams params{};
  params.input = a.input;
  params.output = a.output;
  params.input_row_stride = a.input_row_stride != 0 ? a.input_row_stride : row;
  params.output_row_stride = a.output_row_stride != 0 ? a.output_row_stride : row;
  params.num_vectors = static_cast<std::int64_t>(a.num_tokens) * a.num_heads;
  params.num_heads = a.num_heads;
  const std::int64_t per_block = rotate_threads / (a.head_dim / 8);
  const dim3 grid(static_cast<unsigned>((params.num_vectors + per_block - 1) / per_block));
  for (const auto& entry : rotate_table()) {
    if (entry.dtype == a.dtype && entry.head_dim == a.head_dim) return entry.launch(params, grid, stream);
  }
  return make_status(StatusCode::unsupported, "no rotate_heads kernel for ", to_string(a.dtype), " head_dim ",
                     a.head_dim);
}

}  // namespace attention
SLIMSERVE_NAMESPACE_END
