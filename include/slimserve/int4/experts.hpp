#pragma once
/// \file
/// \brief Mixture-of-experts weights: 3-D stacked tensors ([E, N, K] or [E, K, N], one slice per
/// expert) for the quantizer and the checkpoint importers.
///
/// Checkpoints store MoE experts either as one 2-D tensor per expert (`experts.3.w1.weight`),
/// which the 2-D functions handle as they are, or stacked along a leading expert dimension
/// (`experts.gate_up_proj` [E, ...]). A stacked tensor is E independent matrices laid end to
/// end, so every function here works on one expert's slice: a view into the stacked bytes,
/// never a copy. Quantizing or importing expert by expert also bounds memory by one expert.
///
/// Block-scaled FP8 experts (DeepSeek/Kimi/GLM) store their `weight_scale_inv` stacked the
/// same way: [E, ceil(rows / block_rows), ceil(cols / block_cols)].

#include <cstdint>
#include <vector>

#include <span>

#include "slimserve/config.hpp"
#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/int4/quantize.hpp"
#include "slimserve/int4/quantized_matrix.hpp"
#include "slimserve/int4/tensor.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

/// Number of experts of a stacked tensor: its leading extent. invalid_argument unless 3-D.
Result<std::int64_t> expert_count(const TensorView& stacked);

/// Expert `expert` of a stacked tensor [E, rows, cols] as a 2-D view [rows, cols] (no copy).
/// invalid_argument unless `stacked` is 3-D with as many bytes as its shape needs;
/// out_of_range for an expert outside [0, E).
Result<TensorView> expert_slice(const TensorView& stacked, std::int64_t expert);

/// The block scales of one expert from stacked scales [E, row_blocks, col_blocks].
Result<BlockScales> expert_block_scales(const BlockScales& stacked, std::int64_t expert);

/// Quantizes every expert of a stacked weight: [E, N, K] for `WeightLayout::n_by_k`
/// (nn.Linear per expert, the usual MoE layout), [E, K, N] for `k_by_n`. `block_scales`,
/// when given, are stacked too. Each expert gives exactly what `quantize` gives its slice.
Result<std::vector<QuantizedMatrix>> quantize_experts(const TensorView& stacked, WeightLayout layout,
                                                      const QuantizeOptions& options,
                                                      const BlockScales* block_scales = nullptr);

/// E experts' kernel-layout weights laid end to end, as the grouped MoE GEMM reads them
/// (`MoeGemmArguments::b`, `scales`, `zeros`): upload each vector as it is.
struct StackedGemmWeights {
  std::int64_t num_experts = 0;
  std::int64_t k = 0;
  std::int64_t n = 0;
  std::int64_t group_size = 0;
  ActivationType activation = ActivationType::bf16;
  std::vector<std::uint32_t> packed;  ///< [E][k/16, n/16, 32]
  std::vector<std::uint16_t> scales;  ///< [E][k/group_size, n], bits of `activation`
  std::vector<std::uint16_t> zeros;   ///< [E][k/group_size, n], or empty (symmetric: z = 8)
};

/// Stacks E `repack_for_gemm` outputs (one per expert, in expert order) for `run_moe_gemm`.
/// invalid_argument, naming the first expert that differs, unless every expert has the first
/// one's k, n, group_size, activation and symmetry and its arrays have the sizes those give;
/// unsupported for act-order experts (a `k_order`: the grouped GEMM has no per-expert row
/// permutation). The Python package's `stack_experts` does the same.
Result<StackedGemmWeights> stack_experts(std::span<const GemmWeights> experts);

}  // namespace int4
SLIMSERVE_NAMESPACE_END
