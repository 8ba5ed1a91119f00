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

}  // namespace int4
SLIMSERVE_NAMESPACE_END
