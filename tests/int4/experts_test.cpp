// Stacked MoE expert tensors: each expert of a stacked [E, N, K] / [E, K, N] weight (and of a
// block-scaled FP8 one with stacked scales) quantizes exactly as the same expert stored as its
// own 2-D tensor, and so imports from a stacked packed checkpoint.

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "int4_test_util.hpp"
#include "slimserve/int4/checkpoint_formats.hpp"
#include "slimserve/int4/experts.hpp"
#include "slimserve/int4/quantize.hpp"
#include "support/random.hpp"

namespace int4 = slimserve::int4;
using slimserve::StatusCode;

namespace {

void require_same(const int4::QuantizedMatrix& a, const int4::QuantizedMatrix& b) {
  REQUIRE(a.k == b.k);
  REQUIRE(a.n == b.n);
  REQUIRE(a.group_size == b.group_size);
  REQUIRE(a.codes == b.codes);
  REQUIRE(a.scales == b.scales);
  REQUIRE(a.zeros == b.zeros);
}

/// Expert e of a stacked tensor copied into a tensor of its own (independent of expert_slice).
int4::Tensor copy_expert(const int4::Tensor& stacked, std::int64_t e) {
  int4::Tensor one(stacked.type, {stacked.shape[1], stacked.shape[2]});
  std::memcpy(one.bytes.data(), stacked.bytes.data() + static_cast<std::size_t>(e) * one.bytes.size(), one.bytes.size());
  return one;
}

}  // namespace

TEST_CASE("experts: stacked weights quantize per expert like separate tensors", "[int4][experts]") {
  auto rng = slimserve_test::make_rng(41);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t experts = 3, n = 24, k = 64;
  for (auto layout : {int4::WeightLayout::n_by_k, int4::WeightLayout::k_by_n}) {
    const std::int64_t rows = layout == int4::WeightLayout::n_by_k ? n : k;
    const std::int64_t cols = layout == int4::WeightLayout::n_by_k ? k : n;
    int4::Tensor stacked(int4::ElementType::float32, {experts, rows, cols});
    for (std::int64_t i = 0; i < stacked.numel(); ++i) {
      stacked.set(i, normal(rng) * static_cast<float>(1 + i / (rows * cols)));  // experts differ in range
    }
    int4::QuantizeOptions options;
    options.group_size = 32;
    options.symmetric = false;
    auto all = int4::quantize_experts(stacked.view(), layout, options);
    REQUIRE(all.ok());
    REQUIRE(all->size() == static_cast<std::size_t>(experts));
    for (std::int64_t e = 0; e < experts; ++e) {
      const int4::Tensor one = copy_expert(stacked, e);
      auto expected = int4::quantize(one.view(), layout, options);
      REQUIRE(expected.ok());
      require_same((*all)[static_cast<std::size_t>(e)], *expected);
      REQUIRE(expected->n == n);
    }
  }
}

TEST_CASE("experts: block-scaled FP8 experts use their own block scales", "[int4][experts]") {
  auto rng = slimserve_test::make_rng(42);
  const std::int64_t experts = 2, n = 136, k = 256;  // N spans a partial 128-row block
  int4::Tensor stacked(int4::ElementType::float8_e4m3, {experts, n, k});
  for (auto& b : stacked.bytes) {
    auto bits = static_cast<std::uint8_t>(rng());
    if ((bits & 0x7F) == 0x7F) bits = 0x31;  // no NaN
    b = static_cast<std::byte>(bits);
  }
  int4::Tensor scales(int4::ElementType::float32, {experts, 2, 2});
  for (std::int64_t i = 0; i < scales.numel(); ++i) scales.set(i, std::ldexp(1.0f, -3 - static_cast<int>(i)));
  const int4::BlockScales stacked_blocks{scales.view(), 128, 128};
  int4::QuantizeOptions options;
  options.group_size = 128;
  auto all = int4::quantize_experts(stacked.view(), int4::WeightLayout::n_by_k, options, &stacked_blocks);
  REQUIRE(all.ok());
  for (std::int64_t e = 0; e < experts; ++e) {
    const int4::Tensor one = copy_expert(stacked, e);
    const int4::Tensor one_scales = copy_expert(scales, e);
    const int4::BlockScales blocks{one_scales.view(), 128, 128};
    auto expected = int4::quantize(one.view(), int4::WeightLayout::n_by_k, options, &blocks);
    REQUIRE(expected.ok());
    require_same((*all)[static_cast<std::size_t>(e)], *expected);
    // And every element is within scale / 2 of fp8 x its expert's block scale.
    for (std::int64_t row = 0; row < n; ++row) {
      for (std::int64_t col = 0; col < k; ++col) {
        const double w = int4_test::e4m3_value(one.at<std::uint8_t>(row * k + col)) *
                         one_scales.at<float>((row / 128) * 2 + col / 128);
        const auto& m = (*all)[static_cast<std::size_t>(e)];
        const double scale = m.scales[static_cast<std::size_t>((col / 128) * n + row)];
        REQUIRE(std::fabs(w - m.dequantized(col, row)) <= scale / 2 * (1 + 1e-6));
      }
    }
  }
  // Scales stacked for a different number of experts are refused.
  int4::Tensor wrong(int4::ElementType::float32, {experts + 1, 2, 2});
  const int4::BlockScales wrong_blocks{wrong.view(), 128, 128};
  REQUIRE(int4::quantize_experts(stacked.view(), int4::WeightLayout::n_by_k, options, &wrong_blocks).status().code() ==
          StatusCode::invalid_argument);
}

TEST_CASE("experts: a stacked compressed-tensors checkpoint imports expert by expert", "[int4][experts]") {
  auto rng = slimserve_test::make_rng(43);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t experts = 2, n = 16, k = 64;
  int4::QuantizeOptions options;
  options.group_size = 32;
  options.scale_type = int4::ElementType::bfloat16;
  std::vector<int4::QuantizedMatrix> matrices;
  std::vector<int4::CompressedTensors> exported;
  for (std::int64_t e = 0; e < experts; ++e) {
    int4::Tensor w(int4::ElementType::float32, {n, k});
    for (std::int64_t i = 0; i < w.numel(); ++i) w.set(i, normal(rng));
    matrices.push_back(*int4::quantize(w.view(), int4::WeightLayout::n_by_k, options));
    exported.push_back(*int4::export_compressed_tensors(matrices.back(), int4::ElementType::bfloat16));
  }
  // Stack the exported per-expert tensors along a leading expert dimension.
  auto stack = [&](auto member) {
    const int4::Tensor& first = exported[0].*member;
    std::vector<std::int64_t> shape = {experts};
    shape.insert(shape.end(), first.shape.begin(), first.shape.end());
    int4::Tensor out(first.type, shape);
    for (std::int64_t e = 0; e < experts; ++e) {
      const int4::Tensor& part = exported[static_cast<std::size_t>(e)].*member;
      std::memcpy(out.bytes.data() + static_cast<std::size_t>(e) * part.bytes.size(), part.bytes.data(), part.bytes.size());
    }
    return out;
  };
  const int4::Tensor packed = stack(&int4::CompressedTensors::weight_packed);
  const int4::Tensor scale = stack(&int4::CompressedTensors::weight_scale);
  for (std::int64_t e = 0; e < experts; ++e) {
    auto packed_e = int4::expert_slice(packed.view(), e);
    auto scale_e = int4::expert_slice(scale.view(), e);
    REQUIRE(packed_e.ok());
    REQUIRE(scale_e.ok());
    auto imported = int4::import_compressed_tensors({*packed_e, *scale_e, std::nullopt, std::nullopt, std::nullopt},
                                                    {32, true});
    REQUIRE(imported.ok());
    require_same(*imported, matrices[static_cast<std::size_t>(e)]);
  }
  REQUIRE(int4::expert_slice(packed.view(), experts).status().code() == StatusCode::out_of_range);
  REQUIRE(int4::expert_slice(packed.view(), -1).status().code() == StatusCode::out_of_range);
  REQUIRE(int4::expert_slice(exported[0].weight_packed.view(), 0).status().code() == StatusCode::invalid_argument);
  int4::TensorView short_view = packed.view();
  short_view.bytes = short_view.bytes.first(short_view.bytes.size() - 4);
  REQUIRE(int4::expert_slice(short_view, 0).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("experts: stack_experts lays repacked experts end to end, or refuses with the expert",
          "[int4][experts]") {
  auto rng = slimserve_test::make_rng(43);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t experts = 3, n = 32, k = 64;
  for (const bool symmetric : {true, false}) {
    int4::Tensor stacked(int4::ElementType::float32, {experts, n, k});
    for (std::int64_t i = 0; i < stacked.numel(); ++i) stacked.set(i, normal(rng));
    int4::QuantizeOptions options;
    options.group_size = 32;
    options.symmetric = symmetric;
    auto quantized = int4::quantize_experts(stacked.view(), int4::WeightLayout::n_by_k, options);
    REQUIRE(quantized.ok());
    std::vector<int4::GemmWeights> repacked;
    for (const auto& matrix : *quantized) {
      auto one = int4::repack_for_gemm(matrix, int4::ActivationType::bf16);
      REQUIRE(one.ok());
      repacked.push_back(std::move(one).value());
    }
    auto all = int4::stack_experts(repacked);
    REQUIRE(all.ok());
    REQUIRE(all->num_experts == experts);
    REQUIRE(all->k == k);
    REQUIRE(all->n == n);
    REQUIRE(all->group_size == 32);
    REQUIRE(all->zeros.empty() == symmetric);
    const std::size_t words = repacked[0].packed.size(), scales = repacked[0].scales.size();
    REQUIRE(all->packed.size() == words * experts);
    REQUIRE(all->scales.size() == scales * experts);
    REQUIRE(all->zeros.size() == (symmetric ? 0 : scales * experts));
    for (std::size_t e = 0; e < static_cast<std::size_t>(experts); ++e) {  // expert e at e * size
      const auto& w = repacked[e];
      REQUIRE(std::equal(w.packed.begin(), w.packed.end(), all->packed.begin() + static_cast<std::ptrdiff_t>(e * words)));
      REQUIRE(std::equal(w.scales.begin(), w.scales.end(), all->scales.begin() + static_cast<std::ptrdiff_t>(e * scales)));
      if (!symmetric) {
        REQUIRE(std::equal(w.zeros.begin(), w.zeros.end(), all->zeros.begin() + static_cast<std::ptrdiff_t>(e * scales)));
      }
    }
  }

  // Refusals: nothing to stack, another shape, another symmetry, act-order, a short array.
  CHECK(int4::stack_experts({}).status().code() == StatusCode::invalid_argument);
  int4::Tensor stacked(int4::ElementType::float32, {2, n, k});
  for (std::int64_t i = 0; i < stacked.numel(); ++i) stacked.set(i, normal(rng));
  int4::QuantizeOptions options;
  options.group_size = 32;
  auto quantized = int4::quantize_experts(stacked.view(), int4::WeightLayout::n_by_k, options);
  REQUIRE(quantized.ok());
  auto a = int4::repack_for_gemm((*quantized)[0], int4::ActivationType::bf16);
  auto b = int4::repack_for_gemm((*quantized)[1], int4::ActivationType::bf16);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto refused = [&](int4::GemmWeights second, StatusCode code, const char* words) {
    const std::vector<int4::GemmWeights> pair{*a, std::move(second)};
    auto result = int4::stack_experts(pair);
    REQUIRE_FALSE(result.ok());
    CHECK(result.status().code() == code);
    CHECK_THAT(result.status().to_string(), Catch::Contains("expert 1") && Catch::Contains(words));
  };
  int4::GemmWeights wider = *b;
  wider.n = 2 * n;
  refused(wider, StatusCode::invalid_argument, "differs from expert 0");
  int4::GemmWeights with_zeros = *b;
  with_zeros.zeros.assign(b->scales.size(), 0);
  refused(with_zeros, StatusCode::invalid_argument, "symmetry");
  int4::GemmWeights act_order = *b;
  act_order.k_order.resize(static_cast<std::size_t>(k));
  refused(act_order, StatusCode::unsupported, "act-order");
  int4::GemmWeights short_scales = *b;
  short_scales.scales.pop_back();
  refused(short_scales, StatusCode::invalid_argument, "its shape needs");
  const std::vector<int4::GemmWeights> good{*a, *b};
  CHECK(int4::stack_experts(good).ok());
}
