#include "plan.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <regex>
#include <set>

namespace int4 = slimserve::int4;
using slimserve::make_status;
using slimserve::StatusCode;

namespace quantize_tool {
namespace {

/// A module name, or "re:REGEX" matched from the start of the name (as compressed-tensors does).
class Pattern {
 public:
  explicit Pattern(const std::string& text) : text_(text) {
    if (text.starts_with("re:")) regex_ = std::regex(text.substr(3));
  }
  bool matches(const std::string& module) const {
    if (!regex_) return module == text_;
    return std::regex_search(module, *regex_, std::regex_constants::match_continuous);
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  std::optional<std::regex> regex_;
};

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}
std::string strip(const std::string& text, std::string_view suffix) {
  return ends_with(text, suffix) ? text.substr(0, text.size() - suffix.size()) : text;
}

/// Inside a repeated block: some path component is an index ("model.layers.3.mlp...").
bool in_repeated_block(const std::string& name) {
  std::size_t start = 0;
  while (start <= name.size()) {
    const std::size_t end = std::min(name.find('.', start), name.size());
    if (end > start && std::all_of(name.begin() + static_cast<std::ptrdiff_t>(start),
                                   name.begin() + static_cast<std::ptrdiff_t>(end),
                                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
      return true;
    }
    start = end + 1;
  }
  return false;
}

/// Lookup tables and norms live in blocks too (relative-position embeddings, some norms are
/// 2-D); their module names say so, and they are never linear layers.
bool is_table_or_norm(const std::string& module) {
  const auto leaf = module.substr(module.rfind('.') == std::string::npos ? 0 : module.rfind('.') + 1);
  return leaf.find("embed") != std::string::npos || leaf.find("norm") != std::string::npos ||
         module.find("embeddings") != std::string::npos;
}

bool is_float(int4::ElementType type) {
  return type == int4::ElementType::float32 || type == int4::ElementType::float16 ||
         type == int4::ElementType::bfloat16;
}

int4::WeightLayout resolve_layout(const Options& options, const ModelFolder& model, bool stacked) {
  if (options.layout) return *options.layout;
  const std::string type = model.model_type();
  // GPT-2-style Conv1D stores [in, out]; gpt-oss and Llama 4 stack experts as [E, in, out].
  if (!stacked && (type == "gpt2" || type == "openai-gpt")) return int4::WeightLayout::k_by_n;
  if (stacked && (type == "gpt_oss" || type == "llama4" || type == "llama4_text")) return int4::WeightLayout::k_by_n;
  return int4::WeightLayout::n_by_k;
}

}  // namespace

std::string Unit::expert_module(std::int64_t expert) const {
  const std::size_t dot = module.rfind('.');
  if (dot == std::string::npos) return std::to_string(expert) + "." + module;
  return module.substr(0, dot) + "." + std::to_string(expert) + module.substr(dot);
}

std::vector<int4::SafetensorsStreamWriter::Planned> quantized_outputs(const Options& options, const std::string& module,
                                                                       std::int64_t k, std::int64_t n,
                                                                       std::int64_t group_size,
                                                                       int4::ElementType scale_type) {
  const std::int64_t groups = k / group_size;
  using T = int4::ElementType;
  if (options.format == OutputFormat::compressed_tensors) {
    std::vector<int4::SafetensorsStreamWriter::Planned> out = {
        {module + ".weight_packed", T::int32, {n, (k + 7) / 8}},
        {module + ".weight_scale", scale_type, {n, groups}},
    };
    if (!options.quantize.symmetric) out.push_back({module + ".weight_zero_point", T::int32, {(n + 7) / 8, groups}});
    out.push_back({module + ".weight_shape", T::int64, {2}});
    return out;
  }
  return {{module + ".qweight", T::int32, {k / 8, n}},
          {module + ".qzeros", T::int32, {groups, (n + 7) / 8}},
          {module + ".scales", scale_type, {groups, n}},
          {module + ".g_idx", T::int32, {k}}};
}

slimserve::Result<Plan> make_plan(const ModelFolder& model, const Options& options) {
  std::vector<Pattern> targets, ignore;
  try {
    for (const auto& text : options.targets) targets.emplace_back(text);
    for (const auto& text : options.ignore) ignore.emplace_back(text);
  } catch (const std::regex_error& error) {
    return make_status(StatusCode::invalid_argument, "bad regular expression: ", error.what());
  }
  std::vector<bool> target_used(targets.size(), false);
  const auto& source = model.source_quantization();
  const std::int64_t experts = model.num_experts();
  const bool tied = model.tied_embeddings();
  if (options.quantize_lm_head && tied) {
    return make_status(StatusCode::invalid_argument,
                       "--quantize-lm-head: lm_head is tied to the input embeddings (tie_word_embeddings), which stay "
                       "unquantized");
  }

  // Tensors that belong to another one: block scales and the parts of packed INT4 modules.
  std::set<std::string> consumed;
  std::map<std::string, std::string> packed_modules;  // main tensor (qweight / weight_packed) -> module
  for (const std::string& name : model.tensor_names()) {
    const TensorRef& ref = *model.find(name);
    if (ref.entry->type == int4::ElementType::float8_e4m3 && model.find(name + "_scale_inv")) {
      consumed.insert(name + "_scale_inv");
    }
    const bool gptq_like = source.kind == SourceQuantization::Kind::gptq || source.kind == SourceQuantization::Kind::awq;
    if (gptq_like && ends_with(name, ".qweight")) {
      const std::string module = strip(name, ".qweight");
      packed_modules[name] = module;
      for (const char* part : {".qzeros", ".scales", ".g_idx"}) consumed.insert(module + part);
    }
    if (source.kind == SourceQuantization::Kind::compressed_tensors && ends_with(name, ".weight_packed")) {
      const std::string module = strip(name, ".weight_packed");
      packed_modules[name] = module;
      for (const char* part : {".weight_scale", ".weight_zero_point", ".weight_shape", ".weight_g_idx"}) {
        consumed.insert(module + part);
      }
    }
  }

  Plan plan;
  auto ignored_by_recipe = [&](const std::string& module) {
    return std::any_of(ignore.begin(), ignore.end(), [&](const Pattern& p) { return p.matches(module); });
  };
  auto targeted = [&](const std::string& module) {
    bool hit = false;
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (targets[i].matches(module)) target_used[i] = hit = true;
    }
    return hit;
  };
  auto resolve_group = [&](std::int64_t k) {
    return options.quantize.group_size == int4::kPerChannel ? k : options.quantize.group_size;
  };
  auto check_k = [&](const std::string& name, std::int64_t k) -> slimserve::Status {
    const std::int64_t group = resolve_group(k);
    if (k % 8 != 0 || k % group != 0) {
      return make_status(StatusCode::invalid_argument, "tensor '", name, "': K = ", k,
                         " is not a multiple of the group size ", group,
                         k % 8 != 0 ? " (and INT4 packing needs K % 8 == 0)" : "",
                         "; choose another --group, or leave it in full precision with --ignore ",
                         strip(name, ".weight"));
    }
    return slimserve::Status::success();
  };
  auto scale_type_for = [&](int4::ElementType source_type) {
    if (options.scale_type_given) return options.quantize.scale_type;
    if (options.format != OutputFormat::compressed_tensors) return int4::ElementType::float16;
    if (is_float(source_type)) return source_type;  // compressed-tensors keeps scales in the model dtype
    if (source_type == int4::ElementType::float8_e4m3) return int4::ElementType::bfloat16;
    return int4::ElementType::float16;
  };

  for (const std::string& name : model.tensor_names()) {
    if (consumed.contains(name)) continue;
    const TensorRef& ref = *model.find(name);
    const auto& entry = *ref.entry;
    const std::uint64_t bytes = entry.end - entry.begin;
    Unit unit;
    unit.source = name;
    unit.source_bytes = bytes;

    // INT4 sources: every packed module is converted to the output format.
    if (auto packed = packed_modules.find(name); packed != packed_modules.end()) {
      const std::string& module = packed->second;
      if (ignored_by_recipe(module)) {
        return make_status(StatusCode::unsupported, "module '", module,
                           "' is INT4 in the source; --ignore cannot turn it back into full precision");
      }
      if (entry.shape.size() != 2) return make_status(StatusCode::data_loss, "'", name, "' is not 2-D");
      unit.action = Action::convert;
      unit.source = module;
      unit.module = module;
      if (source.kind == SourceQuantization::Kind::gptq) {
        unit.k = entry.shape[0] * 8, unit.n = entry.shape[1];
      } else if (source.kind == SourceQuantization::Kind::awq) {
        unit.k = entry.shape[0], unit.n = entry.shape[1] * 8;
      } else {
        const TensorRef* shape = model.find(module + ".weight_shape");
        if (!shape) return make_status(StatusCode::data_loss, "'", module, ".weight_shape' is missing");
        auto values = shape->file->read(*shape->entry);
        if (!values.ok()) return values.status();
        if (values->numel() != 2 || (values->type != int4::ElementType::int64 && values->type != int4::ElementType::int32)) {
          return make_status(StatusCode::data_loss, "'", module, ".weight_shape' is not two integers");
        }
        const bool wide = values->type == int4::ElementType::int64;
        unit.n = wide ? values->at<std::int64_t>(0) : values->at<std::int32_t>(0);
        unit.k = wide ? values->at<std::int64_t>(1) : values->at<std::int32_t>(1);
      }
      for (const char* part : {".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_zero_point", ".weight_shape",
                               ".weight_g_idx"}) {
        if (const TensorRef* aux = model.find(module + part)) unit.source_bytes += aux->entry->end - aux->entry->begin;
      }
      const TensorRef* scales = model.find(module + (source.kind == SourceQuantization::Kind::compressed_tensors
                                                         ? ".weight_scale" : ".scales"));
      unit.scale_type = scale_type_for(scales && is_float(scales->entry->type) ? scales->entry->type
                                                                               : int4::ElementType::float16);
      unit.group_size = resolve_group(unit.k);
      SLIMSERVE_RETURN_IF_ERROR(check_k(name, unit.k));
      plan.quantized_modules.push_back(module);
      plan.units.push_back(std::move(unit));
      continue;
    }

    const bool fp8 = entry.type == int4::ElementType::float8_e4m3;
    // Float types the quantizer does not read. Such a weight goes through the same selection as
    // the others: a linear layer that would be quantized is refused (copying it unquantized
    // without listing it in `ignore` makes a folder the engines refuse to load); one that is
    // not selected is copied and listed as ignored like any other.
    const bool unreadable_float = entry.type == int4::ElementType::float64 ||
                                  entry.type == int4::ElementType::float8_e5m2;
    const bool weight_like = is_float(entry.type) || fp8 || unreadable_float;
    const bool two_d = entry.shape.size() == 2 && ends_with(name, ".weight");
    const bool stacked = entry.shape.size() == 3 && experts > 0 && entry.shape[0] == experts;
    if (fp8 && (two_d || stacked) && !model.find(name + "_scale_inv")) {
      return make_status(StatusCode::data_loss, "FP8 weight '", name, "' has no block scales '", name, "_scale_inv'");
    }
    const std::string module = strip(name, ".weight");
    bool quantize = false;
    if (weight_like && (two_d || stacked)) {
      unit.layout = resolve_layout(options, model, stacked);
      const std::int64_t rows = entry.shape[entry.shape.size() - 2], cols = entry.shape.back();
      unit.n = unit.layout == int4::WeightLayout::n_by_k ? rows : cols;
      unit.k = unit.layout == int4::WeightLayout::n_by_k ? cols : rows;
      if (!targets.empty()) {
        quantize = targeted(module);
      } else if (module == "lm_head") {
        quantize = options.quantize_lm_head;
      } else {
        // Linear layers of the repeated blocks; not the router (one output per expert), not a
        // one-output gate, not a table or a norm.
        quantize = in_repeated_block(name) && !is_table_or_norm(module) && unit.n >= 8 &&
                   !(two_d && experts > 0 && unit.n == experts);
      }
      if (quantize && ignored_by_recipe(module)) quantize = false;
      if (!quantize) plan.ignored_modules.push_back(module);
    }
    if (quantize && unreadable_float) {
      return make_status(StatusCode::unsupported, "weight '", name, "' is stored as ",
                         entry.type == int4::ElementType::float64 ? "F64" : "F8_E5M2",
                         "; the tool quantizes F32, F16, BF16 and block-scaled F8_E4M3 weights (convert it, or "
                         "leave the module unquantized with --ignore ", module, ")");
    }
    if (quantize) {
      SLIMSERVE_RETURN_IF_ERROR(check_k(name, unit.k));
      unit.action = stacked ? Action::quantize_experts : Action::quantize;
      unit.module = module;
      unit.experts = stacked ? entry.shape[0] : 0;
      if (fp8) {
        unit.block_scales = name + "_scale_inv";
        unit.source_bytes += model.find(name + "_scale_inv")->entry->end - model.find(name + "_scale_inv")->entry->begin;
      }
      unit.scale_type = scale_type_for(entry.type);
      unit.group_size = resolve_group(unit.k);
      if (stacked) {
        for (std::int64_t e = 0; e < unit.experts; ++e) plan.quantized_modules.push_back(unit.expert_module(e));
      } else {
        plan.quantized_modules.push_back(module);
      }
    } else {
      unit.action = fp8 && model.find(name + "_scale_inv") ? Action::fp8_to_bf16 : Action::copy;
      if (unit.action == Action::fp8_to_bf16) {
        unit.block_scales = name + "_scale_inv";
        if (entry.shape.size() < 2 || entry.shape.size() > 3) {
          return make_status(StatusCode::unsupported, "FP8 tensor '", name, "' left unquantized is not 2-D or 3-D");
        }
      }
    }
    plan.units.push_back(std::move(unit));
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (!target_used[i]) {
      return make_status(StatusCode::invalid_argument, "--targets '", targets[i].text(), "' matches no weight");
    }
  }
  for (const Pattern& pattern : ignore) {
    const bool used = std::any_of(plan.ignored_modules.begin(), plan.ignored_modules.end(),
                                  [&](const std::string& m) { return pattern.matches(m); });
    if (!used) return make_status(StatusCode::invalid_argument, "--ignore '", pattern.text(), "' matches no weight");
  }

  for (const Unit& unit : plan.units) {
    plan.source_bytes += unit.source_bytes;
    const TensorRef* ref = unit.action == Action::convert ? nullptr : model.find(unit.source);
    switch (unit.action) {
      case Action::copy:
        plan.outputs.push_back({unit.source, ref->entry->type, ref->entry->shape});
        break;
      case Action::fp8_to_bf16:
        plan.outputs.push_back({unit.source, int4::ElementType::bfloat16, ref->entry->shape});
        break;
      case Action::quantize:
      case Action::convert:
        for (auto& out : quantized_outputs(options, unit.module, unit.k, unit.n, unit.group_size, unit.scale_type)) {
          plan.outputs.push_back(std::move(out));
        }
        break;
      case Action::quantize_experts:
        for (std::int64_t e = 0; e < unit.experts; ++e) {
          for (auto& out : quantized_outputs(options, unit.expert_module(e), unit.k, unit.n, unit.group_size,
                                             unit.scale_type)) {
            plan.outputs.push_back(std::move(out));
          }
        }
        break;
    }
  }
  return plan;
}

}  // namespace quantize_tool
