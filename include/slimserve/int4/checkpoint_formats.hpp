#pragma once
/// \file
/// \brief Converters between `int4::QuantizedMatrix` and the INT4 layouts that checkpoints use:
/// GPTQ (v1 and v2 zero points, g_idx act-order), AWQ (GEMM layout, interleaved nibbles) and
/// compressed-tensors `pack-quantized`.
///
/// Importers check every tensor against the format's own description and the caller's
/// config (shapes, dtypes, zero points in range, g_idx consistent with group_size) and
/// report contradictions as StatusCode::data_loss, naming the tensor and the value; they
/// never guess. A checkpoint that is consistent but that the interchange form cannot hold
/// (K not a multiple of 8, a group size that does not divide K) is StatusCode::unsupported.
///
/// Layouts (W is [K, N], K = in_features, N = out_features; "packed along X" = 8 consecutive
/// X-indices share one int32, index i in bits 4(i%8)..4(i%8)+3, LSB first):
///  * GPTQ:  qweight I32 [K/8, N] packed along K (exactly the interchange `codes`);
///           qzeros I32 [G, ceil(N/8)] packed along N; scales F16 [G, N]; g_idx I32 [K].
///           v1 (`checkpoint_format` "gptq") stores zero - 1, v2 ("gptq_v2") stores zero.
///  * AWQ:   qweight I32 [K, N/8] packed along N with nibble i holding column 8c + order[i],
///           order = {0, 2, 4, 6, 1, 3, 5, 7}; qzeros I32 [G, N/8] the same; scales F16 [G, N].
///  * compressed-tensors pack-quantized: weight_packed I32 [N, ceil(K/8)] packed along K,
///           nibble = signed code + 8 (i.e. the unsigned code); weight_scale [N, G];
///           weight_zero_point (asymmetric) I32 [ceil(N/8), G] packed along N, nibble =
///           signed zero point + 8; weight_g_idx I32 [K] (optional); weight_shape [2] = {N, K}.

#include <array>
#include <cstdint>
#include <optional>

#include "slimserve/config.hpp"
#include "slimserve/int4/quantized_matrix.hpp"
#include "slimserve/int4/tensor.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

// --- GPTQ ----------------------------------------------------------------------------------

/// How GPTQ stores zero points: AutoGPTQ's original format ("gptq", v1) subtracts 1 before
/// packing (kernels add it back); "gptq_v2" stores the zero point itself.
enum class GptqZeroFormat : std::uint8_t { v1_minus_one, v2_plain };

struct GptqConfig {
  std::int64_t group_size = 128;  ///< quantize_config.json "group_size"; -1 = per-channel
  bool desc_act = false;          ///< act-order: g_idx may permute groups
  bool symmetric = true;          ///< "sym": then every zero point must be 8
  GptqZeroFormat zero_format = GptqZeroFormat::v1_minus_one;
};

struct GptqTensorView {
  TensorView qweight;  ///< I32 [K/8, N]
  TensorView qzeros;   ///< I32 [G, ceil(N/8)]
  TensorView scales;   ///< F16 / BF16 / F32 [G, N]
  std::optional<TensorView> g_idx;  ///< I32 [K]; absent means k / group_size
};

struct GptqTensors {
  Tensor qweight, qzeros, scales, g_idx;
};

Result<QuantizedMatrix> import_gptq(const GptqTensorView& tensors, const GptqConfig& config);
/// Writes scales as `scale_type` (F16 is what GPTQ loaders expect); g_idx is always written.
/// Fails (invalid_argument) for a zero point of 0 in v1, which v1 cannot store.
Result<GptqTensors> export_gptq(const QuantizedMatrix& matrix, GptqZeroFormat zero_format,
                                ElementType scale_type = ElementType::float16);

// --- AWQ (GEMM layout) ---------------------------------------------------------------------

/// Nibble i of an AWQ word holds column 8c + kAwqNibbleOrder[i].
inline constexpr std::array<int, 8> kAwqNibbleOrder = {0, 2, 4, 6, 1, 3, 5, 7};

struct AwqTensorView {
  TensorView qweight;  ///< I32 [K, N/8]
  TensorView qzeros;   ///< I32 [G, N/8]
  TensorView scales;   ///< F16 / BF16 / F32 [G, N]
};

struct AwqTensors {
  Tensor qweight, qzeros, scales;
};

/// `group_size`: quant_config "q_group_size"; -1 = per-channel.
Result<QuantizedMatrix> import_awq(const AwqTensorView& tensors, std::int64_t group_size);
/// AWQ has no g_idx: an act-order matrix (row_group not k / group_size) is invalid_argument.
Result<AwqTensors> export_awq(const QuantizedMatrix& matrix,
                              ElementType scale_type = ElementType::float16);

// --- compressed-tensors pack-quantized ------------------------------------------------------

struct CompressedTensorsConfig {
  std::int64_t group_size = 128;  ///< strategy "group": group_size; strategy "channel": -1
  bool symmetric = true;          ///< the weights' "symmetric"
};

struct CompressedTensorsView {
  TensorView weight_packed;                     ///< I32 [N, ceil(K/8)]
  TensorView weight_scale;                      ///< float [N, G]
  std::optional<TensorView> weight_zero_point;  ///< asymmetric: I32 [ceil(N/8), G] packed
                                                ///< (older writers: I8 [N, G] unpacked)
  std::optional<TensorView> weight_g_idx;       ///< I32 [K]
  std::optional<TensorView> weight_shape;       ///< I32/I64 [2] = {N, K}
};

struct CompressedTensors {
  Tensor weight_packed, weight_scale, weight_zero_point, weight_shape, weight_g_idx;
  bool has_zero_point = false;  ///< asymmetric only
  bool has_g_idx = false;       ///< act-order only
};

Result<QuantizedMatrix> import_compressed_tensors(const CompressedTensorsView& tensors,
                                                  const CompressedTensorsConfig& config);
/// weight_shape is written as I64 (what the reference compressor emits).
Result<CompressedTensors> export_compressed_tensors(const QuantizedMatrix& matrix,
                                                    ElementType scale_type = ElementType::bfloat16);

}  // namespace int4
SLIMSERVE_NAMESPACE_END
