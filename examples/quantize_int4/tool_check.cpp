// Test helper for slimserve_quantize_int4 (run by CTest through run_tool_test.cmake and by
// the Python format checks):
//
//   tool_check write-moe DIR [--dtype bf16|f32|fp8] [--shards S] [--hidden H] [--inter I]
//                            [--experts E] [--layers L] [--seed N]
//       a synthetic Hugging Face MoE model folder: attention projections, a router, a
//       one-output shared-expert gate, per-expert experts in even layers and stacked 3-D
//       experts ([E, N, K]) in odd ones, embeddings, norms, an untied lm_head, tokenizer and
//       generation files; FP8 puts 128 x 128 block scales next to every block weight.
//       Streams tensor by tensor, so it can write multi-GB models in little memory.
//   tool_check write-gpt2 DIR
//       a small GPT-2-style model: Conv1D weights stored [K, N], tied embeddings.
//   tool_check verify IN OUT [--layout nk|kn] [--expect-quantized N]
//       every quantized module imports back (slimserve's importers) within scale / 2 of its
//       source element (FP8 sources: fp8 x block scale), embeddings / norms / router / gates
//       / lm_head stay unquantized, every other input tensor is copied unchanged (FP8 ones
//       left unquantized: exactly fp8 x scale rounded to BF16), the config lists the scheme,
//       the shard index is consistent, side files are copied.
//   tool_check dequantize OUT REF.safetensors
//       slimserve's dequantization of every quantized module, F32 [N, K], named by module.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/int4/checkpoint_formats.hpp"
#include "slimserve/int4/safetensors.hpp"

namespace int4 = slimserve::int4;
namespace fs = std::filesystem;
using int4::ElementType;
using Json = nlohmann::ordered_json;

namespace {

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "tool_check: %s\n", message.c_str());
  std::exit(1);
}
template <class T>
T value_or_die(slimserve::Result<T> result, const std::string& what) {
  if (!result.ok()) die(what + ": " + result.status().to_string());
  return std::move(*result);
}
void ok_or_die(const slimserve::Status& status, const std::string& what) {
  if (!status.ok()) die(what + ": " + status.to_string());
}
void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}
Json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) die("cannot read " + path.string());
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}
bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// --- writing synthetic models -----------------------------------------------------------

struct Spec {
  std::string name;
  ElementType type;
  std::vector<std::int64_t> shape;
  bool fp8_blocks = false;  // FP8 with "<name>_scale_inv"
};

/// Random weights, streamed tensor by tensor into shards of the folder.
void write_model(const fs::path& dir, const std::vector<Spec>& specs, int shards, unsigned seed) {
  std::vector<std::vector<int4::SafetensorsStreamWriter::Planned>> plans(static_cast<std::size_t>(shards));
  std::map<std::string, int> shard_of;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    const int shard = static_cast<int>(i * static_cast<std::size_t>(shards) / specs.size());
    plans[static_cast<std::size_t>(shard)].push_back({s.name, s.type, s.shape});
    shard_of[s.name] = shard;
    total += plans[static_cast<std::size_t>(shard)].back().bytes();
    if (s.fp8_blocks) {
      std::vector<std::int64_t> blocks = s.shape;
      blocks[blocks.size() - 1] = (blocks.back() + 127) / 128;
      blocks[blocks.size() - 2] = (blocks[blocks.size() - 2] + 127) / 128;
      plans[static_cast<std::size_t>(shard)].push_back({s.name + "_scale_inv", ElementType::float32, blocks});
      shard_of[s.name + "_scale_inv"] = shard;
      total += plans[static_cast<std::size_t>(shard)].back().bytes();
    }
  }
  auto file_name = [&](int shard) {
    if (shards == 1) return std::string("model.safetensors");
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", shard + 1, shards);
    return std::string(name);
  };
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (int shard = 0; shard < shards; ++shard) {
    auto writer = value_or_die(int4::SafetensorsStreamWriter::create((dir / file_name(shard)).string(),
                                                                     plans[static_cast<std::size_t>(shard)], {{"format", "pt"}}),
                               "create shard");
    for (const auto& planned : plans[static_cast<std::size_t>(shard)]) {
      int4::Tensor t(planned.type, planned.shape);
      const bool scales = ends_with(planned.name, "_scale_inv");
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        // Rows of different magnitude so groups differ; FP8 block scales vary per block.
        const float v = normal(rng) * (1.0f + static_cast<float>(i % 7));
        switch (planned.type) {
          case ElementType::float32: t.set(i, scales ? std::ldexp(1.0f, -8 - static_cast<int>(rng() % 4)) : v); break;
          case ElementType::bfloat16: t.set(i, slimserve::from_float<slimserve::bf16>(v).bits); break;
          case ElementType::float16: t.set(i, slimserve::from_float<slimserve::fp16>(v).bits); break;
          case ElementType::float8_e4m3: {
            auto bits = static_cast<std::uint8_t>(rng());
            if ((bits & 0x7F) == 0x7F) bits = 0x30;  // no NaN
            t.set(i, bits);
            break;
          }
          default: die("unexpected dtype");
        }
      }
      ok_or_die(writer.write(planned.name, t.bytes), "write");
    }
    ok_or_die(writer.finish(), "finish");
  }
  if (shards > 1) {
    Json map = Json::object();
    for (const auto& [name, shard] : shard_of) map[name] = file_name(shard);
    write_text(dir / "model.safetensors.index.json",
               Json{{"metadata", {{"total_size", total}}}, {"weight_map", map}}.dump(2));
  }
  write_text(dir / "tokenizer.json", R"({"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0}}})");
  write_text(dir / "tokenizer_config.json", R"({"model_max_length": 512})");
  write_text(dir / "generation_config.json", R"({"bos_token_id": 0, "eos_token_id": 1})");
}

int write_moe(const fs::path& dir, int argc, char** argv) {
  std::string dtype = "bf16";
  int shards = 1;
  std::int64_t hidden = 256, inter = 128, experts = 4, layers = 2, vocab = 96;
  unsigned seed = 1;
  for (int i = 0; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--dtype") dtype = value;
    else if (key == "--shards") shards = std::stoi(value);
    else if (key == "--hidden") hidden = std::stoll(value);
    else if (key == "--inter") inter = std::stoll(value);
    else if (key == "--experts") experts = std::stoll(value);
    else if (key == "--layers") layers = std::stoll(value);
    else if (key == "--seed") seed = static_cast<unsigned>(std::stoul(value));
    else die("write-moe: unknown option " + key);
  }
  const bool fp8 = dtype == "fp8";
  const ElementType base = dtype == "f32" ? ElementType::float32 : ElementType::bfloat16;
  const ElementType block = fp8 ? ElementType::float8_e4m3 : base;
  fs::create_directories(dir);
  std::vector<Spec> specs;
  specs.push_back({"model.embed_tokens.weight", base, {vocab, hidden}});
  const std::int64_t kv = hidden / 4;
  for (std::int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    specs.push_back({p + "input_layernorm.weight", base, {hidden}});
    specs.push_back({p + "self_attn.q_proj.weight", block, {hidden, hidden}, fp8});
    specs.push_back({p + "self_attn.k_proj.weight", block, {kv, hidden}, fp8});
    specs.push_back({p + "self_attn.v_proj.weight", block, {kv, hidden}, fp8});
    specs.push_back({p + "self_attn.o_proj.weight", block, {hidden, hidden}, fp8});
    specs.push_back({p + "post_attention_layernorm.weight", base, {hidden}});
    specs.push_back({p + "mlp.gate.weight", base, {experts, hidden}});  // the router
    specs.push_back({p + "mlp.shared_expert_gate.weight", base, {1, hidden}});
    if (l % 2 == 0) {
      for (std::int64_t e = 0; e < experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        specs.push_back({x + "gate_proj.weight", block, {inter, hidden}, fp8});
        specs.push_back({x + "up_proj.weight", block, {inter, hidden}, fp8});
        specs.push_back({x + "down_proj.weight", block, {hidden, inter}, fp8});
      }
    } else {
      specs.push_back({p + "mlp.experts.gate_up_proj", block, {experts, 2 * inter, hidden}, fp8});
      specs.push_back({p + "mlp.experts.down_proj", block, {experts, hidden, inter}, fp8});
    }
  }
  specs.push_back({"model.norm.weight", base, {hidden}});
  specs.push_back({"lm_head.weight", base, {vocab, hidden}});
  Json config = {{"architectures", {"Qwen3MoeForCausalLM"}},
                 {"model_type", "qwen3_moe"},
                 {"hidden_size", hidden},
                 {"intermediate_size", inter},
                 {"moe_intermediate_size", inter},
                 {"num_hidden_layers", layers},
                 {"num_experts", experts},
                 {"num_experts_per_tok", 2},
                 {"vocab_size", vocab},
                 {"tie_word_embeddings", false},
                 {"torch_dtype", dtype == "f32" ? "float32" : "bfloat16"}};
  if (fp8) config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                                            {"weight_block_size", {128, 128}}};
  write_text(dir / "config.json", config.dump(2));
  write_model(dir, specs, shards, seed);
  return 0;
}

int write_gpt2(const fs::path& dir) {
  fs::create_directories(dir);
  const std::int64_t h = 64, v = 80;
  std::vector<Spec> specs = {{"wte.weight", ElementType::float32, {v, h}},
                             {"wpe.weight", ElementType::float32, {32, h}},
                             {"h.0.ln_1.weight", ElementType::float32, {h}},
                             {"h.0.attn.c_attn.weight", ElementType::float32, {h, 3 * h}},  // Conv1D [K, N]
                             {"h.0.attn.c_attn.bias", ElementType::float32, {3 * h}},
                             {"h.0.attn.c_proj.weight", ElementType::float32, {h, h}},
                             {"h.0.mlp.c_fc.weight", ElementType::float32, {h, 4 * h}},
                             {"h.0.mlp.c_proj.weight", ElementType::float32, {4 * h, h}},
                             {"ln_f.weight", ElementType::float32, {h}}};
  write_text(dir / "config.json", Json{{"model_type", "gpt2"}, {"n_embd", h}, {"n_layer", 1}, {"vocab_size", v}}.dump(2));
  write_model(dir, specs, 1, 7);
  return 0;
}

// --- reading model folders ----------------------------------------------------------------

struct Folder {
  std::vector<std::unique_ptr<int4::SafetensorsFile>> files;
  std::map<std::string, int4::TensorView> tensors;
  std::map<std::string, std::string> shard_of;
  Json config;
};

Folder load(const fs::path& dir) {
  Folder folder;
  folder.config = read_json(dir / "config.json");
  std::vector<std::string> names;
  if (fs::exists(dir / "model.safetensors.index.json")) {
    const Json index = read_json(dir / "model.safetensors.index.json");
    std::set<std::string> files;
    for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
    names.assign(files.begin(), files.end());
    for (const auto& [name, file] : index["weight_map"].items()) folder.shard_of[name] = file.get<std::string>();
  } else {
    names.push_back("model.safetensors");
  }
  for (const auto& name : names) {
    folder.files.push_back(std::make_unique<int4::SafetensorsFile>(
        value_or_die(int4::SafetensorsFile::read((dir / name).string()), "read " + name)));
    for (const auto& entry : folder.files.back()->entries()) {
      if (!folder.shard_of.empty() && folder.shard_of[entry.name] != name) die("index places " + entry.name + " elsewhere");
      if (!folder.tensors.emplace(entry.name, *folder.files.back()->tensor(entry.name)).second) die("duplicate " + entry.name);
    }
  }
  if (!folder.shard_of.empty() && folder.shard_of.size() != folder.tensors.size()) die("index and shards disagree");
  return folder;
}

double element(const int4::TensorView& t, std::int64_t i) {
  switch (t.type) {
    case ElementType::float32: return t.at<float>(i);
    case ElementType::bfloat16: return slimserve::to_float(slimserve::bf16::from_bits(t.at<std::uint16_t>(i)));
    case ElementType::float16: return slimserve::to_float(slimserve::fp16::from_bits(t.at<std::uint16_t>(i)));
    case ElementType::float8_e4m3: return slimserve::to_float(slimserve::fp8_e4m3::from_bits(t.at<std::uint8_t>(i)));
    default: die("not a float tensor");
  }
}

struct Imported {
  std::string module;
  int4::QuantizedMatrix matrix;
};

/// Every quantized module of an output folder, imported with slimserve's importers.
std::vector<Imported> import_all(const Folder& out) {
  const Json& q = out.config["quantization_config"];
  const std::string method = q["quant_method"];
  std::vector<Imported> modules;
  for (const auto& [name, view] : out.tensors) {
    auto get = [&](const std::string& n) -> std::optional<int4::TensorView> {
      const auto it = out.tensors.find(n);
      return it == out.tensors.end() ? std::nullopt : std::optional<int4::TensorView>(it->second);
    };
    if (method == "compressed-tensors" && ends_with(name, ".weight_packed")) {
      const std::string module = name.substr(0, name.size() - 14);
      const Json& w = q["config_groups"]["group_0"]["weights"];
      const std::int64_t group = w["strategy"] == "channel" ? -1 : w["group_size"].get<std::int64_t>();
      int4::CompressedTensorsView v{view, *get(module + ".weight_scale"), get(module + ".weight_zero_point"),
                                    get(module + ".weight_g_idx"), get(module + ".weight_shape")};
      modules.push_back({module, value_or_die(int4::import_compressed_tensors(v, {group, w["symmetric"].get<bool>()}),
                                              "import " + module)});
    } else if (method == "gptq" && ends_with(name, ".qweight")) {
      const std::string module = name.substr(0, name.size() - 8);
      int4::GptqConfig config{q["group_size"].get<std::int64_t>(), q["desc_act"].get<bool>(), q["sym"].get<bool>(),
                              q["checkpoint_format"] == "gptq_v2" ? int4::GptqZeroFormat::v2_plain
                                                                 : int4::GptqZeroFormat::v1_minus_one};
      int4::GptqTensorView v{view, *get(module + ".qzeros"), *get(module + ".scales"), get(module + ".g_idx")};
      modules.push_back({module, value_or_die(int4::import_gptq(v, config), "import " + module)});
    }
  }
  return modules;
}

/// The source weight of a module, its layout-independent accessor w(k, n).
struct SourceWeight {
  int4::TensorView weight;
  std::optional<int4::TensorView> scales;  // FP8 block scales
  std::int64_t expert = -1;
  std::string tensor;
};

int verify(const fs::path& in_dir, const fs::path& out_dir, int argc, char** argv) {
  bool kn = false;
  long expect = -1;
  for (int i = 0; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--layout") kn = value == "kn";
    else if (key == "--expect-quantized") expect = std::stol(value);
    else die("verify: unknown option " + key);
  }
  const Folder in = load(in_dir), out = load(out_dir);
  const auto modules = import_all(out);
  if (expect >= 0 && static_cast<long>(modules.size()) != expect) {
    die("quantized " + std::to_string(modules.size()) + " modules, expected " + std::to_string(expect));
  }
  const Json in_q = in.config.contains("quantization_config") ? in.config["quantization_config"] : Json::object();
  const bool fp8_source = in_q.value("quant_method", "") == "fp8";
  std::set<std::string> consumed;
  const std::regex expert_name(R"(^(.*)\.(\d+)\.([^.]+)$)");
  std::size_t checked = 0;
  for (const auto& [module, m] : modules) {
    for (const char* forbidden : {"embed", "norm", "lm_head", "shared_expert_gate", "wte", "wpe"}) {
      if (module.find(forbidden) != std::string::npos) die("quantized " + module + ", which must stay unquantized");
    }
    if (ends_with(module, "mlp.gate")) die("quantized the router " + module);
    SourceWeight source;
    if (in.tensors.contains(module + ".weight")) {
      source.tensor = module + ".weight";
    } else if (std::smatch match; std::regex_match(module, match, expert_name) &&
                                  in.tensors.contains(match[1].str() + "." + match[3].str())) {
      source.tensor = match[1].str() + "." + match[3].str();
      source.expert = std::stoll(match[2].str());
    } else {
      die("no source for module " + module);
    }
    source.weight = in.tensors.at(source.tensor);
    consumed.insert(source.tensor);
    if (in.tensors.contains(source.tensor + "_scale_inv")) {
      source.scales = in.tensors.at(source.tensor + "_scale_inv");
      consumed.insert(source.tensor + "_scale_inv");
    }
    const auto& shape = source.weight.shape;
    const std::int64_t rows = shape[shape.size() - 2], cols = shape.back();
    const std::int64_t k = kn ? rows : cols, n = kn ? cols : rows;
    if (m.k != k || m.n != n) die(module + ": imported shape differs from the source");
    const std::int64_t base = source.expert < 0 ? 0 : source.expert * rows * cols;
    for (std::int64_t kk = 0; kk < k; ++kk) {
      for (std::int64_t nn = 0; nn < n; ++nn) {
        const std::int64_t r = kn ? kk : nn, c = kn ? nn : kk;
        double w = element(source.weight, base + r * cols + c);
        if (source.scales) {
          const std::int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
          w *= source.scales->at<float>((std::max<std::int64_t>(source.expert, 0) * rb + r / 128) * cb + c / 128);
        }
        const std::int64_t g = m.group_of_row(kk);
        const double scale = m.scales[static_cast<std::size_t>(g * n + nn)];
        const double error = std::fabs(w - static_cast<double>(m.dequantized(kk, nn)));
        if (!(error <= scale * 0.5 * (1 + 1e-6) + 1e-30)) {
          die(module + ": element (" + std::to_string(kk) + ", " + std::to_string(nn) + ") = " + std::to_string(w) +
              " came back with error " + std::to_string(error) + " > scale / 2 = " + std::to_string(scale / 2));
        }
        ++checked;
      }
    }
  }
  // Everything else is copied unchanged (FP8 left unquantized: dequantized to BF16).
  std::set<std::string> ignored_expected;
  for (const auto& [name, view] : in.tensors) {
    if (consumed.contains(name) || (fp8_source && ends_with(name, "_scale_inv"))) continue;
    if (!out.tensors.contains(name)) die("input tensor " + name + " is missing from the output");
    const auto& o = out.tensors.at(name);
    if (o.shape != view.shape) die(name + ": shape changed");
    if (view.type == ElementType::float8_e4m3) {
      const auto& scales = in.tensors.at(name + "_scale_inv");
      const std::int64_t rows = view.shape[view.shape.size() - 2], cols = view.shape.back();
      for (std::int64_t i = 0; i < view.numel(); ++i) {
        const std::int64_t e = i / (rows * cols), r = (i / cols) % rows, c = i % cols;
        const float value = static_cast<float>(element(view, i)) *
                            scales.at<float>((e * ((rows + 127) / 128) + r / 128) * ((cols + 127) / 128) + c / 128);
        if (o.type != ElementType::bfloat16 || o.at<std::uint16_t>(i) != slimserve::from_float<slimserve::bf16>(value).bits) {
          die(name + ": FP8 left unquantized is not fp8 x scale in BF16 at element " + std::to_string(i));
        }
      }
    } else if (o.type != view.type || !std::equal(o.bytes.begin(), o.bytes.end(), view.bytes.begin(), view.bytes.end())) {
      die(name + ": not copied unchanged");
    }
    if ((view.shape.size() == 2 && ends_with(name, ".weight")) || view.shape.size() == 3) {
      ignored_expected.insert(ends_with(name, ".weight") ? name.substr(0, name.size() - 7) : name);
    }
  }
  const Json& q = out.config["quantization_config"];
  if (q["quant_method"] == "compressed-tensors") {
    std::set<std::string> ignored;
    for (const auto& item : q["ignore"]) ignored.insert(item.get<std::string>());
    if (ignored != ignored_expected) die("config ignore list differs from the modules left unquantized");
    if (q["format"] != "pack-quantized" || q["config_groups"]["group_0"]["format"] != "pack-quantized") die("format");
  } else {
    const Json quantize_config = read_json(out_dir / "quantize_config.json");
    if (quantize_config != q) die("quantize_config.json differs from config.json's quantization_config");
  }
  for (const char* side : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
    if (!fs::exists(in_dir / side)) continue;
    std::ifstream a(in_dir / side), b(out_dir / side);
    std::stringstream sa, sb;
    sa << a.rdbuf();
    sb << b.rdbuf();
    if (sa.str() != sb.str()) die(std::string(side) + " not copied");
  }
  std::printf("tool_check: %zu modules, %zu elements within scale/2, %zu tensors copied\n", modules.size(), checked,
              out.tensors.size());
  return 0;
}

int dequantize_all(const fs::path& out_dir, const std::string& ref_path) {
  const Folder out = load(out_dir);
  int4::SafetensorsWriter writer;
  for (const auto& [module, m] : import_all(out)) {
    int4::Tensor t(ElementType::float32, {m.n, m.k});
    for (std::int64_t k = 0; k < m.k; ++k) {
      for (std::int64_t n = 0; n < m.n; ++n) t.set(n * m.k + k, m.dequantized(k, n));
    }
    ok_or_die(writer.add(module, t.view()), "add");
  }
  ok_or_die(writer.write(ref_path), "write " + ref_path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "write-moe" && argc >= 3) return write_moe(argv[2], argc - 3, argv + 3);
  if (mode == "write-gpt2" && argc == 3) return write_gpt2(argv[2]);
  if (mode == "verify" && argc >= 4) return verify(argv[2], argv[3], argc - 4, argv + 4);
  if (mode == "dequantize" && argc == 4) return dequantize_all(argv[2], argv[3]);
  std::fprintf(stderr, "usage: tool_check write-moe DIR [...] | write-gpt2 DIR | verify IN OUT [...] | dequantize OUT REF\n");
  return 2;
}
