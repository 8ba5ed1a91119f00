#include "output_folder.hpp"

#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;
namespace int4 = slimserve::int4;
using slimserve::make_status;
using slimserve::Status;
using slimserve::StatusCode;

namespace quantize_tool {
namespace {

Status write_json(const fs::path& path, const nlohmann::ordered_json& json) {
  std::ofstream out(path);
  out << json.dump(2) << "\n";
  out.close();
  if (!out) return make_status(StatusCode::io_error, "cannot write '", path.string(), "'");
  return Status::success();
}

std::string regex_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

/// Weight files are what the tool rewrites; everything else (tokenizer, generation config,
/// chat template, README, sentence-transformers module folders) travels unchanged.
bool is_weight_file(const fs::path& relative) {
  const std::string name = relative.filename().string();
  for (const char* suffix : {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx"}) {
    if (name.ends_with(suffix)) return true;
  }
  const bool top_level = !relative.has_parent_path();
  return top_level && (name == "model.safetensors.index.json" || name == "pytorch_model.bin.index.json" ||
                       name == "config.json" || name == "quantize_config.json");
}

}  // namespace

nlohmann::ordered_json quantization_config(const Options& options, const Plan& plan, const ModelFolder& model) {
  const bool per_channel = options.quantize.group_size == int4::kPerChannel;
  const bool symmetric = options.quantize.symmetric;
  if (options.format == OutputFormat::compressed_tensors) {
    nlohmann::ordered_json weights = {
        {"num_bits", 4},
        {"type", "int"},
        {"symmetric", symmetric},
        {"group_size", per_channel ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(options.quantize.group_size)},
        {"strategy", per_channel ? "channel" : "group"},
        {"block_structure", nullptr},
        {"dynamic", false},
        {"actorder", nullptr},
        {"observer", "minmax"},
        {"observer_kwargs", nlohmann::ordered_json::object()},
    };
    nlohmann::ordered_json group = {{"targets", {"Linear"}},
                                    {"weights", weights},
                                    {"input_activations", nullptr},
                                    {"output_activations", nullptr},
                                    {"format", "pack-quantized"}};
    return {{"quant_method", "compressed-tensors"},
            {"format", "pack-quantized"},
            {"quantization_status", "compressed"},
            {"config_groups", {{"group_0", group}}},
            {"ignore", plan.ignored_modules},
            {"kv_cache_scheme", nullptr}};
  }
  nlohmann::ordered_json dynamic = nlohmann::ordered_json::object();
  for (const std::string& module : plan.ignored_modules) dynamic["-:" + regex_escape(module) + "$"] = nlohmann::ordered_json::object();
  const bool lm_head = std::find(plan.quantized_modules.begin(), plan.quantized_modules.end(), "lm_head") !=
                       plan.quantized_modules.end();
  (void)model;
  return {{"quant_method", "gptq"},
          {"bits", 4},
          {"group_size", per_channel ? -1 : options.quantize.group_size},
          {"desc_act", false},
          {"sym", symmetric},
          {"lm_head", lm_head},
          {"true_sequential", true},
          {"checkpoint_format", options.format == OutputFormat::gptq_v1 ? "gptq" : "gptq_v2"},
          {"dynamic", dynamic}};
}

Status write_side_files(const ModelFolder& model, const Options& options, const Plan& plan,
                        const std::map<std::string, std::string>& weight_map, std::uint64_t total_tensor_bytes,
                        const std::string& folder) {
  const fs::path out(folder);
  nlohmann::ordered_json config = model.config();
  const nlohmann::ordered_json quant = quantization_config(options, plan, model);
  config["quantization_config"] = quant;
  SLIMSERVE_RETURN_IF_ERROR(write_json(out / "config.json", config));
  if (options.format != OutputFormat::compressed_tensors) {
    SLIMSERVE_RETURN_IF_ERROR(write_json(out / "quantize_config.json", quant));
  }
  if (!weight_map.empty()) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total_tensor_bytes}}}, {"weight_map", weight_map}};
    SLIMSERVE_RETURN_IF_ERROR(write_json(out / "model.safetensors.index.json", index));
  }
  std::error_code error;
  const fs::path root(model.path());
  // An output folder inside the input folder is not part of the model: neither the folder being
  // written (OUT.partial, `folder`) nor OUT itself is copied into the output.
  const fs::path writing = fs::weakly_canonical(out, error);
  std::string final_name = writing.string();
  if (final_name.size() > 8 && final_name.ends_with(".partial")) final_name.resize(final_name.size() - 8);
  const fs::path final_output(final_name);
  for (auto it = fs::recursive_directory_iterator(root, error); !error && it != fs::recursive_directory_iterator();
       it.increment(error)) {
    if (it->is_directory()) {
      std::error_code ignored;
      const fs::path here = fs::weakly_canonical(it->path(), ignored);
      if (here == writing || here == final_output) it.disable_recursion_pending();
      continue;
    }
    const fs::path relative = fs::relative(it->path(), root);
    if (!it->is_regular_file() || is_weight_file(relative)) continue;
    const fs::path target = out / relative;
    fs::create_directories(target.parent_path(), error);
    if (!error) fs::copy_file(it->path(), target, fs::copy_options::overwrite_existing, error);
    if (error) return make_status(StatusCode::io_error, "cannot copy '", it->path().string(), "': ", error.message());
  }
  if (error) return make_status(StatusCode::io_error, "cannot list '", model.path(), "': ", error.message());
  return Status::success();
}

}  // namespace quantize_tool
