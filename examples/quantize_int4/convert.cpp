#include "convert.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/int4/checkpoint_formats.hpp"
#include "slimserve/int4/experts.hpp"
#include "slimserve/int4/quantize.hpp"

namespace int4 = slimserve::int4;
namespace fs = std::filesystem;
using slimserve::make_status;
using slimserve::Status;
using slimserve::StatusCode;

namespace quantize_tool {
namespace {

constexpr std::uint64_t kCopyChunkBytes = 64u << 20;

slimserve::Result<int4::Tensor> read_tensor(const ModelFolder& model, const std::string& name) {
  const TensorRef* ref = model.find(name);
  if (!ref) return make_status(StatusCode::data_loss, "tensor '", name, "' is missing");
  return ref->file->read(*ref->entry);
}

/// Expert `expert` of a stacked tensor, read on its own: [rows, cols].
slimserve::Result<int4::Tensor> read_expert(const ModelFolder& model, const std::string& name, std::int64_t expert) {
  const TensorRef* ref = model.find(name);
  const auto& shape = ref->entry->shape;
  int4::Tensor slice(ref->entry->type, {shape[1], shape[2]});
  SLIMSERVE_RETURN_IF_ERROR(
      ref->file->read_bytes(*ref->entry, static_cast<std::uint64_t>(expert) * slice.bytes.size(), slice.bytes));
  return slice;
}

Status write_matrix(const Options& options, const std::string& module, const int4::QuantizedMatrix& matrix,
                    int4::ElementType scale_type, OutputShards& out) {
  if (options.format == OutputFormat::compressed_tensors) {
    auto ct = int4::export_compressed_tensors(matrix, scale_type);
    if (!ct.ok()) return ct.status();
    SLIMSERVE_RETURN_IF_ERROR(out.write(module + ".weight_packed", ct->weight_packed.bytes));
    SLIMSERVE_RETURN_IF_ERROR(out.write(module + ".weight_scale", ct->weight_scale.bytes));
    if (ct->has_zero_point) SLIMSERVE_RETURN_IF_ERROR(out.write(module + ".weight_zero_point", ct->weight_zero_point.bytes));
    return out.write(module + ".weight_shape", ct->weight_shape.bytes);
  }
  const auto zero_format =
      options.format == OutputFormat::gptq_v1 ? int4::GptqZeroFormat::v1_minus_one : int4::GptqZeroFormat::v2_plain;
  auto gptq = int4::export_gptq(matrix, zero_format, scale_type);
  if (!gptq.ok()) return gptq.status();
  SLIMSERVE_RETURN_IF_ERROR(out.write(module + ".qweight", gptq->qweight.bytes));
  SLIMSERVE_RETURN_IF_ERROR(out.write(module + ".qzeros", gptq->qzeros.bytes));
  SLIMSERVE_RETURN_IF_ERROR(out.write(module + ".scales", gptq->scales.bytes));
  return out.write(module + ".g_idx", gptq->g_idx.bytes);
}

int4::QuantizeOptions quantize_options(const Options& options, const Unit& unit, int threads) {
  int4::QuantizeOptions quantize = options.quantize;
  quantize.group_size = unit.group_size;
  quantize.scale_type = unit.scale_type;
  quantize.num_threads = threads;
  return quantize;
}

void record_error(ErrorStats* errors, const std::string& module, const int4::TensorView& weight,
                  int4::WeightLayout layout, const int4::QuantizedMatrix& matrix, const int4::BlockScales* blocks) {
  if (!errors) return;
  auto error = int4::measure_error(weight, layout, matrix, blocks);
  if (!error.ok()) return;
  std::lock_guard lock(errors->mutex);
  errors->sum_relative += error->relative;
  errors->max_relative = std::max(errors->max_relative, error->relative);
  ++errors->count;
  std::printf("%-64s K=%-6lld N=%-6lld rel.err %.4e max.err %.4e\n", module.c_str(), static_cast<long long>(matrix.k),
              static_cast<long long>(matrix.n), error->relative, error->max_abs);
}

Status quantize_one(const ModelFolder& model, const Options& options, const Unit& unit, std::int64_t expert,
                    int threads, OutputShards& out, ErrorStats* errors) {
  const bool stacked = unit.action == Action::quantize_experts;
  auto weight = stacked ? read_expert(model, unit.source, expert) : read_tensor(model, unit.source);
  if (!weight.ok()) return weight.status();
  std::optional<int4::Tensor> scale_tensor;
  std::optional<int4::BlockScales> blocks;
  if (unit.block_scales) {
    auto scales = read_tensor(model, *unit.block_scales);  // small: one scale per 128 x 128 block
    if (!scales.ok()) return scales.status();
    scale_tensor = std::move(*scales);
    const auto& source = model.source_quantization();
    int4::BlockScales all{scale_tensor->view(), source.block_rows, source.block_cols};
    if (stacked) {
      auto one = int4::expert_block_scales(all, expert);
      if (!one.ok()) return one.status();
      blocks = *one;
    } else {
      blocks = all;
    }
  }
  const std::string module = stacked ? unit.expert_module(expert) : unit.module;
  auto matrix = int4::quantize(weight->view(), unit.layout, quantize_options(options, unit, threads),
                               blocks ? &*blocks : nullptr);
  if (!matrix.ok()) return matrix.status();
  record_error(errors, module, weight->view(), unit.layout, *matrix, blocks ? &*blocks : nullptr);
  return write_matrix(options, module, *matrix, unit.scale_type, out);
}

slimserve::Result<int4::QuantizedMatrix> import_module(const ModelFolder& model, const std::string& module) {
  const auto& source = model.source_quantization();
  auto optional_tensor = [&](const std::string& name) -> slimserve::Result<std::optional<int4::Tensor>> {
    if (!model.find(name)) return std::optional<int4::Tensor>();
    auto tensor = read_tensor(model, name);
    if (!tensor.ok()) return tensor.status();
    return std::optional<int4::Tensor>(std::move(*tensor));
  };
  switch (source.kind) {
    case SourceQuantization::Kind::gptq: {
      auto qweight = read_tensor(model, module + ".qweight");
      auto qzeros = read_tensor(model, module + ".qzeros");
      auto scales = read_tensor(model, module + ".scales");
      auto g_idx = optional_tensor(module + ".g_idx");
      if (!qweight.ok()) return qweight.status();
      if (!qzeros.ok()) return qzeros.status();
      if (!scales.ok()) return scales.status();
      if (!g_idx.ok()) return g_idx.status();
      int4::GptqTensorView view{qweight->view(), qzeros->view(), scales->view(), std::nullopt};
      if (*g_idx) view.g_idx = (*g_idx)->view();
      return int4::import_gptq(view, {source.group_size, source.desc_act, source.symmetric, source.gptq_zero_format});
    }
    case SourceQuantization::Kind::awq: {
      auto qweight = read_tensor(model, module + ".qweight");
      auto qzeros = read_tensor(model, module + ".qzeros");
      auto scales = read_tensor(model, module + ".scales");
      if (!qweight.ok()) return qweight.status();
      if (!qzeros.ok()) return qzeros.status();
      if (!scales.ok()) return scales.status();
      return int4::import_awq({qweight->view(), qzeros->view(), scales->view()}, source.group_size);
    }
    case SourceQuantization::Kind::compressed_tensors: {
      auto packed = read_tensor(model, module + ".weight_packed");
      auto scale = read_tensor(model, module + ".weight_scale");
      auto zero = optional_tensor(module + ".weight_zero_point");
      auto g_idx = optional_tensor(module + ".weight_g_idx");
      auto shape = optional_tensor(module + ".weight_shape");
      if (!packed.ok()) return packed.status();
      if (!scale.ok()) return scale.status();
      if (!zero.ok()) return zero.status();
      if (!g_idx.ok()) return g_idx.status();
      if (!shape.ok()) return shape.status();
      int4::CompressedTensorsView view{packed->view(), scale->view(), std::nullopt, std::nullopt, std::nullopt};
      if (*zero) view.weight_zero_point = (*zero)->view();
      if (*g_idx) view.weight_g_idx = (*g_idx)->view();
      if (*shape) view.weight_shape = (*shape)->view();
      return int4::import_compressed_tensors(view, {source.group_size, source.symmetric});
    }
    default:
      return make_status(StatusCode::internal, "module '", module, "' is not INT4 in the source");
  }
}

/// Re-packs without loss when the scheme is unchanged; otherwise dequantizes and quantizes again.
Status convert_one(const ModelFolder& model, const Options& options, const Unit& unit, int threads, OutputShards& out,
                   ErrorStats* errors) {
  auto matrix = import_module(model, unit.module);
  if (!matrix.ok()) return matrix.status();
  const bool same_grid = matrix->group_size == unit.group_size && matrix->row_group.empty() &&
                         (matrix->symmetric == options.quantize.symmetric || matrix->symmetric);
  if (same_grid) {
    matrix->symmetric = options.quantize.symmetric;  // a symmetric grid is an asymmetric one with zeros 8
    return write_matrix(options, unit.module, *matrix, unit.scale_type, out);
  }
  const std::vector<float> values = int4::dequantize(*matrix);  // [K, N]
  const int4::TensorView view{int4::ElementType::float32, {matrix->k, matrix->n}, std::as_bytes(std::span(values))};
  auto requantized = int4::quantize(view, int4::WeightLayout::k_by_n, quantize_options(options, unit, threads));
  if (!requantized.ok()) return requantized.status();
  record_error(errors, unit.module, view, int4::WeightLayout::k_by_n, *requantized, nullptr);
  return write_matrix(options, unit.module, *requantized, unit.scale_type, out);
}

/// FP8 x block scale -> BF16, for FP8 weights left unquantized (2-D, or stacked 3-D).
Status fp8_to_bf16(const ModelFolder& model, const Unit& unit, OutputShards& out) {
  auto weight = read_tensor(model, unit.source);
  auto scales = read_tensor(model, *unit.block_scales);
  if (!weight.ok()) return weight.status();
  if (!scales.ok()) return scales.status();
  const auto& source = model.source_quantization();
  const auto& shape = weight->shape;
  const std::int64_t experts = shape.size() == 3 ? shape[0] : 1;
  const std::int64_t rows = shape[shape.size() - 2], cols = shape.back();
  const std::int64_t row_blocks = (rows + source.block_rows - 1) / source.block_rows;
  const std::int64_t col_blocks = (cols + source.block_cols - 1) / source.block_cols;
  if (scales->numel() != experts * row_blocks * col_blocks ||
      (scales->type != int4::ElementType::float32 && scales->type != int4::ElementType::bfloat16)) {
    return make_status(StatusCode::data_loss, "'", *unit.block_scales, "' does not hold F32/BF16 scales for ",
                       experts * row_blocks * col_blocks, " blocks");
  }
  int4::Tensor result(int4::ElementType::bfloat16, shape);
  for (std::int64_t e = 0; e < experts; ++e) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t s = (e * row_blocks + r / source.block_rows) * col_blocks + c / source.block_cols;
        const float scale = scales->type == int4::ElementType::float32
                                ? scales->at<float>(s)
                                : slimserve::to_float(slimserve::bf16::from_bits(scales->at<std::uint16_t>(s)));
        const std::int64_t i = (e * rows + r) * cols + c;
        const float value = slimserve::to_float(slimserve::fp8_e4m3::from_bits(weight->at<std::uint8_t>(i))) * scale;
        result.set<std::uint16_t>(i, slimserve::from_float<slimserve::bf16>(value).bits);
      }
    }
  }
  return out.write(unit.source, result.bytes);
}

Status copy_one(const ModelFolder& model, const Unit& unit, OutputShards& out) {
  const TensorRef* ref = model.find(unit.source);
  const std::uint64_t size = ref->entry->end - ref->entry->begin;
  std::vector<std::byte> chunk(static_cast<std::size_t>(std::min(size, kCopyChunkBytes)));
  for (std::uint64_t offset = 0; offset < size; offset += chunk.size()) {
    const std::span<std::byte> part(chunk.data(), static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), size - offset)));
    SLIMSERVE_RETURN_IF_ERROR(ref->file->read_bytes(*ref->entry, offset, part));
    SLIMSERVE_RETURN_IF_ERROR(out.write(unit.source, part, offset));
  }
  if (size == 0) SLIMSERVE_RETURN_IF_ERROR(out.write(unit.source, {}));
  return Status::success();
}

}  // namespace

slimserve::Result<std::unique_ptr<OutputShards>> OutputShards::create(
    const std::string& folder, const std::vector<int4::SafetensorsStreamWriter::Planned>& outputs,
    std::uint64_t max_bytes) {
  std::vector<std::vector<int4::SafetensorsStreamWriter::Planned>> groups(1);
  std::uint64_t in_group = 0, total = 0;
  for (const auto& tensor : outputs) {
    if (in_group > 0 && in_group + tensor.bytes() > max_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(tensor);
    in_group += tensor.bytes();
    total += tensor.bytes();
  }
  auto shards = std::make_unique<OutputShards>();
  shards->total_bytes_ = total;
  const std::size_t count = groups.size();
  for (std::size_t i = 0; i < count; ++i) {
    char name[64];
    if (count == 1) {
      std::snprintf(name, sizeof name, "model.safetensors");
    } else {
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, count);
    }
    for (const auto& tensor : groups[i]) shards->shard_of_[tensor.name] = i;
    auto writer = int4::SafetensorsStreamWriter::create((fs::path(folder) / name).string(), groups[i],
                                                        {{"format", "pt"}});
    if (!writer.ok()) return writer.status();
    shards->shards_.push_back(std::make_unique<int4::SafetensorsStreamWriter>(std::move(*writer)));
    shards->files_.emplace_back(name);
  }
  return shards;
}

Status OutputShards::write(const std::string& name, std::span<const std::byte> bytes, std::uint64_t offset) {
  const auto found = shard_of_.find(name);
  if (found == shard_of_.end()) return make_status(StatusCode::internal, "output tensor '", name, "' was not planned");
  return shards_[found->second]->write(name, bytes, offset);
}

Status OutputShards::finish() {
  for (auto& shard : shards_) SLIMSERVE_RETURN_IF_ERROR(shard->finish());
  return Status::success();
}

std::map<std::string, std::string> OutputShards::weight_map() const {
  std::map<std::string, std::string> map;
  if (files_.size() > 1) {
    for (const auto& [name, shard] : shard_of_) map[name] = files_[shard];
  }
  return map;
}

Status run_unit(const ModelFolder& model, const Options& options, const Unit& unit, std::int64_t expert, int threads,
                OutputShards& out, ErrorStats* errors) {
  Status status = Status::success();
  switch (unit.action) {
    case Action::copy: status = copy_one(model, unit, out); break;
    case Action::fp8_to_bf16: status = fp8_to_bf16(model, unit, out); break;
    case Action::quantize:
    case Action::quantize_experts: status = quantize_one(model, options, unit, expert, threads, out, errors); break;
    case Action::convert: status = convert_one(model, options, unit, threads, out, errors); break;
  }
  if (status.ok()) return status;
  std::string where = unit.action == Action::quantize_experts ? unit.source + " (expert " + std::to_string(expert) + ")"
                                                              : unit.source;
  return slimserve::Status(status.code(), where + ": " + std::string(status.message()));
}

}  // namespace quantize_tool
