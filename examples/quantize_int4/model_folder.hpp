#pragma once
// The input: a Hugging Face model folder (config.json + one or more .safetensors shards),
// opened header-only. Tensors are read later, one at a time.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "slimserve/int4/checkpoint_formats.hpp"
#include "slimserve/int4/safetensors.hpp"
#include "slimserve/status.hpp"

namespace quantize_tool {

/// How the input's weights are already quantized, from config.json's quantization_config.
struct SourceQuantization {
  enum class Kind { none, fp8_block, gptq, awq, compressed_tensors };
  Kind kind = Kind::none;
  std::int64_t block_rows = 128, block_cols = 128;  ///< fp8_block: weight_block_size
  std::int64_t group_size = 128;                    ///< int4 sources; -1 = per-channel
  bool symmetric = true;
  bool desc_act = false;
  slimserve::int4::GptqZeroFormat gptq_zero_format = slimserve::int4::GptqZeroFormat::v1_minus_one;
};

struct TensorRef {
  const slimserve::int4::SafetensorsReader* file = nullptr;
  const slimserve::int4::SafetensorsReader::Entry* entry = nullptr;
};

class ModelFolder {
 public:
  /// Errors: a missing folder or config.json, unparsable JSON, a shard named by the index that
  /// is missing, a tensor the index places in a shard that lacks it (or the reverse), a
  /// tensor in two shards, any safetensors defect, an unsupported source quantization.
  static slimserve::Result<std::unique_ptr<ModelFolder>> open(const std::string& path);

  const std::string& path() const { return path_; }
  const nlohmann::ordered_json& config() const { return config_; }
  /// The language model's settings: config.json, or its "text_config" when present.
  const nlohmann::ordered_json& text_config() const;
  const std::vector<std::string>& tensor_names() const { return names_; }  ///< shard, then data order
  const TensorRef* find(const std::string& name) const;
  const SourceQuantization& source_quantization() const { return source_; }
  /// Experts per MoE layer from the config (num_experts, num_local_experts, n_routed_experts,
  /// moe_num_experts), 0 for a dense model.
  std::int64_t num_experts() const;
  /// tie_word_embeddings (Hugging Face's default: true).
  bool tied_embeddings() const;
  std::string model_type() const;

 private:
  std::string path_;
  nlohmann::ordered_json config_;
  std::vector<std::unique_ptr<slimserve::int4::SafetensorsReader>> shards_;
  std::map<std::string, TensorRef> tensors_;
  std::vector<std::string> names_;
  SourceQuantization source_;
};

}  // namespace quantize_tool
