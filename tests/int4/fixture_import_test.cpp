// Imports checkpoints written by the formats' own Python packages (AutoAWQ's WQLinear_GEMM,
// compressed-tensors' PackedQuantizationCompressor; see fixtures/make_fixtures.py) from real
// .safetensors files, and compares every dequantized element with the package's own
// dequantization stored beside them.

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <string>

#include "slimserve/int4/checkpoint_formats.hpp"
#include "slimserve/int4/quantize.hpp"
#include "slimserve/int4/safetensors.hpp"

namespace int4 = slimserve::int4;

namespace {

int4::SafetensorsFile open_fixture(const char* name) {
  auto file = int4::SafetensorsFile::read(
      (std::filesystem::path(SLIMSERVE_INT4_FIXTURE_DIR) / name).string());
  INFO(file.status().to_string());
  REQUIRE(file.ok());
  return std::move(file).value();
}

int4::TensorView get(const int4::SafetensorsFile& file, const char* name) {
  auto view = file.tensor(name);
  INFO(view.status().to_string());
  REQUIRE(view.ok());
  return *view;
}

/// reference.dequantized is F32 [K, N]; `relative` is the rounding of the package's own
/// dequantization arithmetic (FP16 for AWQ, exact for compressed-tensors with F32 scales).
void require_reference(const int4::SafetensorsFile& file, const int4::QuantizedMatrix& m, float relative) {
  REQUIRE(int4::validate(m).ok());
  const auto reference = get(file, "reference.dequantized");
  REQUIRE(reference.shape == std::vector<std::int64_t>{m.k, m.n});
  for (std::int64_t r = 0; r < m.k; ++r)
    for (std::int64_t c = 0; c < m.n; ++c) {
      const float expected = reference.at<float>(r * m.n + c);
      const float got = m.dequantized(r, c);
      INFO("k=" << r << " n=" << c << " expected " << expected << " got " << got);
      REQUIRE(std::fabs(got - expected) <= relative * std::fabs(got));
    }
}

}  // namespace

TEST_CASE("fixtures: AutoAWQ GEMM checkpoint", "[int4][fixtures]") {
  const auto file = open_fixture("awq_g32.safetensors");
  REQUIRE(file.metadata().at("group_size") == "32");
  auto m = int4::import_awq({get(file, "layer.qweight"), get(file, "layer.qzeros"), get(file, "layer.scales")}, 32);
  INFO(m.status().to_string());
  REQUIRE(m.ok());
  require_reference(file, *m, 0x1p-11f);  // AutoAWQ dequantizes in FP16
  auto back = int4::export_awq(*m);
  REQUIRE(back.ok());
  const auto qweight = get(file, "layer.qweight");
  REQUIRE(std::equal(qweight.bytes.begin(), qweight.bytes.end(), back->qweight.bytes.begin(), back->qweight.bytes.end()));
}

TEST_CASE("fixtures: compressed-tensors pack-quantized, symmetric and asymmetric", "[int4][fixtures]") {
  for (const char* name : {"ct_sym_g32.safetensors", "ct_asym_g32.safetensors"}) {
    INFO(name);
    const auto file = open_fixture(name);
    const bool symmetric = file.metadata().at("symmetric") == "true";
    int4::CompressedTensorsView view{get(file, "layer.weight_packed"), get(file, "layer.weight_scale"), {}, {},
                                     get(file, "layer.weight_shape")};
    if (file.contains("layer.weight_zero_point")) view.weight_zero_point = get(file, "layer.weight_zero_point");
    REQUIRE(file.contains("layer.weight_zero_point") == !symmetric);
    auto m = int4::import_compressed_tensors(view, {32, symmetric});
    INFO(m.status().to_string());
    REQUIRE(m.ok());
    require_reference(file, *m, 0.0f);
    auto back = int4::export_compressed_tensors(*m, int4::ElementType::float32);
    REQUIRE(back.ok());
    const auto packed = get(file, "layer.weight_packed");
    REQUIRE(std::equal(packed.bytes.begin(), packed.bytes.end(), back->weight_packed.bytes.begin(),
                       back->weight_packed.bytes.end()));
    if (!symmetric) {
      const auto zp = *view.weight_zero_point;
      REQUIRE(std::equal(zp.bytes.begin(), zp.bytes.end(), back->weight_zero_point.bytes.begin(),
                         back->weight_zero_point.bytes.end()));
    }
  }
}

TEST_CASE("fixtures: AutoGPTQ v1 checkpoints, symmetric and act-order asymmetric", "[int4][fixtures]") {
  for (const char* name : {"gptq_v1_sym_g32.safetensors", "gptq_v1_actorder_asym_g32.safetensors"}) {
    INFO(name);
    const auto file = open_fixture(name);
    REQUIRE(file.metadata().at("checkpoint_format") == "gptq");
    const bool symmetric = file.metadata().at("sym") == "true";
    const bool act_order = file.metadata().at("desc_act") == "true";
    const int4::GptqTensorView view{get(file, "layer.qweight"), get(file, "layer.qzeros"), get(file, "layer.scales"),
                                    get(file, "layer.g_idx")};
    auto m = int4::import_gptq(view, {32, act_order, symmetric, int4::GptqZeroFormat::v1_minus_one});
    INFO(m.status().to_string());
    REQUIRE(m.ok());
    REQUIRE(m->row_group.empty() == !act_order);
    require_reference(file, *m, 0.0f);
    // The same file read with the v2 convention contradicts its own "sym" (zeros 7, not 8).
    if (symmetric) {
      REQUIRE(int4::import_gptq(view, {32, act_order, true, int4::GptqZeroFormat::v2_plain}).status().code() ==
              slimserve::StatusCode::data_loss);
    }
    // Act-order g_idx read as if desc_act were false is refused, not silently regrouped.
    if (act_order) {
      REQUIRE(int4::import_gptq(view, {32, false, symmetric, int4::GptqZeroFormat::v1_minus_one}).status().code() ==
              slimserve::StatusCode::data_loss);
    }
    auto back = int4::export_gptq(*m, int4::GptqZeroFormat::v1_minus_one, int4::ElementType::float32);
    REQUIRE(back.ok());
    for (const auto& [stored, exported] : {std::pair{view.qweight, back->qweight.view()}, std::pair{view.qzeros, back->qzeros.view()},
                                           std::pair{*view.g_idx, back->g_idx.view()}}) {
      REQUIRE(std::equal(stored.bytes.begin(), stored.bytes.end(), exported.bytes.begin(), exported.bytes.end()));
    }
  }
}
