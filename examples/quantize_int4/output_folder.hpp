#pragma once
// The files around the weights: config.json with its quantization_config, GPTQ's
// quantize_config.json, the shard index, and the tokenizer/generation files copied over.

#include <map>
#include <string>

#include "model_folder.hpp"
#include "options.hpp"
#include "plan.hpp"

namespace quantize_tool {

/// config.json's "quantization_config" for the chosen format (compressed-tensors: one config
/// group targeting Linear layers, with every layer left in higher precision in "ignore";
/// GPTQ: bits/group_size/sym/desc_act/checkpoint_format, and "dynamic" skip rules for them).
nlohmann::ordered_json quantization_config(const Options& options, const Plan& plan, const ModelFolder& model);

/// Writes config.json (the input's, with quantization_config replaced), quantize_config.json
/// for GPTQ, model.safetensors.index.json when `weight_map` is not empty, and copies every
/// other file of the input folder except weights.
slimserve::Status write_side_files(const ModelFolder& model, const Options& options, const Plan& plan,
                                   const std::map<std::string, std::string>& weight_map,
                                   std::uint64_t total_tensor_bytes, const std::string& folder);

}  // namespace quantize_tool
