#include "model_folder.hpp"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace fs = std::filesystem;
namespace int4 = slimserve::int4;
using slimserve::make_status;
using slimserve::Status;
using slimserve::StatusCode;

namespace quantize_tool {
namespace {

slimserve::Result<nlohmann::ordered_json> read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return make_status(StatusCode::io_error, "cannot read '", path.string(), "'");
  std::stringstream text;
  text << in.rdbuf();
  auto json = nlohmann::ordered_json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return make_status(StatusCode::data_loss, "'", path.string(), "' is not a JSON object");
  }
  return json;
}

std::int64_t int_or(const nlohmann::ordered_json& object, const char* key, std::int64_t fallback) {
  const auto found = object.find(key);
  return found != object.end() && found->is_number_integer() ? found->get<std::int64_t>() : fallback;
}
bool bool_or(const nlohmann::ordered_json& object, const char* key, bool fallback) {
  const auto found = object.find(key);
  return found != object.end() && found->is_boolean() ? found->get<bool>() : fallback;
}

slimserve::Result<SourceQuantization> parse_source_quantization(const nlohmann::ordered_json& config) {
  SourceQuantization source;
  const auto found = config.find("quantization_config");
  if (found == config.end() || !found->is_object()) return source;
  const auto& q = *found;
  const std::string method = q.value("quant_method", std::string());
  if (method == "fp8") {
    source.kind = SourceQuantization::Kind::fp8_block;
    const auto block = q.find("weight_block_size");
    if (block != q.end() && block->is_array() && block->size() == 2 && (*block)[0].is_number_integer() &&
        (*block)[1].is_number_integer()) {
      source.block_rows = (*block)[0].get<std::int64_t>();
      source.block_cols = (*block)[1].get<std::int64_t>();
    }
    if (source.block_rows <= 0 || source.block_cols <= 0) {
      return make_status(StatusCode::data_loss, "quantization_config.weight_block_size must be positive");
    }
    return source;
  }
  if (method == "gptq") {
    source.kind = SourceQuantization::Kind::gptq;
    if (int_or(q, "bits", 4) != 4) return make_status(StatusCode::unsupported, "only 4-bit GPTQ sources are supported");
    source.group_size = int_or(q, "group_size", 128);
    source.symmetric = bool_or(q, "sym", true);
    source.desc_act = bool_or(q, "desc_act", false);
    const std::string format = q.value("checkpoint_format", std::string("gptq"));
    source.gptq_zero_format =
        format == "gptq_v2" ? int4::GptqZeroFormat::v2_plain : int4::GptqZeroFormat::v1_minus_one;
    return source;
  }
  if (method == "awq") {
    source.kind = SourceQuantization::Kind::awq;
    if (int_or(q, "bits", int_or(q, "w_bit", 4)) != 4) {
      return make_status(StatusCode::unsupported, "only 4-bit AWQ sources are supported");
    }
    source.group_size = int_or(q, "group_size", int_or(q, "q_group_size", 128));
    source.symmetric = false;
    return source;
  }
  if (method == "compressed-tensors") {
    source.kind = SourceQuantization::Kind::compressed_tensors;
    if (q.value("format", std::string()) != "pack-quantized") {
      return make_status(StatusCode::unsupported, "compressed-tensors source format '",
                         q.value("format", std::string()), "' (only pack-quantized INT4 is read)");
    }
    const auto groups = q.find("config_groups");
    if (groups == q.end() || !groups->is_object() || groups->size() != 1) {
      return make_status(StatusCode::unsupported, "compressed-tensors sources need exactly one config group");
    }
    const auto& weights = groups->begin()->value("weights", nlohmann::ordered_json::object());
    if (int_or(weights, "num_bits", 4) != 4) {
      return make_status(StatusCode::unsupported, "only 4-bit compressed-tensors sources are supported");
    }
    source.symmetric = bool_or(weights, "symmetric", true);
    source.group_size = weights.value("strategy", std::string("group")) == "channel" ? -1 : int_or(weights, "group_size", 128);
    return source;
  }
  return make_status(StatusCode::unsupported, "source quantization '", method,
                     "' (supported: none, fp8 block-scaled, gptq, awq, compressed-tensors pack-quantized)");
}

}  // namespace

slimserve::Result<std::unique_ptr<ModelFolder>> ModelFolder::open(const std::string& path) {
  auto model = std::make_unique<ModelFolder>();
  model->path_ = path;
  const fs::path root(path);
  if (!fs::is_directory(root)) return make_status(StatusCode::io_error, "'", path, "' is not a model folder");
  if (!fs::exists(root / "config.json")) {
    return make_status(StatusCode::io_error, "'", path, "' has no config.json (a Hugging Face model folder needs one)");
  }
  auto config = read_json(root / "config.json");
  if (!config.ok()) return config.status();
  model->config_ = std::move(*config);
  auto source = parse_source_quantization(model->config_);
  if (!source.ok()) return source.status();
  model->source_ = *source;

  // Shards: from the index when there is one, else the single model.safetensors.
  std::map<std::string, std::string> index;  // tensor -> shard file
  std::vector<std::string> shard_files;
  if (fs::exists(root / "model.safetensors.index.json")) {
    auto json = read_json(root / "model.safetensors.index.json");
    if (!json.ok()) return json.status();
    const auto map = json->find("weight_map");
    if (map == json->end() || !map->is_object()) {
      return make_status(StatusCode::data_loss, "model.safetensors.index.json has no weight_map object");
    }
    std::set<std::string> seen;
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string()) return make_status(StatusCode::data_loss, "weight_map entry '", name, "' is not a file name");
      index[name] = file.get<std::string>();
      if (seen.insert(file.get<std::string>()).second) shard_files.push_back(file.get<std::string>());
    }
  } else if (fs::exists(root / "model.safetensors")) {
    shard_files.push_back("model.safetensors");
  } else {
    return make_status(StatusCode::io_error, "'", path, "' has neither model.safetensors nor model.safetensors.index.json");
  }
  for (const std::string& file : shard_files) {
    if (file.find('/') != std::string::npos || !fs::exists(root / file)) {
      return make_status(StatusCode::io_error, "shard '", file, "' named by model.safetensors.index.json is missing from '",
                         path, "'");
    }
    auto reader = int4::SafetensorsReader::open((root / file).string());
    if (!reader.ok()) return reader.status();
    model->shards_.push_back(std::make_unique<int4::SafetensorsReader>(std::move(*reader)));
    const int4::SafetensorsReader& shard = *model->shards_.back();
    for (const auto& entry : shard.entries()) {
      if (!index.empty()) {
        const auto listed = index.find(entry.name);
        if (listed == index.end() || listed->second != file) {
          return make_status(StatusCode::data_loss, "tensor '", entry.name, "' is in shard '", file,
                             "' but the index ", listed == index.end() ? "does not list it" : "places it elsewhere");
        }
      }
      if (!model->tensors_.emplace(entry.name, TensorRef{&shard, &entry}).second) {
        return make_status(StatusCode::data_loss, "tensor '", entry.name, "' appears in two shards");
      }
      model->names_.push_back(entry.name);
    }
  }
  for (const auto& [name, file] : index) {
    if (!model->tensors_.contains(name)) {
      return make_status(StatusCode::data_loss, "the index places '", name, "' in shard '", file, "', which lacks it");
    }
  }
  return model;
}

const nlohmann::ordered_json& ModelFolder::text_config() const {
  const auto found = config_.find("text_config");
  return found != config_.end() && found->is_object() ? *found : config_;
}

const TensorRef* ModelFolder::find(const std::string& name) const {
  const auto found = tensors_.find(name);
  return found == tensors_.end() ? nullptr : &found->second;
}

std::int64_t ModelFolder::num_experts() const {
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}) {
    for (const auto* object : {&text_config(), &config_}) {
      const std::int64_t value = int_or(*object, key, 0);
      if (value > 0) return value;
    }
  }
  return 0;
}

bool ModelFolder::tied_embeddings() const {
  return bool_or(config_, "tie_word_embeddings", bool_or(text_config(), "tie_word_embeddings", true));
}

std::string ModelFolder::model_type() const { return config_.value("model_type", std::string()); }

}  // namespace quantize_tool
