// Host repacking between the interchange form (QuantizedMatrix) and the GEMM kernel's layout.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "slimserve/int4/gemm_layout.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {
namespace {

std::size_t as_size(std::int64_t value) { return static_cast<std::size_t>(value); }

// Below this many codes per thread, starting threads costs more than it saves.
constexpr std::int64_t min_codes_per_thread = std::int64_t{1} << 20;

// For each (lane, nibble) of a tile: which of the tile's 32 plain words holds the code
// (index = (k / 8) * 16 + n: two words of 8 rows per column) and at which bit.
struct PlainSource {
  std::uint8_t word;
  std::uint8_t shift;
};
constexpr std::array<PlainSource, 256> make_plain_sources() {
  std::array<PlainSource, 256> table{};
  for (int lane = 0; lane < gemm_layout::words_per_tile; ++lane) {
    for (int nibble = 0; nibble < gemm_layout::codes_per_word; ++nibble) {
      const gemm_layout::TileCoord at = gemm_layout::code_position(lane, nibble);
      table[static_cast<std::size_t>(lane * 8 + nibble)] =
          PlainSource{static_cast<std::uint8_t>((at.k / 8) * 16 + at.n),
                      static_cast<std::uint8_t>(4 * (at.k % 8))};
    }
  }
  return table;
}
constexpr std::array<PlainSource, 256> plain_sources = make_plain_sources();

// One 16x16 tile without act-order: load its 32 plain words once, emit its 32 packed words.
void pack_tile(const std::uint32_t* codes, std::int64_t n, std::int64_t tile_row,
               std::int64_t tile_col, std::uint32_t* packed) {
  std::uint32_t plain[32];
  for (int half = 0; half < 2; ++half) {
    const std::uint32_t* row = codes + (tile_row * 2 + half) * n + tile_col * gemm_layout::tile_n;
    for (int col = 0; col < gemm_layout::tile_n; ++col) plain[half * 16 + col] = row[col];
  }
  for (int lane = 0; lane < gemm_layout::words_per_tile; ++lane) {
    std::uint32_t word = 0;
    for (int nibble = 0; nibble < gemm_layout::codes_per_word; ++nibble) {
      const PlainSource from = plain_sources[static_cast<std::size_t>(lane * 8 + nibble)];
      word |= ((plain[from.word] >> from.shift) & 0xFu) << (4 * nibble);
    }
    packed[lane] = word;
  }
}

Status check_group_size(std::int64_t k, std::int64_t group_size) {
  if (!gemm_layout::supported_group_size(k, group_size)) {
    return make_status(StatusCode::unsupported, "group_size ", group_size,
                       " with k = ", k,
                       ": the GEMM needs a power of two >= 16 that divides k, or k itself "
                       "(per-channel)");
  }
  return {};
}

// Act-order: rows sorted by group, stably. Every group must have exactly group_size rows so
// that, in the sorted order, row i belongs to group i / group_size.
Result<std::vector<std::int32_t>> act_order_rows(const QuantizedMatrix& matrix) {
  const std::int64_t groups = matrix.num_groups();
  std::vector<std::int64_t> count(as_size(groups), 0);
  for (std::int64_t row = 0; row < matrix.k; ++row) {
    const std::int32_t group = matrix.row_group[as_size(row)];
    if (group < 0 || group >= groups) {
      return make_status(StatusCode::out_of_range, "row_group[", row, "] = ", group,
                         " is outside 0..", groups - 1);
    }
    ++count[as_size(group)];
  }
  for (std::int64_t group = 0; group < groups; ++group) {
    if (count[as_size(group)] != matrix.group_size) {
      return make_status(StatusCode::unsupported, "act-order group ", group, " has ",
                         count[as_size(group)], " rows; the GEMM needs exactly group_size = ",
                         matrix.group_size, " rows per group");
    }
  }
  std::vector<std::int32_t> order(as_size(matrix.k));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return matrix.row_group[as_size(a)] < matrix.row_group[as_size(b)];
  });
  return order;
}

}  // namespace

Status check_gemm_compatible(const QuantizedMatrix& matrix) {
  const std::int64_t k = matrix.k;
  const std::int64_t n = matrix.n;
  if (k <= 0 || n <= 0 || k % gemm_layout::tile_k != 0 || n % gemm_layout::tile_n != 0) {
    return make_status(StatusCode::unsupported, "weight shape k = ", k, ", n = ", n,
                       ": the GEMM layout needs k and n to be positive multiples of 16");
  }
  SLIMSERVE_RETURN_IF_ERROR(check_group_size(k, matrix.group_size));
  const std::size_t groups = as_size(matrix.num_groups());
  if (matrix.codes.size() != as_size(k / 8 * n)) {
    return make_status(StatusCode::invalid_argument, "codes has ", matrix.codes.size(),
                       " words; [k/8, n] needs ", k / 8 * n);
  }
  if (matrix.scales.size() != groups * as_size(n)) {
    return make_status(StatusCode::invalid_argument, "scales has ", matrix.scales.size(),
                       " entries; [k/group_size, n] needs ", groups * as_size(n));
  }
  const bool zeros_empty_symmetric = matrix.symmetric && matrix.zeros.empty();
  if (!zeros_empty_symmetric && matrix.zeros.size() != groups * as_size(n)) {
    return make_status(StatusCode::invalid_argument, "zeros has ", matrix.zeros.size(),
                       " entries; [k/group_size, n] needs ", groups * as_size(n));
  }
  for (std::size_t i = 0; i < matrix.scales.size(); ++i) {
    const float scale = matrix.scales[i];
    if (!std::isfinite(scale) || !(scale > 0.0f)) {
      return make_status(StatusCode::invalid_argument, "scale ", i, " (group ",
                         i / as_size(n), ", column ", i % as_size(n), ") is ", scale,
                         "; scales must be finite and > 0");
    }
  }
  for (std::size_t i = 0; i < matrix.zeros.size(); ++i) {
    const unsigned zero = matrix.zeros[i];
    if (zero > 15 || (matrix.symmetric && zero != gemm_layout::symmetric_zero)) {
      return make_status(StatusCode::invalid_argument, "zero point ", i, " is ", zero,
                         matrix.symmetric ? "; symmetric weights store 8" : "; zeros are 0..15");
    }
  }
  if (!matrix.row_group.empty()) {
    if (matrix.row_group.size() != as_size(k)) {
      return make_status(StatusCode::invalid_argument, "row_group has ",
                         matrix.row_group.size(), " entries; k = ", k);
    }
    Result<std::vector<std::int32_t>> order = act_order_rows(matrix);
    if (!order.ok()) return order.status();
  }
  return {};
}

Result<GemmWeights> repack_for_gemm(const QuantizedMatrix& matrix, ActivationType activation) {
  SLIMSERVE_RETURN_IF_ERROR(check_gemm_compatible(matrix));
  GemmWeights out;
  out.k = matrix.k;
  out.n = matrix.n;
  out.group_size = matrix.group_size;
  out.activation = activation;
  if (!matrix.row_group.empty()) {
    Result<std::vector<std::int32_t>> order = act_order_rows(matrix);
    if (!order.ok()) return order.status();
    out.k_order = std::move(order).value();
  }

  const std::int64_t k = matrix.k;
  const std::int64_t n = matrix.n;
  out.packed.assign(as_size(k / 8 * n), 0u);
  // One output word at a time: each gathers its 8 codes (the packed order is the kernel's).
  // Tile rows are independent: split them over threads.
  const std::int64_t tile_rows = k / gemm_layout::tile_k;
  auto pack_tile_rows = [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t tile_row = first; tile_row < last; ++tile_row) {
      for (std::int64_t tile_col = 0; tile_col < n / gemm_layout::tile_n; ++tile_col) {
        if (out.k_order.empty()) {
          pack_tile(matrix.codes.data(), n, tile_row, tile_col,
                    &out.packed[as_size(gemm_layout::packed_word_index(tile_row, tile_col, 0, n))]);
          continue;
        }
        for (int lane = 0; lane < gemm_layout::words_per_tile; ++lane) {  // act-order: gather rows
          std::uint32_t word = 0;
          for (int nibble = 0; nibble < gemm_layout::codes_per_word; ++nibble) {
            const gemm_layout::TileCoord at = gemm_layout::code_position(lane, nibble);
            const std::int64_t row = out.k_order[as_size(tile_row * gemm_layout::tile_k + at.k)];
            word |= matrix.code(row, tile_col * gemm_layout::tile_n + at.n) << (4 * nibble);
          }
          out.packed[as_size(gemm_layout::packed_word_index(tile_row, tile_col, lane, n))] = word;
        }
      }
    }
  };
  const std::int64_t workers = std::clamp<std::int64_t>(
      std::min<std::int64_t>(static_cast<std::int64_t>(std::thread::hardware_concurrency()),
                             k * n / min_codes_per_thread),
      1, tile_rows);
  std::vector<std::thread> threads;
  for (std::int64_t w = 1; w < workers; ++w) {
    threads.emplace_back(pack_tile_rows, tile_rows * w / workers, tile_rows * (w + 1) / workers);
  }
  pack_tile_rows(0, tile_rows / workers);
  for (std::thread& thread : threads) thread.join();

  out.scales.resize(matrix.scales.size());
  for (std::size_t i = 0; i < matrix.scales.size(); ++i) {
    out.scales[i] = to_activation_bits(activation, matrix.scales[i]);
  }
  if (!matrix.symmetric) {
    out.zeros.resize(matrix.zeros.size());
    for (std::size_t i = 0; i < matrix.zeros.size(); ++i) {
      out.zeros[i] = to_activation_bits(activation, static_cast<float>(matrix.zeros[i]));
    }
  }
  return out;
}

Result<QuantizedMatrix> unpack_from_gemm(const GemmWeights& weights) {
  const std::int64_t k = weights.k;
  const std::int64_t n = weights.n;
  if (k <= 0 || n <= 0 || k % gemm_layout::tile_k != 0 || n % gemm_layout::tile_n != 0) {
    return make_status(StatusCode::invalid_argument, "packed shape k = ", k, ", n = ", n,
                       " is not a positive multiple of 16");
  }
  SLIMSERVE_RETURN_IF_ERROR(check_group_size(k, weights.group_size));
  const std::size_t scale_count = as_size(weights.num_groups() * n);
  if (weights.packed.size() != as_size(k / 8 * n) || weights.scales.size() != scale_count ||
      (!weights.zeros.empty() && weights.zeros.size() != scale_count) ||
      (!weights.k_order.empty() && weights.k_order.size() != as_size(k))) {
    return make_status(StatusCode::invalid_argument,
                       "packed weights have inconsistent buffer sizes for k = ", k, ", n = ", n);
  }
  QuantizedMatrix out;
  out.k = k;
  out.n = n;
  out.group_size = weights.group_size;
  out.symmetric = weights.zeros.empty();
  out.codes.assign(as_size(k / 8 * n), 0u);
  for (std::int64_t packed_row = 0; packed_row < k; ++packed_row) {
    const std::int64_t row =
        weights.k_order.empty() ? packed_row : weights.k_order[as_size(packed_row)];
    if (row < 0 || row >= k) {
      return make_status(StatusCode::out_of_range, "k_order[", packed_row, "] = ", row);
    }
    for (std::int64_t col = 0; col < n; ++col) {
      const gemm_layout::CodeAddress from = gemm_layout::code_address(packed_row, col, n);
      const std::uint32_t code = (weights.packed[as_size(from.word)] >> (4 * from.nibble)) & 0xFu;
      out.codes[as_size((row / 8) * n + col)] |= code << (4 * (row % 8));
    }
  }
  out.scales.resize(scale_count);
  out.zeros.assign(scale_count, static_cast<std::uint8_t>(gemm_layout::symmetric_zero));
  for (std::size_t i = 0; i < scale_count; ++i) {
    out.scales[i] = activation_to_float(weights.activation, weights.scales[i]);
    if (!weights.zeros.empty()) {
      const float zero = activation_to_float(weights.activation, weights.zeros[i]);
      if (!(zero >= 0.0f && zero <= 15.0f) || zero != std::floor(zero)) {
        return make_status(StatusCode::data_loss, "zero point ", i, " is ", zero,
                           "; expected an integer 0..15");
      }
      out.zeros[i] = static_cast<std::uint8_t>(zero);
    }
  }
  if (!weights.k_order.empty()) {
    out.row_group.resize(as_size(k));
    for (std::int64_t packed_row = 0; packed_row < k; ++packed_row) {
      out.row_group[as_size(weights.k_order[as_size(packed_row)])] =
          static_cast<std::int32_t>(packed_row / weights.group_size);
    }
  }
  return out;
}

}  // namespace int4
SLIMSERVE_NAMESPACE_END
