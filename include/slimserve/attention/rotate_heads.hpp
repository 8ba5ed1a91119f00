#pragma once
/// \file
/// \brief Rotation of head vectors by the normalized Walsh-Hadamard transform H / sqrt(D), in
/// place or out of place: the queries before they attend to a cache appended with a rotation
/// (AppendArguments::rotation), and the attention output afterwards when V was rotated too
/// (the transform is its own inverse). attention/rotation.hpp says why.
///
/// Each head vector of `input` [num_tokens, num_heads, head_dim] (BF16 or FP16) is widened to
/// FP32, rotated in registers (formats/hadamard.cuh), rounded to nearest even back to the same
/// type and written to the same place of `output`. Launches only: no allocation, no
/// synchronization (capturable).

#include <cstdint>

#include "slimserve/activation_dtype.hpp"
#include "slimserve/attention/detail/stream.hpp"
#include "slimserve/attention/rotation.hpp"
#include "slimserve/config.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

struct RotateHeadsArguments {
  const void* input = nullptr;  ///< [num_tokens, num_heads, head_dim], 16-byte aligned
  void* output = nullptr;       ///< same shape; == input: in place (equal row strides)
  ActivationDtype dtype = ActivationDtype::bf16;
  std::int32_t num_tokens = 0;
  std::int32_t num_heads = 0;
  std::int32_t head_dim = 0;  ///< RotationHeadDims: 64, 128 or 256
  /// Elements from one token's row (num_heads x head_dim contiguous elements) to the next;
  /// 0: packed. A multiple of 8 of at least a row (a Q slice of a fused QKV output in place).
  std::int64_t input_row_stride = 0;
  std::int64_t output_row_stride = 0;
};

/// Preflight only (shapes, dtype, head_dim, strides, pointers, alignment, overlap): an
/// out-of-place output must not overlap the input; nothing is launched.
Status can_implement(const RotateHeadsArguments& args);

/// Preflight (can_implement) and launch on `stream`.
Status rotate_heads(const RotateHeadsArguments& args, cudaStream_t stream);

}  // namespace attention
SLIMSERVE_NAMESPACE_END
