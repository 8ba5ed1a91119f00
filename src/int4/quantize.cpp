// Host quantizer: float-like weights -> QuantizedMatrix (see quantize.hpp for the choices).
//
// Work is split into tiles of one group (rows along K) x up to kMaxTileCols columns. Each tile
// is first converted into a float scratch tile laid out [rows][tile_cols] whatever the source
// layout, so every inner loop below runs across columns with unit stride and vectorizes
// (per-column min/max, codes), and a packed output word (8 rows) never straddles two tiles.
// Threads pull tiles from an atomic counter; each writes disjoint words, scales and zeros.

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "element_convert.hpp"
#include "slimserve/int4/quantize.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {
namespace {

constexpr std::int64_t kMaxTileCols = 64;
constexpr std::int64_t kTargetTileElements = 64 * 128;  // 32 KiB of floats: stays in L1/L2

/// Everything the workers need, fixed before any thread starts.
struct QuantizePlan {
  const TensorView* weight = nullptr;
  WeightLayout layout = WeightLayout::k_by_n;
  std::int64_t k = 0, n = 0;
  std::int64_t group_rows = 0, num_groups = 0;
  std::int64_t tile_cols = 0, col_blocks = 0;
  bool symmetric = true;
  ClipSearch clip;
  ElementType scale_type = ElementType::float32;
  // FP8 only: decoded block scales [block_grid_rows, block_grid_cols] of the stored layout.
  std::vector<float> block_scale;
  std::int64_t block_rows = 0, block_cols = 0, block_grid_cols = 0;
};

struct GroupParams {
  float scale = 1.0f;
  float inverse_scale = 1.0f;
  float zero = 8.0f;
};

/// clamp(round-to-nearest-even(x * inverse_scale + zero), 0, 15) as an integer.
/// Adding 2^23 rounds to an integer in the (nearest-even) rounding mode; positive floats
/// order like their bit patterns, so subtracting the bits of 2^23 yields the rounded value
/// (negative below 0) and the clamp is an integer one. No float compares: GCC keeps
/// -ftrapping-math by default and will not if-convert (vectorize) float selects.
/// Multiplying by the reciprocal can only move a value within a few ulps of a tie.
inline std::int32_t round_code(float x, float inverse_scale, float zero) noexcept {
  const float shifted = x * inverse_scale + zero + 0x1p23f;
  std::int32_t q = std::bit_cast<std::int32_t>(shifted) - 0x4B000000;
  q = q < 0 ? 0 : q;
  return q > 15 ? 15 : q;
}

/// The smallest scale used: FLT_MIN (as rounded up to `scale_type`), so that 1 / scale stays
/// finite. A group whose range would need a smaller scale has all |w| <= 15 * FLT_MIN and
/// still fits the grid.
inline float smallest_scale(ElementType scale_type) noexcept {
  return detail::round_up_to(scale_type, std::numeric_limits<float>::min());
}

/// Scale and zero for a column whose (possibly shrunk) range is [lo, hi]. Returns a
/// non-finite scale when the scale does not fit `scale_type`.
inline GroupParams params_for_range(float lo, float hi, bool symmetric, ElementType scale_type) noexcept {
  GroupParams params;
  if (symmetric) {
    const float amax = std::max(-lo, hi);
    if (amax == 0.0f) return params;
    params.scale = detail::round_up_to(scale_type, amax / 7.0f);
  } else {
    lo = std::min(lo, 0.0f);
    hi = std::max(hi, 0.0f);
    if (hi == lo) return params;
    const float range = hi - lo;  // exact for grids; split only when it would overflow
    params.scale = detail::round_up_to(
        scale_type, std::isfinite(range) ? range / 15.0f : hi / 15.0f - lo / 15.0f);
  }
  params.scale = std::max(params.scale, smallest_scale(scale_type));  // NaN-free: scale >= 0 here
  params.inverse_scale = 1.0f / params.scale;
  if (!symmetric && std::isfinite(params.scale)) {
    params.zero = std::clamp(std::nearbyint(-lo / params.scale), 0.0f, 15.0f);
  }
  return params;
}

/// Multiplies a run of decoded FP8 values by their block scales: stored row `row`,
/// stored columns [col, col + count).
void apply_block_scales(const QuantizePlan& plan, std::int64_t row, std::int64_t col,
                        std::int64_t count, float* values) {
  const float* scale_row = plan.block_scale.data() + (row / plan.block_rows) * plan.block_grid_cols;
  std::int64_t i = 0;
  while (i < count) {
    const std::int64_t block = (col + i) / plan.block_cols;
    const std::int64_t end = std::min(count, (block + 1) * plan.block_cols - col);
    const float scale = scale_row[block];
    for (; i < end; ++i) values[i] *= scale;
  }
}

/// Fills tile[r * tile_cols + c] = W(k0 + r, n0 + c) for r < rows, c < cols.
void load_tile(const QuantizePlan& plan, std::int64_t k0, std::int64_t n0, std::int64_t rows,
               std::int64_t cols, float* tile, std::vector<float>& run_buffer) {
  const TensorView& weight = *plan.weight;
  const std::size_t element_bytes = element_size(weight.type);
  const bool block_scaled = !plan.block_scale.empty();
  if (plan.layout == WeightLayout::k_by_n) {
    for (std::int64_t r = 0; r < rows; ++r) {
      float* row = tile + r * plan.tile_cols;
      const std::int64_t offset = (k0 + r) * plan.n + n0;
      detail::decode_run(weight.type, weight.bytes.data() + offset * element_bytes, cols, row);
      if (block_scaled) apply_block_scales(plan, k0 + r, n0, cols, row);
    }
  } else {
    run_buffer.resize(static_cast<std::size_t>(rows));
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t offset = (n0 + c) * plan.k + k0;
      detail::decode_run(weight.type, weight.bytes.data() + offset * element_bytes, rows,
                         run_buffer.data());
      if (block_scaled) apply_block_scales(plan, n0 + c, k0, rows, run_buffer.data());
      for (std::int64_t r = 0; r < rows; ++r) tile[r * plan.tile_cols + c] = run_buffer[r];
    }
  }
}

/// Scale, reciprocal and zero of each column of a tile, one array each so the loops over
/// columns read them with unit stride.
struct ColumnParams {
  float scale[kMaxTileCols], inverse_scale[kMaxTileCols], zero[kMaxTileCols];
  void set(std::int64_t c, const GroupParams& params) noexcept {
    scale[c] = params.scale;
    inverse_scale[c] = params.inverse_scale;
    zero[c] = params.zero;
  }
};

/// Scratch memory owned by one worker thread.
struct Scratch {
  std::vector<float> tile, run_buffer;
  float lo[kMaxTileCols], hi[kMaxTileCols], best_error[kMaxTileCols], error[kMaxTileCols];
  ColumnParams best, trial;
};

/// Squared error of quantizing the tile's columns with `params`, into `error`.
void tile_error(const float* tile, std::int64_t rows, std::int64_t cols, std::int64_t stride,
                const ColumnParams& params, float* error) {
  for (std::int64_t c = 0; c < cols; ++c) error[c] = 0.0f;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = tile + r * stride;
    for (std::int64_t c = 0; c < cols; ++c) {
      const auto q = static_cast<float>(round_code(row[c], params.inverse_scale[c], params.zero[c]));
      const float diff = row[c] - (q - params.zero[c]) * params.scale[c];
      error[c] += diff * diff;
    }
  }
}

/// Quantizes one tile: group `group`, columns [n0, n0 + cols). Returns an error for a
/// non-finite weight or an unrepresentable scale; writes nothing of the tile then.
Status quantize_tile(const QuantizePlan& plan, std::int64_t group, std::int64_t n0,
                     Scratch& scratch, QuantizedMatrix& out) {
  const std::int64_t rows = plan.group_rows;
  const std::int64_t cols = std::min(plan.tile_cols, plan.n - n0);
  const std::int64_t k0 = group * rows;
  const std::int64_t stride = plan.tile_cols;
  float* tile = scratch.tile.data();
  load_tile(plan, k0, n0, rows, cols, tile, scratch.run_buffer);

  // Column ranges; x - x is non-zero (NaN) exactly for infinities and NaNs.
  float* lo = scratch.lo;
  float* hi = scratch.hi;
  for (std::int64_t c = 0; c < cols; ++c) lo[c] = hi[c] = tile[c];
  int non_finite = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = tile + r * stride;
    for (std::int64_t c = 0; c < cols; ++c) {
      non_finite |= (row[c] - row[c] != 0.0f);
      lo[c] = std::min(lo[c], row[c]);
      hi[c] = std::max(hi[c], row[c]);
    }
  }
  if (non_finite) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const float value = tile[r * stride + c];
        if (!std::isfinite(value)) {
          return make_status(StatusCode::invalid_argument, "weight (k=", k0 + r, ", n=", n0 + c,
                             ") is not finite (", value, ")");
        }
      }
    }
  }

  ColumnParams& best = scratch.best;
  for (std::int64_t c = 0; c < cols; ++c) {
    best.set(c, params_for_range(lo[c], hi[c], plan.symmetric, plan.scale_type));
    if (!std::isfinite(best.scale[c])) {
      return make_status(StatusCode::invalid_argument, "group ", group, " column ", n0 + c,
                         ": scale for range [", lo[c], ", ", hi[c], "] does not fit ",
                         safetensors_name(plan.scale_type), "; use float32 scales");
    }
  }
  if (plan.clip.steps > 0) {
    tile_error(tile, rows, cols, stride, best, scratch.best_error);
    const float step = (1.0f - plan.clip.min_shrink) / static_cast<float>(plan.clip.steps);
    for (int s = 1; s <= plan.clip.steps; ++s) {
      const float shrink = 1.0f - step * static_cast<float>(s);
      for (std::int64_t c = 0; c < cols; ++c) {
        scratch.trial.set(c, params_for_range(lo[c] * shrink, hi[c] * shrink, plan.symmetric,
                                              plan.scale_type));
      }
      tile_error(tile, rows, cols, stride, scratch.trial, scratch.error);
      for (std::int64_t c = 0; c < cols; ++c) {
        if (scratch.error[c] < scratch.best_error[c]) {
          scratch.best_error[c] = scratch.error[c];
          best.scale[c] = scratch.trial.scale[c];
          best.inverse_scale[c] = scratch.trial.inverse_scale[c];
          best.zero[c] = scratch.trial.zero[c];
        }
      }
    }
  }

  // Codes: 8 rows per packed word, nibble j = row 8w + j.
  const float* inverse_scale = best.inverse_scale;
  const float* zero = best.zero;
  for (std::int64_t r0 = 0; r0 < rows; r0 += 8) {
    const float* row = tile + r0 * stride;
    std::uint32_t* __restrict__ dst = out.codes.data() + ((k0 + r0) / 8) * plan.n + n0;
    for (std::int64_t c = 0; c < cols; ++c) {
      std::uint32_t word = 0;
      for (int j = 0; j < 8; ++j) {
        const auto q = static_cast<std::uint32_t>(round_code(row[j * stride + c], inverse_scale[c], zero[c]));
        word |= q << (4 * j);
      }
      dst[c] = word;
    }
  }
  for (std::int64_t c = 0; c < cols; ++c) {
    const auto index = static_cast<std::size_t>(group * plan.n + n0 + c);
    out.scales[index] = best.scale[c];
    out.zeros[index] = static_cast<std::uint8_t>(best.zero[c]);
  }
  return Status::success();
}

Status check_arguments(const TensorView& weight, WeightLayout layout, const QuantizeOptions& options,
                       const BlockScales* block_scales, QuantizePlan& plan) {
  if (weight.shape.size() != 2) {
    return make_status(StatusCode::invalid_argument, "quantize expects a 2-D weight, got ",
                       weight.shape.size(), " dimensions");
  }
  const bool fp8 = weight.type == ElementType::float8_e4m3;
  if (weight.type != ElementType::float32 && weight.type != ElementType::float16 &&
      weight.type != ElementType::bfloat16 && !fp8) {
    return make_status(StatusCode::invalid_argument, "quantize accepts F32, F16, BF16 or F8_E4M3 weights, got ",
                       safetensors_name(weight.type));
  }
  if (fp8 != (block_scales != nullptr)) {
    return make_status(StatusCode::invalid_argument,
                       fp8 ? "F8_E4M3 weights need their block scales"
                           : "block scales are only accepted with F8_E4M3 weights");
  }
  const std::int64_t rows = weight.shape[0], cols = weight.shape[1];
  plan.k = layout == WeightLayout::k_by_n ? rows : cols;
  plan.n = layout == WeightLayout::k_by_n ? cols : rows;
  if (plan.k <= 0 || plan.n <= 0) {
    return make_status(StatusCode::invalid_argument, "weight shape [", rows, ", ", cols, "] is empty");
  }
  if (weight.bytes.size() != static_cast<std::size_t>(rows * cols) * element_size(weight.type)) {
    return make_status(StatusCode::invalid_argument, "weight holds ", weight.bytes.size(),
                       " bytes, shape [", rows, ", ", cols, "] needs ",
                       static_cast<std::size_t>(rows * cols) * element_size(weight.type));
  }
  if (plan.k % 8 != 0) {
    return make_status(StatusCode::invalid_argument, "K = ", plan.k,
                       " (input features) must be a multiple of 8: 8 codes share a packed word");
  }
  plan.group_rows = options.group_size == kPerChannel ? plan.k : options.group_size;
  if (plan.group_rows < 0 || plan.group_rows % 8 != 0 || plan.k % plan.group_rows != 0) {
    return make_status(StatusCode::invalid_argument, "group size ", options.group_size,
                       " must be a positive multiple of 8 dividing K = ", plan.k,
                       " (or kPerChannel)");
  }
  if (options.scale_type != ElementType::float32 && options.scale_type != ElementType::float16 &&
      options.scale_type != ElementType::bfloat16) {
    return make_status(StatusCode::invalid_argument, "scale type must be F32, F16 or BF16, got ",
                       safetensors_name(options.scale_type));
  }
  if (options.clip.steps < 0 || (options.clip.steps > 0 && !(options.clip.min_shrink > 0.0f &&
                                                            options.clip.min_shrink < 1.0f))) {
    return make_status(StatusCode::invalid_argument, "clip search needs steps >= 0 and min_shrink in (0, 1), got steps ",
                       options.clip.steps, ", min_shrink ", options.clip.min_shrink);
  }
  if (options.num_threads < 0) {
    return make_status(StatusCode::invalid_argument, "num_threads must be >= 0, got ", options.num_threads);
  }
  plan.weight = &weight;
  plan.layout = layout;
  plan.num_groups = plan.k / plan.group_rows;
  plan.tile_cols = std::clamp(kTargetTileElements / plan.group_rows / 8 * 8, std::int64_t{8}, kMaxTileCols);
  plan.col_blocks = (plan.n + plan.tile_cols - 1) / plan.tile_cols;
  plan.symmetric = options.symmetric;
  plan.clip = options.clip;
  plan.scale_type = options.scale_type;

  if (fp8) {
    const TensorView& scales = block_scales->scales;
    if (block_scales->block_rows <= 0 || block_scales->block_cols <= 0) {
      return make_status(StatusCode::invalid_argument, "block size ", block_scales->block_rows, "x",
                         block_scales->block_cols, " must be positive");
    }
    plan.block_rows = block_scales->block_rows;
    plan.block_cols = block_scales->block_cols;
    const std::int64_t grid_rows = (rows + plan.block_rows - 1) / plan.block_rows;
    plan.block_grid_cols = (cols + plan.block_cols - 1) / plan.block_cols;
    if (scales.type != ElementType::float32 && scales.type != ElementType::bfloat16) {
      return make_status(StatusCode::invalid_argument, "block scales must be F32 or BF16, got ",
                         safetensors_name(scales.type));
    }
    if (scales.shape.size() != 2 || scales.shape[0] != grid_rows || scales.shape[1] != plan.block_grid_cols ||
        scales.bytes.size() != static_cast<std::size_t>(grid_rows * plan.block_grid_cols) * element_size(scales.type)) {
      return make_status(StatusCode::invalid_argument, "block scales for a [", rows, ", ", cols,
                         "] weight in ", plan.block_rows, "x", plan.block_cols, " blocks must be [",
                         grid_rows, ", ", plan.block_grid_cols, "]");
    }
    plan.block_scale.resize(static_cast<std::size_t>(grid_rows * plan.block_grid_cols));
    detail::decode_run(scales.type, scales.bytes.data(), scales.numel(), plan.block_scale.data());
    for (std::size_t i = 0; i < plan.block_scale.size(); ++i) {
      const float scale = plan.block_scale[i];
      if (!std::isfinite(scale) || !(scale > 0.0f)) {
        return make_status(StatusCode::invalid_argument, "block scale [", i / plan.block_grid_cols,
                           ", ", i % plan.block_grid_cols, "] must be finite and > 0, got ", scale);
      }
    }
  }
  return Status::success();
}

}  // namespace

Result<QuantizedMatrix> quantize(const TensorView& weight, WeightLayout layout,
                                 const QuantizeOptions& options, const BlockScales* block_scales) {
  QuantizePlan plan;
  SLIMSERVE_RETURN_IF_ERROR(check_arguments(weight, layout, options, block_scales, plan));

  QuantizedMatrix out;
  out.k = plan.k;
  out.n = plan.n;
  out.group_size = plan.group_rows;
  out.symmetric = plan.symmetric;
  out.codes.resize(static_cast<std::size_t>(plan.k / 8 * plan.n));
  out.scales.resize(static_cast<std::size_t>(plan.num_groups * plan.n));
  out.zeros.resize(out.scales.size());

  // Tiles in source order: group-major for [K, N] (rows contiguous), column-block-major
  // for [N, K], so consecutive tiles of one thread touch neighbouring memory.
  const std::int64_t num_tiles = plan.num_groups * plan.col_blocks;
  std::atomic<std::int64_t> next_tile{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  Status first_error;

  auto worker = [&] {
    Scratch scratch;
    scratch.tile.resize(static_cast<std::size_t>(plan.group_rows * plan.tile_cols));
    for (;;) {
      const std::int64_t t = next_tile.fetch_add(1, std::memory_order_relaxed);
      if (t >= num_tiles || failed.load(std::memory_order_relaxed)) return;
      const bool group_major = plan.layout == WeightLayout::k_by_n;
      const std::int64_t group = group_major ? t / plan.col_blocks : t % plan.num_groups;
      const std::int64_t block = group_major ? t % plan.col_blocks : t / plan.num_groups;
      Status status = quantize_tile(plan, group, block * plan.tile_cols, scratch, out);
      if (!status.ok()) {
        std::lock_guard lock(error_mutex);
        if (first_error.ok()) first_error = std::move(status);
        failed.store(true, std::memory_order_relaxed);
        return;
      }
    }
  };

  std::int64_t threads = options.num_threads > 0 ? options.num_threads
                                                 : std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, num_tiles);
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads - 1));
  for (std::int64_t i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& thread : pool) thread.join();
  if (!first_error.ok()) return first_error;
  return out;
}

Status validate(const QuantizedMatrix& m) {
  if (m.k <= 0 || m.n <= 0 || m.k % 8 != 0) {
    return make_status(StatusCode::invalid_argument, "quantized matrix shape K = ", m.k, ", N = ", m.n,
                       " needs K > 0, a multiple of 8, and N > 0");
  }
  if (m.group_size <= 0 || m.k % m.group_size != 0 || (m.group_size % 8 != 0 && m.group_size != m.k)) {
    return make_status(StatusCode::invalid_argument, "group size ", m.group_size,
                       " must divide K = ", m.k, " and be a multiple of 8");
  }
  const auto words = static_cast<std::size_t>(m.k / 8 * m.n);
  const auto params = static_cast<std::size_t>(m.num_groups() * m.n);
  if (m.codes.size() != words || m.scales.size() != params || m.zeros.size() != params) {
    return make_status(StatusCode::invalid_argument, "quantized matrix holds ", m.codes.size(), " code words, ",
                       m.scales.size(), " scales, ", m.zeros.size(), " zeros; K = ", m.k, ", N = ", m.n,
                       ", group ", m.group_size, " need ", words, ", ", params, ", ", params);
  }
  for (std::size_t i = 0; i < params; ++i) {
    if (!std::isfinite(m.scales[i]) || !(m.scales[i] > 0.0f)) {
      return make_status(StatusCode::invalid_argument, "scale (group ", i / m.n, ", column ", i % m.n,
                         ") must be finite and > 0, got ", m.scales[i]);
    }
    if (m.zeros[i] > 15 || (m.symmetric && m.zeros[i] != 8)) {
      return make_status(StatusCode::invalid_argument, "zero (group ", i / m.n, ", column ", i % m.n,
                         ") is ", int{m.zeros[i]}, m.symmetric ? "; symmetric needs 8" : "; must be 0..15");
    }
  }
  if (!m.row_group.empty()) {
    if (m.row_group.size() != static_cast<std::size_t>(m.k)) {
      return make_status(StatusCode::invalid_argument, "row_group has ", m.row_group.size(),
                         " entries, K = ", m.k);
    }
    for (std::size_t r = 0; r < m.row_group.size(); ++r) {
      if (m.row_group[r] < 0 || m.row_group[r] >= m.num_groups()) {
        return make_status(StatusCode::invalid_argument, "row_group[", r, "] = ", m.row_group[r],
                           " is outside [0, ", m.num_groups(), ")");
      }
    }
  }
  return Status::success();
}

std::vector<float> dequantize(const QuantizedMatrix& m) {
  std::vector<float> out(static_cast<std::size_t>(m.k * m.n));
  for (std::int64_t r = 0; r < m.k; ++r) {
    const std::int64_t group = m.group_of_row(r);
    const float* scales = m.scales.data() + group * m.n;
    const std::uint8_t* zeros = m.zeros.data() + group * m.n;
    const std::uint32_t* words = m.codes.data() + (r / 8) * m.n;
    const int shift = static_cast<int>(4 * (r % 8));
    float* dst = out.data() + r * m.n;
    for (std::int64_t c = 0; c < m.n; ++c) {
      const auto q = static_cast<float>((words[c] >> shift) & 0xFu);
      dst[c] = (q - static_cast<float>(zeros[c])) * scales[c];
    }
  }
  return out;
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
