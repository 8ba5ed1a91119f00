// Demo: what FP8 buys for the KV cache on real model shapes, and what it costs in accuracy.
#include <fmt/core.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "slimserve/formats/convert.hpp"
#include "slimserve/formats/scale.hpp"

namespace {

using slimserve::bf16;
using slimserve::fp8_e4m3;
using slimserve::fp8_e5m2;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// One way of storing a model's KV cache: bytes per token and layer.
struct KvVariant {
  std::string_view format;
  double bytes_per_layer;
};

struct KvModel {
  std::string_view name;
  std::string_view layout;
  int layers;
  std::vector<KvVariant> variants;  // the first is the BF16 baseline
};

void print_capacity(double budget_gib) {
  // GQA: K and V, 8 KV heads x 128 channels each. Scales are FP32.
  constexpr double gqa_elements = 2.0 * 8 * 128;
  constexpr double gqa_head_vectors = 2.0 * 8;
  // MLA: one compressed latent (512) plus a decoupled RoPE key (64) per token.
  const KvModel models[] = {
      {"Llama-3-70B-like (GQA)", "80 layers x (K, V) x 8 KV heads x head_dim 128", 80,
       {{"BF16", gqa_elements * 2},
        {"FP8, per-tensor scale", gqa_elements * 1},
        {"FP8, scale per token and head", gqa_elements * 1 + gqa_head_vectors * 4}}},
      {"Kimi-K2-like (MLA)", "61 layers x (512 latent + 64 RoPE)", 61,
       {{"BF16", (512 + 64) * 2.0},
        {"FP8, per-tensor scale", (512 + 64) * 1.0},
        {"FP8 latent (4 group scales) + BF16 RoPE", 512 * 1.0 + 4 * 4 + 64 * 2}}},
  };
  fmt::print("KV cache: bytes per token and tokens that fit in {:.0f} GiB\n", budget_gib);
  for (const KvModel& model : models) {
    fmt::print("  {}: {}\n", model.name, model.layout);
    const double baseline = model.variants.front().bytes_per_layer * model.layers;
    for (const KvVariant& variant : model.variants) {
      const double bytes = variant.bytes_per_layer * model.layers;
      const double tokens = std::floor(budget_gib * kGiB / bytes);
      fmt::print("    {:<42} {:>9.0f} B/token {:>12.0f} tokens {:>6.2f}x\n", variant.format,
                 bytes, tokens, baseline / bytes);
    }
  }
}

struct ErrorStats {
  double relative_rms;
  double max_abs;
};

ErrorStats error_of(std::span<const float> reference, std::span<const float> approx) {
  double error_sq = 0.0, reference_sq = 0.0, max_abs = 0.0;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    const double e = static_cast<double>(approx[i]) - static_cast<double>(reference[i]);
    error_sq += e * e;
    reference_sq += static_cast<double>(reference[i]) * static_cast<double>(reference[i]);
    max_abs = std::fmax(max_abs, std::fabs(e));
  }
  return {std::sqrt(error_sq / reference_sq), max_abs};
}

/// Quantizes with one scale per row (rows of `row_length`; row_length = size: per tensor)
/// and returns the dequantized values.
template <class Format>
std::vector<float> round_trip(std::span<const float> x, std::size_t row_length, bool& ok) {
  const std::size_t rows = x.size() / row_length;
  std::vector<float> scales(rows);
  ok = slimserve::row_scales(x, row_length, slimserve::format_traits<Format>::max_finite,
                             std::span<float>(scales)).ok();
  std::vector<Format> q(row_length);
  std::vector<float> back(x.size());
  for (std::size_t r = 0; ok && r < rows; ++r) {
    const auto row = x.subspan(r * row_length, row_length);
    ok = slimserve::quantize(row, std::span<Format>(q), scales[r]).ok() &&
         slimserve::dequantize(std::span<const Format>(q),
                               std::span<float>(back).subspan(r * row_length, row_length),
                               scales[r]).ok();
  }
  return back;
}

bool print_quantization_error() {
  // [tokens, channels] activations: standard normal, with a few outlier channels 40x larger
  // (the pattern seen in K projections); a fixed seed keeps the printout reproducible.
  constexpr std::size_t tokens = 4096, channels = 128;
  constexpr std::size_t outlier_channels[] = {3, 61, 97};
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(tokens * channels);
  for (float& v : x) v = normal(rng);
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t c : outlier_channels) x[t * channels + c] *= 40.0f;
  }
  const std::span<const float> values(x);

  fmt::print("\nQuantization error on N(0,1) data [{} tokens x {} channels], channels 3, 61, 97 "
             "scaled 40x:\n", tokens, channels);
  fmt::print("  {:<34} {:>14} {:>12}\n", "format (scaling)", "relative RMS", "max |error|");
  bool ok = true;
  const auto report = [&](std::string_view label, const std::vector<float>& approx, bool step_ok) {
    ok = ok && step_ok;
    const ErrorStats stats = error_of(values, approx);
    fmt::print("  {:<34} {:>14.3e} {:>12.4f}\n", label, stats.relative_rms, stats.max_abs);
  };
  bool step_ok = true;
  std::vector<bf16> as_bf16(x.size());
  std::vector<float> bf16_back(x.size());
  step_ok = slimserve::quantize(values, std::span<bf16>(as_bf16)).ok() &&
            slimserve::dequantize(std::span<const bf16>(as_bf16), std::span<float>(bf16_back)).ok();
  report("BF16 (no scale)", bf16_back, step_ok);
  report("FP8 e4m3 (per-tensor scale)", round_trip<fp8_e4m3>(values, x.size(), step_ok), step_ok);
  report("FP8 e4m3 (per-token scale)", round_trip<fp8_e4m3>(values, channels, step_ok), step_ok);
  report("FP8 e5m2 (per-tensor scale)", round_trip<fp8_e5m2>(values, x.size(), step_ok), step_ok);
  report("FP8 e5m2 (per-token scale)", round_trip<fp8_e5m2>(values, channels, step_ok), step_ok);
  return ok;
}

}  // namespace

int demo_formats() {
  fmt::print("== Numeric formats ==\n");
  print_capacity(80.0);
  if (!print_quantization_error()) {
    fmt::print("quantization failed\n");
    return 1;
  }
  return 0;
}
