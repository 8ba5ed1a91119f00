// Stacked MoE expert tensors: per-expert views for the quantizer and the importers.

#include "slimserve/int4/experts.hpp"

#include <optional>
#include <string>

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

Result<std::int64_t> expert_count(const TensorView& stacked) {
  if (stacked.shape.size() != 3) {
    return make_status(StatusCode::invalid_argument, "a stacked expert tensor is 3-D [E, rows, cols]; got ",
                       stacked.shape.size(), " dimensions");
  }
  return stacked.shape[0];
}

Result<TensorView> expert_slice(const TensorView& stacked, std::int64_t expert) {
  auto experts = expert_count(stacked);
  if (!experts.ok()) return experts.status();
  for (auto extent : stacked.shape) {
    if (extent < 0) return make_status(StatusCode::invalid_argument, "stacked tensor has a negative extent");
  }
  const auto bytes_per_expert =
      static_cast<std::size_t>(stacked.shape[1] * stacked.shape[2]) * element_size(stacked.type);
  if (stacked.bytes.size() != bytes_per_expert * static_cast<std::size_t>(*experts)) {
    return make_status(StatusCode::invalid_argument, "stacked tensor holds ", stacked.bytes.size(),
                       " bytes, its shape needs ", bytes_per_expert * static_cast<std::size_t>(*experts));
  }
  if (expert < 0 || expert >= *experts) {
    return make_status(StatusCode::out_of_range, "expert ", expert, " outside [0, ", *experts, ")");
  }
  return TensorView{stacked.type,
                    {stacked.shape[1], stacked.shape[2]},
                    stacked.bytes.subspan(static_cast<std::size_t>(expert) * bytes_per_expert, bytes_per_expert)};
}

Result<BlockScales> expert_block_scales(const BlockScales& stacked, std::int64_t expert) {
  auto slice = expert_slice(stacked.scales, expert);
  if (!slice.ok()) return Status(slice.status().code(), "block scales: " + std::string(slice.status().message()));
  return BlockScales{*slice, stacked.block_rows, stacked.block_cols};
}

Result<std::vector<QuantizedMatrix>> quantize_experts(const TensorView& stacked, WeightLayout layout,
                                                      const QuantizeOptions& options,
                                                      const BlockScales* block_scales) {
  auto experts = expert_count(stacked);
  if (!experts.ok()) return experts.status();
  if (block_scales != nullptr) {
    auto scale_experts = expert_count(block_scales->scales);
    if (!scale_experts.ok() || *scale_experts != *experts) {
      return make_status(StatusCode::invalid_argument, "stacked block scales must be [", *experts,
                         ", row_blocks, col_blocks]");
    }
  }
  std::vector<QuantizedMatrix> matrices;
  matrices.reserve(static_cast<std::size_t>(*experts));
  for (std::int64_t e = 0; e < *experts; ++e) {
    auto slice = expert_slice(stacked, e);
    if (!slice.ok()) return slice.status();
    std::optional<BlockScales> blocks;
    if (block_scales != nullptr) {
      auto expert_blocks = expert_block_scales(*block_scales, e);
      if (!expert_blocks.ok()) return expert_blocks.status();
      blocks = *expert_blocks;
    }
    auto matrix = quantize(*slice, layout, options, blocks ? &*blocks : nullptr);
    if (!matrix.ok()) {
      return Status(matrix.status().code(), "expert " + std::to_string(e) + ": " + std::string(matrix.status().message()));
    }
    matrices.push_back(std::move(*matrix));
  }
  return matrices;
}

Result<StackedGemmWeights> stack_experts(std::span<const GemmWeights> experts) {
  if (experts.empty()) {
    return make_status(StatusCode::invalid_argument, "stack_experts needs at least one expert");
  }
  const GemmWeights& first = experts.front();
  StackedGemmWeights out;
  out.num_experts = static_cast<std::int64_t>(experts.size());
  out.k = first.k;
  out.n = first.n;
  out.group_size = first.group_size;
  out.activation = first.activation;
  if (first.k <= 0 || first.n <= 0 || first.group_size <= 0 || first.k % first.group_size != 0) {
    return make_status(StatusCode::invalid_argument, "stack_experts: expert 0 has k ", first.k, ", n ",
                       first.n, ", group_size ", first.group_size, " (not a repack_for_gemm output)");
  }
  const auto packed_words = static_cast<std::size_t>(first.k / 16 * (first.n / 16) * 32);
  const auto scale_count = static_cast<std::size_t>(first.k / first.group_size * first.n);
  const bool asymmetric = !first.zeros.empty();
  for (std::size_t e = 0; e < experts.size(); ++e) {
    const GemmWeights& w = experts[e];
    if (!w.k_order.empty()) {
      return make_status(StatusCode::unsupported, "stack_experts: expert ", e,
                         " is act-order (k_order); the grouped MoE GEMM has no per-expert row "
                         "permutation: quantize the experts without act-order");
    }
    if (w.k != first.k || w.n != first.n || w.group_size != first.group_size ||
        w.activation != first.activation || w.zeros.empty() == asymmetric) {
      return make_status(StatusCode::invalid_argument, "stack_experts: expert ", e, " (k ", w.k, ", n ",
                         w.n, ", group_size ", w.group_size, ", ", w.zeros.empty() ? "symmetric" : "zero points",
                         ") differs from expert 0 (k ", first.k, ", n ", first.n, ", group_size ",
                         first.group_size, ", ", asymmetric ? "zero points" : "symmetric",
                         "); experts must share k, n, group_size, activation and symmetry");
    }
    if (w.packed.size() != packed_words || w.scales.size() != scale_count ||
        (asymmetric && w.zeros.size() != scale_count)) {
      return make_status(StatusCode::invalid_argument, "stack_experts: expert ", e, " holds ",
                         w.packed.size(), " packed words, ", w.scales.size(), " scales and ",
                         w.zeros.size(), " zeros; its shape needs ", packed_words, ", ", scale_count,
                         " and ", asymmetric ? scale_count : 0);
    }
  }
  out.packed.reserve(packed_words * experts.size());
  out.scales.reserve(scale_count * experts.size());
  if (asymmetric) out.zeros.reserve(scale_count * experts.size());
  for (const GemmWeights& w : experts) {
    out.packed.insert(out.packed.end(), w.packed.begin(), w.packed.end());
    out.scales.insert(out.scales.end(), w.scales.begin(), w.scales.end());
    out.zeros.insert(out.zeros.end(), w.zeros.begin(), w.zeros.end());
  }
  return out;
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
