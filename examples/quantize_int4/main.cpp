// slimserve_quantize_int4: quantizes the 2-D weights of a .safetensors file to INT4 and writes
// them in compressed-tensors `pack-quantized` or GPTQ form, printing each tensor's relative
// error and the quantizer's throughput.
//
//   slimserve_quantize_int4 IN.safetensors OUT.safetensors [--format ct|gptq|gptq-v1]
//       [--group 32|64|128|channel] [--asym] [--clip STEPS] [--threads T]
//       [--scale-dtype f32|f16|bf16] [--skip SUBSTRING]...
//
// Quantized: tensors named *.weight with 2 dimensions, stored [N, K] as nn.Linear does, in
// F32/F16/BF16, or F8_E4M3 with a "<name>_scale_inv" tensor of 128x128 block scales
// (DeepSeek-style), whose K fits the group size; names containing a --skip substring
// (default: "embed") are left alone. Everything else is copied unchanged.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "slimserve/int4/checkpoint_formats.hpp"
#include "slimserve/int4/quantize.hpp"
#include "slimserve/int4/safetensors.hpp"

namespace int4 = slimserve::int4;

namespace {

enum class OutputFormat { compressed_tensors, gptq_v2, gptq_v1 };

struct Options {
  std::string input, output;
  OutputFormat format = OutputFormat::compressed_tensors;
  int4::QuantizeOptions quantize;
  bool scale_type_given = false;
  std::vector<std::string> skip = {"embed"};
};

int usage(const char* message) {
  std::fprintf(stderr,
               "error: %s\nusage: slimserve_quantize_int4 IN.safetensors OUT.safetensors [--format ct|gptq|gptq-v1]\n"
               "       [--group 32|64|128|channel] [--asym] [--clip STEPS] [--threads T]\n"
               "       [--scale-dtype f32|f16|bf16] [--skip SUBSTRING]...\n",
               message);
  return 2;
}

bool parse_int(const char* text, long& value) {
  char* end = nullptr;
  value = std::strtol(text, &end, 10);
  return end != text && *end == '\0';
}

/// Returns an error message, or empty on success.
std::string parse(int argc, char** argv, Options& options) {
  std::vector<std::string_view> positional;
  bool skip_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    long number = 0;
    if (arg == "--asym") {
      options.quantize.symmetric = false;
    } else if (arg == "--format") {
      const char* v = next();
      const std::string_view format = v ? v : "";
      if (format == "ct") options.format = OutputFormat::compressed_tensors;
      else if (format == "gptq") options.format = OutputFormat::gptq_v2;
      else if (format == "gptq-v1") options.format = OutputFormat::gptq_v1;
      else return "--format takes ct, gptq or gptq-v1";
    } else if (arg == "--group") {
      const char* v = next();
      if (v && std::string_view(v) == "channel") options.quantize.group_size = int4::kPerChannel;
      else if (v && parse_int(v, number) && number > 0) options.quantize.group_size = number;
      else return "--group takes a positive size or 'channel'";
    } else if (arg == "--clip") {
      const char* v = next();
      if (!v || !parse_int(v, number) || number < 0) return "--clip takes a step count >= 0";
      options.quantize.clip.steps = static_cast<int>(number);
    } else if (arg == "--threads") {
      const char* v = next();
      if (!v || !parse_int(v, number) || number < 0) return "--threads takes a count >= 0 (0 = all cores)";
      options.quantize.num_threads = static_cast<int>(number);
    } else if (arg == "--scale-dtype") {
      const char* v = next();
      const std::string_view type = v ? v : "";
      if (type == "f32") options.quantize.scale_type = int4::ElementType::float32;
      else if (type == "f16") options.quantize.scale_type = int4::ElementType::float16;
      else if (type == "bf16") options.quantize.scale_type = int4::ElementType::bfloat16;
      else return "--scale-dtype takes f32, f16 or bf16";
      options.scale_type_given = true;
    } else if (arg == "--skip") {
      const char* v = next();
      if (!v) return "--skip takes a substring";
      if (!skip_given) options.skip.clear();
      skip_given = true;
      options.skip.emplace_back(v);
    } else if (arg.starts_with("--")) {
      return "unknown option " + std::string(arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2) return "expected an input and an output file";
  options.input = positional[0];
  options.output = positional[1];
  return {};
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

/// The quantization config written into the output's metadata (a JSON string, as
/// compressed-tensors and GPTQ checkpoints keep it in config files).
std::string config_json(const Options& options, std::int64_t group) {
  const bool ct = options.format == OutputFormat::compressed_tensors;
  std::string json = "{\"quant_method\":\"";
  json += ct ? "compressed-tensors\",\"format\":\"pack-quantized\"" : "gptq\",\"checkpoint_format\":\"";
  if (!ct) json += options.format == OutputFormat::gptq_v1 ? "gptq\"" : "gptq_v2\"";
  json += ",\"bits\":4,\"group_size\":" + std::to_string(group == int4::kPerChannel ? -1 : group);
  json += std::string(",\"sym\":") + (options.quantize.symmetric ? "true" : "false");
  json += ct ? ",\"strategy\":\"" + std::string(group == int4::kPerChannel ? "channel" : "group") + "\"" : ",\"desc_act\":false";
  json += "}";
  return json;
}

slimserve::Status add_quantized(int4::SafetensorsWriter& writer, const Options& options, std::string_view name,
                                const int4::QuantizedMatrix& matrix, int4::ElementType scale_type) {
  const std::string base(name);  // "layer.weight"
  const std::string prefix = base.substr(0, base.size() - std::string_view(".weight").size());
  if (options.format == OutputFormat::compressed_tensors) {
    auto ct = int4::export_compressed_tensors(matrix, scale_type);
    if (!ct.ok()) return ct.status();
    SLIMSERVE_RETURN_IF_ERROR(writer.add(base + "_packed", ct->weight_packed.view()));
    SLIMSERVE_RETURN_IF_ERROR(writer.add(base + "_scale", ct->weight_scale.view()));
    SLIMSERVE_RETURN_IF_ERROR(writer.add(base + "_shape", ct->weight_shape.view()));
    if (ct->has_zero_point) SLIMSERVE_RETURN_IF_ERROR(writer.add(base + "_zero_point", ct->weight_zero_point.view()));
    return slimserve::Status::success();
  }
  const auto zero_format = options.format == OutputFormat::gptq_v1 ? int4::GptqZeroFormat::v1_minus_one
                                                                   : int4::GptqZeroFormat::v2_plain;
  auto gptq = int4::export_gptq(matrix, zero_format, scale_type);
  if (!gptq.ok()) return gptq.status();
  SLIMSERVE_RETURN_IF_ERROR(writer.add(prefix + ".qweight", gptq->qweight.view()));
  SLIMSERVE_RETURN_IF_ERROR(writer.add(prefix + ".qzeros", gptq->qzeros.view()));
  SLIMSERVE_RETURN_IF_ERROR(writer.add(prefix + ".scales", gptq->scales.view()));
  return writer.add(prefix + ".g_idx", gptq->g_idx.view());
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const std::string error = parse(argc, argv, options); !error.empty()) return usage(error.c_str());
  if (options.format != OutputFormat::compressed_tensors && !options.scale_type_given) {
    options.quantize.scale_type = int4::ElementType::float16;  // what GPTQ loaders expect
  }

  auto input = int4::SafetensorsFile::read(options.input);
  if (!input.ok()) {
    std::fprintf(stderr, "error: %s\n", input.status().to_string().c_str());
    return 1;
  }
  int4::SafetensorsWriter writer;
  for (const auto& [key, value] : input->metadata()) writer.set_metadata(key, value);
  writer.set_metadata("quantization_config", config_json(options, options.quantize.group_size));

  std::printf("%-48s %-14s %-6s %10s %10s %9s %9s\n", "tensor", "shape [N, K]", "dtype", "rel.err", "max.err",
              "ms", "GB/s");
  std::size_t quantized = 0, copied = 0;
  double total_bytes = 0.0, total_seconds = 0.0, sum_relative = 0.0, max_relative = 0.0;
  std::vector<std::string> consumed_scales;
  for (const auto& entry : input->entries()) {
    const int4::TensorView tensor = *input->tensor(entry.name);
    bool skip = !ends_with(entry.name, ".weight") || tensor.shape.size() != 2;
    for (const auto& pattern : options.skip) skip |= entry.name.find(pattern) != std::string::npos;
    const bool fp8 = tensor.type == int4::ElementType::float8_e4m3;
    skip |= !(tensor.type == int4::ElementType::float32 || tensor.type == int4::ElementType::float16 ||
              tensor.type == int4::ElementType::bfloat16 || (fp8 && input->contains(entry.name + "_scale_inv")));
    if (!skip) {
      const std::int64_t k = tensor.shape[1];
      const std::int64_t group = options.quantize.group_size == int4::kPerChannel ? k : options.quantize.group_size;
      skip = k % 8 != 0 || k % group != 0 || group % 8 != 0;
    }
    if (skip) {
      if (ends_with(entry.name, "_scale_inv")) continue;  // written below if its weight was not quantized
      if (auto status = writer.add(entry.name, tensor); !status.ok()) {
        std::fprintf(stderr, "error: %s\n", status.to_string().c_str());
        return 1;
      }
      ++copied;
      continue;
    }
    int4::QuantizeOptions quantize = options.quantize;
    if (!options.scale_type_given && (tensor.type == int4::ElementType::float16 || tensor.type == int4::ElementType::bfloat16) &&
        options.format == OutputFormat::compressed_tensors) {
      quantize.scale_type = tensor.type;  // compressed-tensors keeps scales in the model's dtype
    }
    std::optional<int4::BlockScales> blocks;
    if (fp8) {
      blocks = int4::BlockScales{*input->tensor(entry.name + "_scale_inv"), 128, 128};
      consumed_scales.push_back(entry.name + "_scale_inv");
    }
    const auto start = std::chrono::steady_clock::now();
    auto matrix = int4::quantize(tensor, int4::WeightLayout::n_by_k, quantize, blocks ? &*blocks : nullptr);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!matrix.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", entry.name.c_str(), matrix.status().to_string().c_str());
      return 1;
    }
    auto error = int4::measure_error(tensor, int4::WeightLayout::n_by_k, *matrix, blocks ? &*blocks : nullptr);
    if (auto status = add_quantized(writer, options, entry.name, *matrix, quantize.scale_type); !status.ok() || !error.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", entry.name.c_str(),
                   (status.ok() ? error.status() : status).to_string().c_str());
      return 1;
    }
    const std::string shape = "[" + std::to_string(tensor.shape[0]) + ", " + std::to_string(tensor.shape[1]) + "]";
    std::printf("%-48s %-14s %-6s %10.3e %10.3e %9.2f %9.2f\n", entry.name.c_str(), shape.c_str(),
                std::string(int4::safetensors_name(tensor.type)).c_str(), error->relative, error->max_abs,
                seconds * 1e3, static_cast<double>(tensor.bytes.size()) / seconds / 1e9);
    sum_relative += error->relative;
    max_relative = std::max(max_relative, error->relative);
    total_bytes += static_cast<double>(tensor.bytes.size());
    total_seconds += seconds;
    ++quantized;
  }
  // Block scales of FP8 weights that were copied rather than quantized stay with them.
  for (const auto& entry : input->entries()) {
    if (!ends_with(entry.name, "_scale_inv")) continue;
    bool consumed = false;
    for (const auto& name : consumed_scales) consumed |= name == entry.name;
    if (!consumed) {
      if (auto status = writer.add(entry.name, *input->tensor(entry.name)); !status.ok()) {
        std::fprintf(stderr, "error: %s\n", status.to_string().c_str());
        return 1;
      }
      ++copied;
    }
  }
  if (auto status = writer.write(options.output); !status.ok()) {
    std::fprintf(stderr, "error: %s\n", status.to_string().c_str());
    return 1;
  }
  std::printf("relative error: mean %.4e, max %.4e over %zu tensors\n",
              quantized ? sum_relative / static_cast<double>(quantized) : 0.0, max_relative, quantized);
  std::printf("quantized %zu tensors (%.1f MB in %.1f ms: %.2f GB/s), copied %zu unchanged -> %s\n", quantized,
              total_bytes / 1e6, total_seconds * 1e3, total_seconds > 0 ? total_bytes / total_seconds / 1e9 : 0.0,
              copied, options.output.c_str());
  return 0;
}
