// Test helper for slimserve_quantize_int4 (run by CTest through run_tool_test.cmake):
//   tool_check write IN.safetensors          writes a small model-like file
//   tool_check verify IN OUT ct|gptq GROUP   checks the tool's output against IN: every
//                                            quantized weight imports back within scale/2 of
//                                            its source element; everything else is copied.

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "slimserve/int4/checkpoint_formats.hpp"
#include "slimserve/int4/quantize.hpp"
#include "slimserve/int4/safetensors.hpp"

namespace int4 = slimserve::int4;
using int4::ElementType;

namespace {

struct Source {
  std::string name;
  ElementType type;
  std::vector<std::int64_t> shape;
  bool quantized;  // what the tool is expected to do with it
};

const std::vector<Source> kSources = {
    {"model.embed_tokens.weight", ElementType::bfloat16, {50, 64}, false},   // skipped by name
    {"model.layers.0.self_attn.q_proj.weight", ElementType::float32, {64, 256}, true},
    {"model.layers.0.mlp.up_proj.weight", ElementType::bfloat16, {96, 128}, true},
    {"model.layers.0.mlp.fp8_proj.weight", ElementType::float8_e4m3, {136, 256}, true},
    {"model.layers.0.odd.weight", ElementType::float32, {16, 12}, false},    // K = 12
    {"model.norm.weight", ElementType::float32, {64}, false},                // 1-D
};

double e4m3_value(std::uint8_t bits) {
  const int e = (bits >> 3) & 15, m = bits & 7;
  const double magnitude = e == 0 ? m * std::ldexp(1.0, -9) : (8 + m) * std::ldexp(1.0, e - 10);
  return (bits & 0x80) ? -magnitude : magnitude;
}

/// Deterministic contents; `values` gets the real value of every element (FP8 scaled).
int4::Tensor make(const Source& source, std::vector<double>& values, int4::Tensor* block_scales) {
  std::mt19937 rng(static_cast<unsigned>(std::hash<std::string>{}(source.name)));
  std::normal_distribution<float> normal(0.0f, 0.05f);
  int4::Tensor t(source.type, source.shape);
  values.resize(static_cast<std::size_t>(t.numel()));
  const std::int64_t cols = source.shape.size() == 2 ? source.shape[1] : 1;
  if (block_scales) {
    *block_scales = int4::Tensor(ElementType::float32, {(source.shape[0] + 127) / 128, (cols + 127) / 128});
    for (std::int64_t i = 0; i < block_scales->numel(); ++i) block_scales->set(i, std::ldexp(1.0f, -6 - static_cast<int>(i)));
  }
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float v = normal(rng);
    switch (source.type) {
      case ElementType::float32: t.set(i, v); values[i] = v; break;
      case ElementType::bfloat16: {
        const auto bits = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(v) >> 16);
        t.set(i, bits);
        values[i] = std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
        break;
      }
      default: {
        auto bits = static_cast<std::uint8_t>(rng());
        if ((bits & 0x7F) == 0x7F) bits = 0x30;
        t.set(i, bits);
        values[i] = e4m3_value(bits) * block_scales->at<float>((i / cols / 128) * block_scales->shape[1] + (i % cols) / 128);
      }
    }
  }
  return t;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "tool_check: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  if (args.size() == 2 && args[0] == "write") {
    int4::SafetensorsWriter writer;
    writer.set_metadata("format", "pt");
    std::vector<double> values;
    for (const Source& source : kSources) {
      int4::Tensor scales;
      const bool fp8 = source.type == ElementType::float8_e4m3;
      const auto tensor = make(source, values, fp8 ? &scales : nullptr);
      if (!writer.add(source.name, tensor.view()).ok()) return fail("add " + source.name);
      if (fp8 && !writer.add(source.name + "_scale_inv", scales.view()).ok()) return fail("add scales");
    }
    const auto status = writer.write(std::string(args[1]));
    return status.ok() ? 0 : fail(status.to_string());
  }
  if (args.size() != 5 || args[0] != "verify") return fail("usage: tool_check write IN | verify IN OUT ct|gptq GROUP");
  const bool ct = args[3] == "ct";
  const std::int64_t group = std::stoll(std::string(args[4]));
  auto input = int4::SafetensorsFile::read(std::string(args[1]));
  auto output = int4::SafetensorsFile::read(std::string(args[2]));
  if (!input.ok() || !output.ok()) return fail("cannot read the files");
  if (!output->metadata().contains("quantization_config")) return fail("no quantization_config metadata");
  const std::string config = output->metadata().at("quantization_config");
  const bool symmetric = config.find("\"sym\":true") != std::string::npos;

  std::size_t checked = 0;
  for (const Source& source : kSources) {
    std::vector<double> values;
    int4::Tensor scales;
    make(source, values, source.type == ElementType::float8_e4m3 ? &scales : nullptr);
    if (!source.quantized) {
      auto in = input->tensor(source.name);
      auto out = output->tensor(source.name);
      if (!out.ok() || !std::equal(in->bytes.begin(), in->bytes.end(), out->bytes.begin(), out->bytes.end())) {
        return fail(source.name + " was not copied unchanged");
      }
      continue;
    }
    if (output->contains(source.name)) return fail(source.name + " was copied, not quantized");
    const std::string prefix = source.name.substr(0, source.name.size() - 7);  // drop ".weight"
    slimserve::Result<int4::QuantizedMatrix> matrix = slimserve::Status(slimserve::StatusCode::internal, "unset");
    if (ct) {
      int4::CompressedTensorsView view{*output->tensor(source.name + "_packed"), *output->tensor(source.name + "_scale"),
                                       {}, {}, *output->tensor(source.name + "_shape")};
      if (!symmetric) view.weight_zero_point = *output->tensor(source.name + "_zero_point");
      matrix = int4::import_compressed_tensors(view, {group, symmetric});
    } else {
      const bool v1 = config.find("\"checkpoint_format\":\"gptq\"") != std::string::npos;
      matrix = int4::import_gptq({*output->tensor(prefix + ".qweight"), *output->tensor(prefix + ".qzeros"),
                                  *output->tensor(prefix + ".scales"), *output->tensor(prefix + ".g_idx")},
                                 {group, false, symmetric, v1 ? int4::GptqZeroFormat::v1_minus_one : int4::GptqZeroFormat::v2_plain});
    }
    if (!matrix.ok()) return fail(source.name + ": " + matrix.status().to_string());
    const std::int64_t n = source.shape[0], k = source.shape[1];
    if (matrix->k != k || matrix->n != n) return fail(source.name + ": wrong shape");
    for (std::int64_t row = 0; row < n; ++row) {
      for (std::int64_t col = 0; col < k; ++col) {
        const double w = values[static_cast<std::size_t>(row * k + col)];
        const double deq = matrix->dequantized(col, row);
        const double scale = matrix->scales[static_cast<std::size_t>(matrix->group_of_row(col) * n + row)];
        if (std::fabs(w - deq) > 0.5 * scale * (1 + 1e-5)) {
          return fail(source.name + ": element [" + std::to_string(row) + ", " + std::to_string(col) + "] = " +
                      std::to_string(w) + " dequantizes to " + std::to_string(deq));
        }
      }
    }
    ++checked;
  }
  if (output->contains("model.layers.0.mlp.fp8_proj.weight_scale_inv")) return fail("FP8 block scales left behind");
  std::printf("tool_check: %zu quantized tensors within scale/2, copies unchanged\n", checked);
  return 0;
}
