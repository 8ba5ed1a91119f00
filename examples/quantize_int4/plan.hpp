#pragma once
// What happens to every input tensor, and every output tensor's name, dtype and shape,
// decided before any weight is read (so the output shards' headers can be written first).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model_folder.hpp"
#include "options.hpp"
#include "slimserve/int4/quantize.hpp"
#include "slimserve/int4/safetensors.hpp"

namespace quantize_tool {

enum class Action {
  copy,              ///< written unchanged
  quantize,          ///< 2-D float/FP8 weight -> INT4
  quantize_experts,  ///< stacked [E, ...] float/FP8 weight -> E INT4 modules
  convert,           ///< INT4 GPTQ/AWQ/compressed-tensors module -> the output format
  fp8_to_bf16,       ///< an FP8 weight left unquantized (the output config has no FP8 scheme)
};

struct Unit {
  Action action = Action::copy;
  std::string source;  ///< input tensor (copy, quantize*, fp8_to_bf16) or module prefix (convert)
  std::string module;  ///< output module (quantize, convert); stacked: see expert_module()
  slimserve::int4::WeightLayout layout = slimserve::int4::WeightLayout::n_by_k;
  std::int64_t k = 0, n = 0, experts = 0;
  std::optional<std::string> block_scales;  ///< FP8: the weight_scale_inv tensor
  slimserve::int4::ElementType scale_type = slimserve::int4::ElementType::float32;
  std::int64_t group_size = 128;            ///< resolved: kPerChannel becomes k
  std::uint64_t source_bytes = 0;           ///< bytes read (progress)
  /// Module of expert e of a stacked weight: "a.experts.gate_up_proj" -> "a.experts.<e>.gate_up_proj".
  std::string expert_module(std::int64_t expert) const;
};

struct Plan {
  std::vector<Unit> units;
  std::vector<slimserve::int4::SafetensorsStreamWriter::Planned> outputs;  ///< in file order
  std::vector<std::string> quantized_modules;
  std::vector<std::string> ignored_modules;  ///< 2-D weights left in higher precision
  std::uint64_t source_bytes = 0;
};

/// Output tensors of one quantized module [K, N] in the chosen format.
std::vector<slimserve::int4::SafetensorsStreamWriter::Planned> quantized_outputs(
    const Options& options, const std::string& module, std::int64_t k, std::int64_t n, std::int64_t group_size,
    slimserve::int4::ElementType scale_type);

/// Decides every tensor's fate. Errors name the tensor: a selected weight whose K is not a
/// multiple of the group, a pattern that selects nothing, lm_head asked for with tied
/// embeddings, an FP8 weight without its block scales.
slimserve::Result<Plan> make_plan(const ModelFolder& model, const Options& options);

}  // namespace quantize_tool
