// The code shown in docs/int4.md, compiled and run.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "slimserve/int4/checkpoint_formats.hpp"
#include "slimserve/int4/quantize.hpp"
#include "slimserve/int4/safetensors.hpp"
#include "support/random.hpp"

namespace int4 = slimserve::int4;

namespace {

// [docs-example-quantize]
// Quantize one nn.Linear weight ([N, K], BF16) read from a .safetensors file and store it in
// compressed-tensors pack-quantized form.
slimserve::Status quantize_layer(const std::string& in_path, const std::string& out_path) {
  auto file = int4::SafetensorsFile::read(in_path);
  if (!file.ok()) return file.status();
  auto weight = file->tensor("proj.weight");
  if (!weight.ok()) return weight.status();

  int4::QuantizeOptions options;
  options.group_size = 128;
  options.symmetric = false;
  options.clip.steps = 20;                             // search shrink factors 1 .. 0.5
  options.scale_type = int4::ElementType::bfloat16;    // the dtype the checkpoint stores
  auto matrix = int4::quantize(*weight, int4::WeightLayout::n_by_k, options);
  if (!matrix.ok()) return matrix.status();

  auto error = int4::measure_error(*weight, int4::WeightLayout::n_by_k, *matrix);
  if (!error.ok()) return error.status();
  std::printf("relative error %.4f\n", error->relative);

  auto packed = int4::export_compressed_tensors(*matrix, options.scale_type);
  if (!packed.ok()) return packed.status();
  int4::SafetensorsWriter writer;
  SLIMSERVE_RETURN_IF_ERROR(writer.add("proj.weight_packed", packed->weight_packed.view()));
  SLIMSERVE_RETURN_IF_ERROR(writer.add("proj.weight_scale", packed->weight_scale.view()));
  SLIMSERVE_RETURN_IF_ERROR(writer.add("proj.weight_zero_point", packed->weight_zero_point.view()));
  SLIMSERVE_RETURN_IF_ERROR(writer.add("proj.weight_shape", packed->weight_shape.view()));
  return writer.write(out_path);
}

// Load it back: the importer checks every tensor against the config and the others.
slimserve::Result<int4::QuantizedMatrix> load_layer(const std::string& path) {
  auto file = int4::SafetensorsFile::read(path);
  if (!file.ok()) return file.status();
  int4::CompressedTensorsView view{*file->tensor("proj.weight_packed"), *file->tensor("proj.weight_scale"),
                                   *file->tensor("proj.weight_zero_point"), std::nullopt,
                                   *file->tensor("proj.weight_shape")};
  return int4::import_compressed_tensors(view, {/*group_size=*/128, /*symmetric=*/false});
}
// [docs-example-quantize]

}  // namespace

TEST_CASE("docs example: quantize a layer to compressed-tensors and load it back", "[int4][docs]") {
  const std::int64_t n = 48, k = 256;
  auto rng = slimserve_test::make_rng(61);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  int4::Tensor weight(int4::ElementType::bfloat16, {n, k});
  std::vector<float> values(static_cast<std::size_t>(n * k));
  for (std::int64_t i = 0; i < n * k; ++i) {
    const auto bits = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(normal(rng)) >> 16);
    weight.set(i, bits);
    values[static_cast<std::size_t>(i)] = std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  const auto dir = std::filesystem::temp_directory_path();
  const std::string stem = "slimserve_int4_docs_" + std::to_string(slimserve_test::test_seed());
  const std::string in = (dir / (stem + "_in.safetensors")).string();
  const std::string out = (dir / (stem + "_out.safetensors")).string();
  int4::SafetensorsWriter writer;
  REQUIRE(writer.add("proj.weight", weight.view()).ok());
  REQUIRE(writer.write(in).ok());

  const auto status = quantize_layer(in, out);
  INFO(status.to_string());
  REQUIRE(status.ok());
  auto matrix = load_layer(out);
  std::filesystem::remove(in);
  std::filesystem::remove(out);
  REQUIRE(matrix.ok());
  REQUIRE(matrix->k == k);
  REQUIRE(matrix->n == n);
  // Clipping may move an element by more than scale/2, but never past the group's range.
  double err = 0, norm = 0;
  for (std::int64_t r = 0; r < k; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      const double d = values[static_cast<std::size_t>(c * k + r)] - matrix->dequantized(r, c);
      err += d * d;
      norm += static_cast<double>(values[static_cast<std::size_t>(c * k + r)]) * values[static_cast<std::size_t>(c * k + r)];
    }
  REQUIRE(std::sqrt(err / norm) < 0.12);
}
