#include "options.hpp"

#include <cstdlib>
#include <regex>
#include <string_view>

namespace int4 = slimserve::int4;

namespace quantize_tool {
namespace {

bool parse_int(const char* text, long long& value) {
  if (text == nullptr) return false;
  char* end = nullptr;
  value = std::strtoll(text, &end, 10);
  return end != text && *end == '\0';
}

/// "re:PATTERN" must compile; a plain name is matched literally.
std::string check_pattern(const std::string& pattern) {
  if (!pattern.starts_with("re:")) return {};
  try {
    std::regex compiled(pattern.substr(3));
  } catch (const std::regex_error& error) {
    return "bad regular expression '" + pattern.substr(3) + "': " + error.what();
  }
  return {};
}

}  // namespace

const char* help_text() {
  return R"(usage: slimserve_quantize_int4 IN_MODEL_DIR OUT_MODEL_DIR [options]

Quantizes a Hugging Face model folder (config.json + model.safetensors or a sharded
model.safetensors.index.json) to INT4 weights and writes a model folder that vLLM and SGLang
load: compressed-tensors "pack-quantized" (default) or GPTQ. Tensors stream through memory
one at a time per job (one expert at a time for stacked MoE weights).

What is quantized (decided from the model's structure): 2-D linear weights inside the
repeated transformer blocks (attention, MLP, MoE experts, per-expert or stacked 3-D
[experts, out, in]); never embeddings, norms, the MoE router, or lm_head (unless
--quantize-lm-head and the embeddings are not tied). Everything else is copied unchanged
and listed in the config's "ignore". Sources: F32/F16/BF16, FP8 e4m3 with 128x128 block
scales (weight_scale_inv), or an INT4 GPTQ / AWQ / compressed-tensors model (converted
without loss when the scheme is unchanged, re-quantized otherwise).

options:
  --format ct|gptq|gptq-v2   output format (default ct); gptq writes v1 zero points, the
                             convention GPTQ loaders assume; gptq-v2 writes them plainly
  --group 32|64|128|channel  rows of K per scale (default 128)
  --asym                     asymmetric (zero points); default symmetric
  --clip STEPS               clipping search with STEPS shrink factors (default off)
  --scale-dtype f32|f16|bf16 scale type (default: the weights' dtype for ct, f16 for gptq)
  --layout auto|nk|kn        weight layout: nk = [out, in] (nn.Linear), kn = [in, out]
                             (GPT-2 Conv1D; stacked experts [E, in, out]); default auto
  --targets NAME             quantize only these modules (repeatable); NAME is a module
                             name, or re:REGEX matched from the start of the name
  --ignore NAME              never quantize these modules (repeatable, same syntax)
  --quantize-lm-head         quantize lm_head too (refused when embeddings are tied)
  --jobs J                   tensors in flight at once (default: one per core)
  --max-shard-size BYTES     output shard size (default 5000000000)
  --progress auto|bar|lines|none   progress display (default: bar on a terminal)
  --measure-error            also report each tensor's relative error (one more pass)
  --overwrite                replace OUT_MODEL_DIR if it exists
  -h, --help                 this text

Memory: at most J tensors (or experts) in memory at once, each with its INT4 result; see
docs/int4.md for measured peak RSS.
)";
}

std::string parse_options(int argc, char** argv, Options& options, bool& wants_help) {
  std::vector<std::string_view> positional;
  wants_help = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "-h" || std::string_view(argv[i]) == "--help") {
      wants_help = true;
      return {};
    }
  }
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    long long number = 0;
    if (arg == "--asym") {
      options.quantize.symmetric = false;
    } else if (arg == "--format") {
      const char* v = next();
      const std::string_view format = v ? v : "";
      if (format == "ct") options.format = OutputFormat::compressed_tensors;
      else if (format == "gptq") options.format = OutputFormat::gptq_v1;
      else if (format == "gptq-v2") options.format = OutputFormat::gptq_v2;
      else return "--format takes ct, gptq or gptq-v2";
    } else if (arg == "--group") {
      const char* v = next();
      if (v && std::string_view(v) == "channel") options.quantize.group_size = int4::kPerChannel;
      else if (parse_int(v, number) && number > 0 && number % 8 == 0) options.quantize.group_size = number;
      else return "--group takes a positive multiple of 8 or 'channel'";
    } else if (arg == "--clip") {
      if (!parse_int(next(), number) || number < 0 || number > 1000) return "--clip takes a step count 0..1000";
      options.quantize.clip.steps = static_cast<int>(number);
    } else if (arg == "--jobs") {
      if (!parse_int(next(), number) || number < 0 || number > 1024) return "--jobs takes a count 0..1024 (0 = one per core)";
      options.jobs = static_cast<int>(number);
    } else if (arg == "--max-shard-size") {
      if (!parse_int(next(), number) || number < 1) return "--max-shard-size takes a byte count > 0";
      options.max_shard_bytes = static_cast<std::uint64_t>(number);
    } else if (arg == "--scale-dtype") {
      const char* v = next();
      const std::string_view type = v ? v : "";
      if (type == "f32") options.quantize.scale_type = int4::ElementType::float32;
      else if (type == "f16") options.quantize.scale_type = int4::ElementType::float16;
      else if (type == "bf16") options.quantize.scale_type = int4::ElementType::bfloat16;
      else return "--scale-dtype takes f32, f16 or bf16";
      options.scale_type_given = true;
    } else if (arg == "--layout") {
      const char* v = next();
      const std::string_view layout = v ? v : "";
      if (layout == "auto") options.layout.reset();
      else if (layout == "nk") options.layout = int4::WeightLayout::n_by_k;
      else if (layout == "kn") options.layout = int4::WeightLayout::k_by_n;
      else return "--layout takes auto, nk or kn";
    } else if (arg == "--targets" || arg == "--ignore") {
      const char* v = next();
      if (!v || !*v) return std::string(arg) + " takes a module name or re:REGEX";
      if (std::string error = check_pattern(v); !error.empty()) return error;
      (arg == "--targets" ? options.targets : options.ignore).emplace_back(v);
    } else if (arg == "--quantize-lm-head") {
      options.quantize_lm_head = true;
    } else if (arg == "--progress") {
      const char* v = next();
      const std::string_view style = v ? v : "";
      if (style == "auto") options.progress = ProgressStyle::automatic;
      else if (style == "bar") options.progress = ProgressStyle::bar;
      else if (style == "lines") options.progress = ProgressStyle::lines;
      else if (style == "none") options.progress = ProgressStyle::none;
      else return "--progress takes auto, bar, lines or none";
    } else if (arg == "--measure-error") {
      options.measure_error = true;
    } else if (arg == "--overwrite") {
      options.overwrite = true;
    } else if (arg.starts_with("-")) {
      return "unknown option " + std::string(arg) + " (see --help)";
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.size() != 2) return "expected an input and an output model folder (see --help)";
  options.input = positional[0];
  options.output = positional[1];
  return {};
}

}  // namespace quantize_tool
