// Host quantizer: error bounds, exact grids, source types and layouts, threads, clipping,
// and the errors for bad input.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "int4_test_util.hpp"
#include "slimserve/int4/quantize.hpp"
#include "support/random.hpp"

namespace int4 = slimserve::int4;
using int4::ElementType;
using int4::WeightLayout;
using int4_test::make_tensor;

namespace {

/// Random weights with a per-column magnitude and a per-column offset, so asymmetric groups
/// are really asymmetric; a few outliers so clipping has something to do.
std::vector<float> random_weights(std::int64_t k, std::int64_t n, std::uint64_t salt) {
  auto rng = slimserve_test::make_rng(salt);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> magnitude(0.01f, 2.0f);
  std::vector<float> column_scale(static_cast<std::size_t>(n)), column_offset(column_scale.size());
  for (auto& s : column_scale) s = magnitude(rng);
  for (auto& o : column_offset) o = 0.5f * normal(rng);
  std::vector<float> w(static_cast<std::size_t>(k * n));
  for (std::int64_t r = 0; r < k; ++r) {
    for (std::int64_t c = 0; c < n; ++c) {
      float v = normal(rng) * column_scale[c] + column_offset[c] * column_scale[c];
      if (rng() % 97 == 0) v *= 6.0f;  // outlier
      w[r * n + c] = v;
    }
  }
  return w;
}

std::vector<float> transpose(const std::vector<float>& w, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(w.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) t[c * rows + r] = w[r * cols + c];
  return t;
}

void require_same(const int4::QuantizedMatrix& a, const int4::QuantizedMatrix& b) {
  REQUIRE(a.k == b.k);
  REQUIRE(a.n == b.n);
  REQUIRE(a.group_size == b.group_size);
  REQUIRE(a.symmetric == b.symmetric);
  REQUIRE(a.codes == b.codes);
  REQUIRE(a.zeros == b.zeros);
  REQUIRE(a.row_group == b.row_group);
  REQUIRE(a.scales.size() == b.scales.size());
  for (std::size_t i = 0; i < a.scales.size(); ++i) {
    INFO("scale " << i);
    REQUIRE(std::bit_cast<std::uint32_t>(a.scales[i]) == std::bit_cast<std::uint32_t>(b.scales[i]));
  }
}

/// Every element within scale / 2 of its dequantized value (no clipping), dequantize()
/// agreeing with the matrix's own accessor, and every zero 8 when symmetric.
void require_rtn_bound(const std::vector<float>& w, const int4::QuantizedMatrix& q) {
  REQUIRE(int4::validate(q).ok());
  const std::vector<float> deq = int4::dequantize(q);
  // Every element is checked; only a failing one goes through a (slow) Catch assertion.
  for (std::int64_t r = 0; r < q.k; ++r) {
    for (std::int64_t c = 0; c < q.n; ++c) {
      const auto i = static_cast<std::size_t>(r * q.n + c);
      const auto g = static_cast<std::size_t>(q.group_of_row(r) * q.n + c);
      const bool ok = deq[i] == q.dequantized(r, c) &&
                      std::fabs(w[i] - deq[i]) <= 0.5f * q.scales[g] * (1.0f + 1e-5f) &&
                      (!q.symmetric || q.zeros[g] == 8);
      if (ok) continue;
      INFO("k=" << r << " n=" << c << " w=" << w[i] << " deq=" << deq[i] << " scale=" << q.scales[g]
                << " zero=" << int{q.zeros[g]});
      REQUIRE(deq[i] == q.dequantized(r, c));
      REQUIRE(std::fabs(w[i] - deq[i]) <= 0.5f * q.scales[g] * (1.0f + 1e-5f));
      REQUIRE((!q.symmetric || q.zeros[g] == 8));
    }
  }
}

double squared_error(const std::vector<float>& w, const int4::QuantizedMatrix& q, std::int64_t group,
                     std::int64_t col) {
  double sum = 0;
  for (std::int64_t r = group * q.group_size; r < (group + 1) * q.group_size; ++r) {
    const double d = static_cast<double>(w[r * q.n + col]) - q.dequantized(r, col);
    sum += d * d;
  }
  return sum;
}

}  // namespace

TEST_CASE("quantize: every element within scale/2, both layouts, all group sizes", "[int4][quantize]") {
  const std::int64_t k = 256;
  const std::int64_t n = GENERATE(as<std::int64_t>{}, 1, 7, 64, 65, 130);
  const std::int64_t group = GENERATE(as<std::int64_t>{}, 0, 32, 64, 128);
  const bool symmetric = GENERATE(true, false);
  CAPTURE(n, group, symmetric);
  const auto w = random_weights(k, n, 1);
  int4::QuantizeOptions options;
  options.group_size = group;
  options.symmetric = symmetric;
  options.num_threads = 2;

  const auto kn = make_tensor(ElementType::float32, {k, n}, w);
  auto q = int4::quantize(kn.view(), WeightLayout::k_by_n, options);
  REQUIRE(q.ok());
  REQUIRE(q->k == k);
  REQUIRE(q->n == n);
  REQUIRE(q->group_size == (group == int4::kPerChannel ? k : group));
  require_rtn_bound(w, *q);

  // The same weights stored [N, K] (nn.Linear) give the identical result.
  const auto nk = make_tensor(ElementType::float32, {n, k}, transpose(w, k, n));
  auto q_nk = int4::quantize(nk.view(), WeightLayout::n_by_k, options);
  REQUIRE(q_nk.ok());
  require_same(*q, *q_nk);
}

TEST_CASE("quantize: representable grids are reproduced exactly", "[int4][quantize]") {
  const std::int64_t k = 128, n = 24;
  const std::int64_t group = GENERATE(as<std::int64_t>{}, 32, 128);
  const bool symmetric = GENERATE(true, false);
  CAPTURE(group, symmetric);
  auto rng = slimserve_test::make_rng(2);
  const std::int64_t groups = k / group;
  std::vector<float> scale(static_cast<std::size_t>(groups * n));
  std::vector<int> zero(scale.size());
  for (std::size_t i = 0; i < scale.size(); ++i) {
    scale[i] = std::ldexp(static_cast<float>(1 + rng() % 200), -static_cast<int>(rng() % 12) - 4);
    zero[i] = symmetric ? 8 : static_cast<int>(rng() % 16);
  }
  std::vector<std::uint32_t> code(static_cast<std::size_t>(k * n));
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t c = 0; c < n; ++c) {
      for (std::int64_t r = g * group; r < (g + 1) * group; ++r) {
        code[r * n + c] = symmetric ? 1 + static_cast<std::uint32_t>(rng() % 15) : static_cast<std::uint32_t>(rng() % 16);
      }
      // Pin the extremes the quantizer derives its scale from.
      const std::int64_t r0 = g * group + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(group / 2));
      code[r0 * n + c] = symmetric ? (rng() % 2 ? 1u : 15u) : 0u;
      code[(r0 + group / 2) * n + c] = symmetric ? code[r0 * n + c] : 15u;
    }
  }
  std::vector<float> w(code.size());
  for (std::int64_t r = 0; r < k; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      const auto g = static_cast<std::size_t>((r / group) * n + c);
      w[r * n + c] = (static_cast<float>(code[r * n + c]) - static_cast<float>(zero[g])) * scale[g];
    }

  int4::QuantizeOptions options;
  options.group_size = group;
  options.symmetric = symmetric;
  const auto tensor = make_tensor(ElementType::float32, {k, n}, w);
  auto q = int4::quantize(tensor.view(), WeightLayout::k_by_n, options);
  REQUIRE(q.ok());
  for (std::int64_t r = 0; r < k; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      INFO("k=" << r << " n=" << c);
      REQUIRE(q->code(r, c) == code[r * n + c]);
    }
  for (std::size_t i = 0; i < scale.size(); ++i) {
    INFO("group/column " << i);
    REQUIRE(q->scales[i] == scale[i]);
    REQUIRE(int{q->zeros[i]} == zero[i]);
  }
}

TEST_CASE("quantize: BF16, FP16 and block-scaled FP8 sources match the same values in FP32", "[int4][quantize]") {
  const std::int64_t k = 256, n = 160;  // FP8 blocks: 2 x 2 along K (stored cols), ragged along N
  auto rng = slimserve_test::make_rng(3);
  const auto layout = GENERATE(WeightLayout::k_by_n, WeightLayout::n_by_k);
  const bool symmetric = GENERATE(true, false);
  const std::int64_t rows = layout == WeightLayout::k_by_n ? k : n;
  const std::int64_t cols = layout == WeightLayout::k_by_n ? n : k;
  int4::QuantizeOptions options;
  options.group_size = 64;
  options.symmetric = symmetric;
  options.num_threads = 3;
  auto reference = [&](const std::vector<float>& values) {
    const auto f32 = make_tensor(ElementType::float32, {rows, cols}, values);
    auto q = int4::quantize(f32.view(), layout, options);
    REQUIRE(q.ok());
    require_rtn_bound(layout == WeightLayout::k_by_n ? values : transpose(values, rows, cols), *q);
    return std::move(q).value();
  };

  SECTION("bf16") {
    std::vector<float> values(static_cast<std::size_t>(rows * cols));
    std::vector<std::uint16_t> bits(values.size());
    std::normal_distribution<float> normal(0.0f, 0.05f);
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(normal(rng)) & 0xFFFF0000u);
      bits[i] = int4_test::exact_bf16_bits(values[i]);
    }
    const auto source = make_tensor(ElementType::bfloat16, {rows, cols}, bits);
    auto q = int4::quantize(source.view(), layout, options);
    REQUIRE(q.ok());
    require_same(*q, reference(values));
  }
  SECTION("fp16") {
    std::vector<float> values(static_cast<std::size_t>(rows * cols));
    std::vector<std::uint16_t> bits(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      const int mantissa = static_cast<int>(rng() % 2048) - 1024;  // 11 significant bits
      // Mostly normals; one column block of subnormal halves (2^-24 units).
      const bool tiny = (i % static_cast<std::size_t>(cols)) < 8;
      values[i] = std::ldexp(static_cast<float>(mantissa), tiny ? -24 : -10 - static_cast<int>(rng() % 4));
      bits[i] = int4_test::exact_fp16_bits(values[i]);
    }
    const auto source = make_tensor(ElementType::float16, {rows, cols}, bits);
    auto q = int4::quantize(source.view(), layout, options);
    REQUIRE(q.ok());
    require_same(*q, reference(values));
  }
  SECTION("fp8 e4m3 with 128x128 block scales") {
    const std::int64_t grid_rows = (rows + 127) / 128, grid_cols = (cols + 127) / 128;
    std::vector<float> block(static_cast<std::size_t>(grid_rows * grid_cols));
    for (auto& s : block) s = std::ldexp(1.0f + static_cast<float>(rng() % 8) / 8.0f, -static_cast<int>(rng() % 10));
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(rows * cols));
    std::vector<float> values(bytes.size());
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        std::uint8_t b;
        do b = static_cast<std::uint8_t>(rng()); while ((b & 0x7F) == 0x7F);  // skip NaN
        bytes[r * cols + c] = b;
        values[r * cols + c] = static_cast<float>(int4_test::e4m3_value(b) * block[(r / 128) * grid_cols + c / 128]);
      }
    const auto source = make_tensor(ElementType::float8_e4m3, {rows, cols}, bytes);
    const auto scales = make_tensor(ElementType::float32, {grid_rows, grid_cols}, block);
    const int4::BlockScales block_scales{scales.view(), 128, 128};
    auto q = int4::quantize(source.view(), layout, options, &block_scales);
    REQUIRE(q.ok());
    require_same(*q, reference(values));
  }
}

TEST_CASE("quantize: thread count does not change the result", "[int4][quantize]") {
  const std::int64_t k = 512, n = 200;
  const auto w = random_weights(k, n, 4);
  const auto tensor = make_tensor(ElementType::float32, {k, n}, w);
  int4::QuantizeOptions options;
  options.group_size = 32;
  options.symmetric = false;
  options.clip.steps = 4;
  options.num_threads = 1;
  auto one = int4::quantize(tensor.view(), WeightLayout::k_by_n, options);
  options.num_threads = 4;
  auto four = int4::quantize(tensor.view(), WeightLayout::k_by_n, options);
  REQUIRE(one.ok());
  REQUIRE(four.ok());
  require_same(*one, *four);
}

TEST_CASE("quantize: clipping search never increases a group's squared error", "[int4][quantize]") {
  const std::int64_t k = 256, n = 96;
  const std::int64_t group = GENERATE(as<std::int64_t>{}, 32, 128, 0);
  const bool symmetric = GENERATE(true, false);
  CAPTURE(group, symmetric);
  const auto w = random_weights(k, n, 5);
  const auto tensor = make_tensor(ElementType::float32, {k, n}, w);
  int4::QuantizeOptions options;
  options.group_size = group;
  options.symmetric = symmetric;
  auto plain = int4::quantize(tensor.view(), WeightLayout::k_by_n, options);
  options.clip = {10, 0.5f};
  auto clipped = int4::quantize(tensor.view(), WeightLayout::k_by_n, options);
  REQUIRE(plain.ok());
  REQUIRE(clipped.ok());
  REQUIRE(int4::validate(*clipped).ok());
  double total_plain = 0, total_clipped = 0;
  int improved = 0;
  for (std::int64_t g = 0; g < plain->num_groups(); ++g)
    for (std::int64_t c = 0; c < n; ++c) {
      const double e_plain = squared_error(w, *plain, g, c);
      const double e_clip = squared_error(w, *clipped, g, c);
      INFO("group " << g << " column " << c);
      REQUIRE(e_clip <= e_plain * (1 + 1e-5) + 1e-12);
      improved += e_clip < e_plain * 0.999;
      total_plain += e_plain;
      total_clipped += e_clip;
    }
  REQUIRE(improved > 0);  // the outliers make some shrink factor pay off
  REQUIRE(total_clipped < total_plain);
}

TEST_CASE("quantize: scales rounded to FP16 / BF16 before the codes are chosen", "[int4][quantize]") {
  const std::int64_t k = 128, n = 40;
  const auto w = random_weights(k, n, 6);
  const auto tensor = make_tensor(ElementType::float32, {k, n}, w);
  const auto scale_type = GENERATE(ElementType::float16, ElementType::bfloat16);
  const bool symmetric = GENERATE(true, false);
  int4::QuantizeOptions options;
  options.group_size = 32;
  options.symmetric = symmetric;
  options.scale_type = scale_type;
  auto q = int4::quantize(tensor.view(), WeightLayout::k_by_n, options);
  REQUIRE(q.ok());
  for (float s : q->scales) {
    const auto bits = std::bit_cast<std::uint32_t>(s);
    if (scale_type == ElementType::bfloat16) REQUIRE((bits & 0xFFFFu) == 0u);
    else REQUIRE_NOTHROW(int4_test::exact_fp16_bits(s));
  }
  // Scales are rounded up, so the grid still covers every group: the scale/2 bound holds.
  require_rtn_bound(w, *q);
}

TEST_CASE("quantize: all-zero groups and extreme magnitudes", "[int4][quantize]") {
  const std::int64_t k = 64, n = 3;
  std::vector<float> w(static_cast<std::size_t>(k * n), 0.0f);
  for (std::int64_t r = 0; r < k; ++r) {
    w[r * n + 1] = (r % 2 ? 1.0f : -1.0f) * 3.0e38f;   // near FLT_MAX: no overflow in the range
    w[r * n + 2] = static_cast<float>(r) * 1e-44f;      // subnormals: 1 / scale must stay finite
  }
  const auto tensor = make_tensor(ElementType::float32, {k, n}, w);
  for (bool symmetric : {true, false}) {
    int4::QuantizeOptions options;
    options.group_size = 32;
    options.symmetric = symmetric;
    auto q = int4::quantize(tensor.view(), WeightLayout::k_by_n, options);
    REQUIRE(q.ok());
    require_rtn_bound(w, *q);
    for (std::int64_t r = 0; r < k; ++r) REQUIRE(q->dequantized(r, 0) == 0.0f);
  }
}

TEST_CASE("quantize: bad input is rejected with a clear error", "[int4][quantize]") {
  int4::QuantizeOptions options;
  options.group_size = 32;
  auto expect_error = [](const auto& result, const char* fragment) {
    REQUIRE_FALSE(result.ok());
    REQUIRE(result.status().code() == slimserve::StatusCode::invalid_argument);
    INFO(result.status().to_string());
    REQUIRE(result.status().to_string().find(fragment) != std::string::npos);
  };
  std::vector<float> w(static_cast<std::size_t>(64 * 12), 0.25f);
  SECTION("K not a multiple of 8") {
    const auto t = make_tensor(ElementType::float32, {12, 64}, w);  // K = 12
    expect_error(int4::quantize(t.view(), WeightLayout::k_by_n, options), "K = 12");
  }
  SECTION("group does not divide K") {
    const auto t = make_tensor(ElementType::float32, {48, 16}, w);
    expect_error(int4::quantize(t.view(), WeightLayout::k_by_n, options), "group size 32");
  }
  SECTION("group not a multiple of 8") {
    options.group_size = 12;
    const auto t = make_tensor(ElementType::float32, {48, 16}, w);
    expect_error(int4::quantize(t.view(), WeightLayout::k_by_n, options), "group size 12");
  }
  SECTION("non-finite weights name the element") {
    const float bad = GENERATE(std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN());
    w[37 * 12 + 5] = bad;
    const auto t = make_tensor(ElementType::float32, {64, 12}, w);
    expect_error(int4::quantize(t.view(), WeightLayout::k_by_n, options), "(k=37, n=5)");
    const auto nk = make_tensor(ElementType::float32, {12, 64}, transpose(w, 64, 12));
    expect_error(int4::quantize(nk.view(), WeightLayout::n_by_k, options), "(k=37, n=5)");
  }
  SECTION("FP16 scales that overflow") {
    std::fill(w.begin(), w.end(), 1.0e6f);
    options.scale_type = ElementType::float16;
    const auto t = make_tensor(ElementType::float32, {64, 12}, w);
    expect_error(int4::quantize(t.view(), WeightLayout::k_by_n, options), "does not fit F16");
  }
  SECTION("FP8 block scales: missing, misshapen, non-positive or non-finite") {
    std::vector<std::uint8_t> bytes(64 * 12, 0x38);  // 1.0
    const auto t = make_tensor(ElementType::float8_e4m3, {64, 12}, bytes);
    expect_error(int4::quantize(t.view(), WeightLayout::k_by_n, options), "block scales");
    const auto wrong_shape = make_tensor(ElementType::float32, {2, 1}, std::vector<float>{1.0f, 1.0f});
    int4::BlockScales blocks{wrong_shape.view(), 128, 128};
    expect_error(int4::quantize(t.view(), WeightLayout::k_by_n, options, &blocks), "must be [1, 1]");
    const float bad = GENERATE(0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN());
    const auto bad_scale = make_tensor(ElementType::float32, {1, 1}, std::vector<float>{bad});
    blocks.scales = bad_scale.view();
    expect_error(int4::quantize(t.view(), WeightLayout::k_by_n, options, &blocks), "finite and > 0");
  }
  SECTION("wrong byte count and unsupported types") {
    auto t = make_tensor(ElementType::float32, {64, 12}, w);
    t.bytes.pop_back();
    expect_error(int4::quantize(t.view(), WeightLayout::k_by_n, options), "bytes");
    const auto ints = make_tensor(ElementType::int32, {64, 12}, std::vector<std::int32_t>(64 * 12, 1));
    expect_error(int4::quantize(ints.view(), WeightLayout::k_by_n, options), "I32");
  }
}

TEST_CASE("validate: catches matrices that break the interchange conventions", "[int4][quantize]") {
  const std::int64_t k = 64, n = 8;
  const auto w = random_weights(k, n, 7);
  const auto tensor = make_tensor(ElementType::float32, {k, n}, w);
  int4::QuantizeOptions options;
  options.group_size = 32;
  auto good = int4::quantize(tensor.view(), WeightLayout::k_by_n, options);
  REQUIRE(good.ok());
  REQUIRE(int4::validate(*good).ok());
  auto broken = *good;
  SECTION("scale") { broken.scales[3] = -1.0f; }
  SECTION("non-8 zero in a symmetric matrix") { broken.zeros[5] = 7; }
  SECTION("zero above 15") { broken.symmetric = false; broken.zeros[5] = 16; }
  SECTION("code count") { broken.codes.pop_back(); }
  SECTION("row_group out of range") { broken.row_group.assign(k, 0); broken.row_group[9] = 2; }
  SECTION("row_group size") { broken.row_group.assign(k - 1, 0); }
  REQUIRE(int4::validate(broken).code() == slimserve::StatusCode::invalid_argument);
}

TEST_CASE("measure_error: relative Frobenius error and max error against the source", "[int4][quantize]") {
  const std::int64_t k = 128, n = 24;
  const auto w = random_weights(k, n, 8);
  const auto nk = make_tensor(ElementType::float32, {n, k}, transpose(w, k, n));
  int4::QuantizeOptions options;
  options.group_size = 64;
  options.symmetric = false;
  auto q = int4::quantize(nk.view(), WeightLayout::n_by_k, options);
  REQUIRE(q.ok());
  auto error = int4::measure_error(nk.view(), WeightLayout::n_by_k, *q);
  REQUIRE(error.ok());
  double err = 0, norm = 0, max_abs = 0;
  for (std::int64_t r = 0; r < k; ++r)
    for (std::int64_t c = 0; c < n; ++c) {
      const double d = static_cast<double>(w[r * n + c]) - q->dequantized(r, c);
      err += d * d;
      norm += static_cast<double>(w[r * n + c]) * w[r * n + c];
      max_abs = std::max(max_abs, std::fabs(d));
    }
  REQUIRE(error->relative == Approx(std::sqrt(err / norm)).epsilon(1e-9));
  REQUIRE(error->max_abs == max_abs);
  REQUIRE(error->relative > 0.0);
  // Shapes that disagree are refused.
  const auto kn = make_tensor(ElementType::float32, {k, n}, w);
  REQUIRE(int4::measure_error(kn.view(), WeightLayout::n_by_k, *q).status().code() ==
          slimserve::StatusCode::invalid_argument);
}
