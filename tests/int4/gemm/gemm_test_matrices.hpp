#pragma once
// Random quantized matrices for the GEMM tests (host only).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/int4/quantized_matrix.hpp"

namespace slimserve_test {

struct MatrixSpec {
  std::int64_t k;
  std::int64_t n;
  std::int64_t group_size;  // k for per-channel
  bool symmetric;
  bool act_order = false;
  slimserve::int4::ActivationType activation = slimserve::int4::ActivationType::bf16;
};

/// Codes, zeros and scales drawn at random; scales are exactly representable in the
/// activation type (so pack/unpack round-trips compare exactly) and spread over a few octaves.
inline slimserve::int4::QuantizedMatrix random_quantized_matrix(const MatrixSpec& spec,
                                                               std::mt19937_64& rng) {
  using namespace slimserve::int4;
  QuantizedMatrix m;
  m.k = spec.k;
  m.n = spec.n;
  m.group_size = spec.group_size;
  m.symmetric = spec.symmetric;
  std::uniform_int_distribution<std::uint32_t> word(0, 0xFFFFFFFFu);
  m.codes.resize(static_cast<std::size_t>(spec.k / 8 * spec.n));
  for (auto& w : m.codes) w = word(rng);
  const auto scale_count = static_cast<std::size_t>(m.num_groups() * spec.n);
  std::uniform_real_distribution<float> log_scale(-9.0f, -3.0f);
  m.scales.resize(scale_count);
  for (auto& s : m.scales) {
    s = activation_to_float(spec.activation,
                            to_activation_bits(spec.activation, std::exp2(log_scale(rng))));
  }
  std::uniform_int_distribution<int> zero(0, 15);
  m.zeros.resize(scale_count);
  for (auto& z : m.zeros) z = static_cast<std::uint8_t>(spec.symmetric ? 8 : zero(rng));
  if (spec.act_order) {
    m.row_group.resize(static_cast<std::size_t>(spec.k));
    for (std::int64_t row = 0; row < spec.k; ++row) {
      m.row_group[static_cast<std::size_t>(row)] = static_cast<std::int32_t>(row / spec.group_size);
    }
    std::shuffle(m.row_group.begin(), m.row_group.end(), rng);
  }
  return m;
}

}  // namespace slimserve_test
