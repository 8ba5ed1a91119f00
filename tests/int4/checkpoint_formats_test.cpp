// GPTQ / AWQ / compressed-tensors import and export. The checkpoints here are packed by small
// packers written from each format's description, byte by byte (not with the shift-and-or
// loops of the library), and the imported matrix is compared element by element with the
// values the packers started from.

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <numeric>
#include <random>
#include <vector>

#include "int4_test_util.hpp"
#include "slimserve/int4/checkpoint_formats.hpp"
#include "slimserve/int4/quantize.hpp"
#include "support/random.hpp"

namespace int4 = slimserve::int4;
using int4::ElementType;
using slimserve::StatusCode;
using int4_test::make_tensor;

namespace {

/// The ground truth a checkpoint is packed from: codes [K][N], per-group zeros and scales
/// (FP16-representable), and the group of each row.
struct Truth {
  std::int64_t k = 0, n = 0, group = 0;
  std::vector<int> code;          // [K, N]
  std::vector<int> zero;          // [G, N]
  std::vector<float> scale;       // [G, N]
  std::vector<std::int32_t> row_group;  // [K]
  std::int64_t groups() const { return k / group; }
  float value(std::int64_t r, std::int64_t c) const {
    const auto g = static_cast<std::size_t>(row_group[r] * n + c);
    return static_cast<float>(code[r * n + c] - zero[g]) * scale[g];
  }
};

Truth make_truth(std::int64_t k, std::int64_t n, std::int64_t group, bool symmetric, bool act_order,
                 std::uint64_t salt, int min_zero = 0) {
  auto rng = slimserve_test::make_rng(salt);
  Truth t;
  t.k = k;
  t.n = n;
  t.group = group;
  t.code.resize(static_cast<std::size_t>(k * n));
  for (auto& q : t.code) q = static_cast<int>(rng() % 16);
  t.zero.resize(static_cast<std::size_t>(k / group * n));
  t.scale.resize(t.zero.size());
  for (std::size_t i = 0; i < t.zero.size(); ++i) {
    t.zero[i] = symmetric ? 8 : min_zero + static_cast<int>(rng() % static_cast<std::uint64_t>(16 - min_zero));
    t.scale[i] = std::ldexp(static_cast<float>(1 + rng() % 1024), -16);  // exact in FP16 and BF16? FP16 only
  }
  t.row_group.resize(static_cast<std::size_t>(k));
  std::vector<std::int32_t> position(static_cast<std::size_t>(k));
  std::iota(position.begin(), position.end(), 0);
  if (act_order) std::shuffle(position.begin(), position.end(), rng);  // desc_act: rows visited out of order
  for (std::int64_t i = 0; i < k; ++i) t.row_group[position[i]] = static_cast<std::int32_t>(i / group);
  return t;
}

/// 8 nibbles -> one little-endian 32-bit word, assembled from bytes (low nibble first).
std::int32_t word_from_nibbles(const std::array<int, 8>& nibbles) {
  std::array<unsigned char, 4> bytes{};
  for (int b = 0; b < 4; ++b) {
    REQUIRE(nibbles[2 * b] >= 0);
    REQUIRE(nibbles[2 * b] <= 15);
    REQUIRE(nibbles[2 * b + 1] >= 0);
    REQUIRE(nibbles[2 * b + 1] <= 15);
    bytes[b] = static_cast<unsigned char>(nibbles[2 * b] + 16 * nibbles[2 * b + 1]);
  }
  std::int32_t word;
  std::memcpy(&word, bytes.data(), 4);
  return word;
}

int4::Tensor fp16_tensor(std::vector<std::int64_t> shape, const std::vector<float>& values) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = int4_test::exact_fp16_bits(values[i]);
  return make_tensor(ElementType::float16, std::move(shape), bits);
}

void require_matches(const int4::QuantizedMatrix& m, const Truth& t) {
  REQUIRE(int4::validate(m).ok());
  REQUIRE(m.k == t.k);
  REQUIRE(m.n == t.n);
  REQUIRE(m.group_size == t.group);
  for (std::int64_t r = 0; r < t.k; ++r) {
    REQUIRE(m.group_of_row(r) == t.row_group[r]);
    for (std::int64_t c = 0; c < t.n; ++c) {
      INFO("k=" << r << " n=" << c);
      REQUIRE(static_cast<int>(m.code(r, c)) == t.code[r * t.n + c]);
      REQUIRE(m.dequantized(r, c) == t.value(r, c));
    }
  }
  for (std::size_t i = 0; i < t.zero.size(); ++i) {
    REQUIRE(int{m.zeros[i]} == t.zero[i]);
    REQUIRE(m.scales[i] == t.scale[i]);
  }
}

void require_same(const int4::QuantizedMatrix& a, const int4::QuantizedMatrix& b) {
  REQUIRE(a.k == b.k);
  REQUIRE(a.n == b.n);
  REQUIRE(a.group_size == b.group_size);
  REQUIRE(a.codes == b.codes);
  REQUIRE(a.scales == b.scales);
  REQUIRE(a.zeros == b.zeros);
  REQUIRE(a.row_group == b.row_group);
}

// --- packers, from the format descriptions -------------------------------------------------

struct GptqFile {
  int4::Tensor qweight, qzeros, scales, g_idx;
  int4::GptqTensorView view() const {
    return {qweight.view(), qzeros.view(), scales.view(), g_idx.view()};
  }
};

/// GPTQ: qweight [K/8, N], word (r, c) = rows 8r..8r+7 of column c; qzeros [G, ceil(N/8)],
/// word (g, w) = columns 8w..8w+7, storing zero - 1 in v1; scales F16 [G, N]; g_idx [K].
GptqFile pack_gptq(const Truth& t, bool v1) {
  GptqFile f;
  std::vector<std::int32_t> qweight;
  for (std::int64_t r = 0; r < t.k / 8; ++r)
    for (std::int64_t c = 0; c < t.n; ++c) {
      std::array<int, 8> nib{};
      for (int j = 0; j < 8; ++j) nib[j] = t.code[(8 * r + j) * t.n + c];
      qweight.push_back(word_from_nibbles(nib));
    }
  f.qweight = make_tensor(ElementType::int32, {t.k / 8, t.n}, qweight);
  const std::int64_t zero_words = (t.n + 7) / 8;
  std::vector<std::int32_t> qzeros;
  for (std::int64_t g = 0; g < t.groups(); ++g)
    for (std::int64_t w = 0; w < zero_words; ++w) {
      std::array<int, 8> nib{};
      for (int j = 0; j < 8; ++j) {
        if (w * 8 + j < t.n) nib[j] = t.zero[g * t.n + w * 8 + j] - (v1 ? 1 : 0);
      }
      qzeros.push_back(word_from_nibbles(nib));
    }
  f.qzeros = make_tensor(ElementType::int32, {t.groups(), zero_words}, qzeros);
  f.scales = fp16_tensor({t.groups(), t.n}, t.scale);
  f.g_idx = make_tensor(ElementType::int32, {t.k}, t.row_group);
  return f;
}

struct AwqFile {
  int4::Tensor qweight, qzeros, scales;
  int4::AwqTensorView view() const { return {qweight.view(), qzeros.view(), scales.view()}; }
};

/// AWQ: word (r, w) holds columns 8w..8w+7 of row r; column offset j sits in nibble
/// kNibbleOf[j] (the nibble order 0,2,4,6,1,3,5,7 read the other way round).
AwqFile pack_awq(const Truth& t) {
  constexpr std::array<int, 8> kNibbleOf = {0, 4, 1, 5, 2, 6, 3, 7};
  auto pack_row = [&](auto value_of_column, std::int64_t words, std::vector<std::int32_t>& out) {
    for (std::int64_t w = 0; w < words; ++w) {
      std::array<int, 8> nib{};
      for (int j = 0; j < 8; ++j) nib[kNibbleOf[j]] = value_of_column(w * 8 + j);
      out.push_back(word_from_nibbles(nib));
    }
  };
  AwqFile f;
  std::vector<std::int32_t> qweight, qzeros;
  for (std::int64_t r = 0; r < t.k; ++r) pack_row([&](std::int64_t c) { return t.code[r * t.n + c]; }, t.n / 8, qweight);
  for (std::int64_t g = 0; g < t.groups(); ++g) pack_row([&](std::int64_t c) { return t.zero[g * t.n + c]; }, t.n / 8, qzeros);
  f.qweight = make_tensor(ElementType::int32, {t.k, t.n / 8}, qweight);
  f.qzeros = make_tensor(ElementType::int32, {t.groups(), t.n / 8}, qzeros);
  f.scales = fp16_tensor({t.groups(), t.n}, t.scale);
  return f;
}

struct CtFile {
  int4::Tensor weight_packed, weight_scale, weight_zero_point, weight_shape, weight_g_idx;
  bool zero_point = false, g_idx = false;
  int4::CompressedTensorsView view() const {
    int4::CompressedTensorsView v{weight_packed.view(), weight_scale.view(), {}, {}, weight_shape.view()};
    if (zero_point) v.weight_zero_point = weight_zero_point.view();
    if (g_idx) v.weight_g_idx = weight_g_idx.view();
    return v;
  }
};

/// compressed-tensors pack-quantized, as its compressor writes it: the weight is [N, K] of
/// signed int4 (code - 8), shifted by +8 and packed 8 per int32 along K; scale [N, G];
/// asymmetric zero points signed (zero - 8), shifted by +8, packed along N: [ceil(N/8), G].
CtFile pack_compressed_tensors(const Truth& t, bool asymmetric, bool with_g_idx) {
  CtFile f;
  std::vector<std::int32_t> packed;
  for (std::int64_t c = 0; c < t.n; ++c)
    for (std::int64_t w = 0; w < t.k / 8; ++w) {
      std::array<int, 8> nib{};
      for (int j = 0; j < 8; ++j) {
        const int signed_code = t.code[(w * 8 + j) * t.n + c] - 8;
        nib[j] = signed_code + 8;
      }
      packed.push_back(word_from_nibbles(nib));
    }
  f.weight_packed = make_tensor(ElementType::int32, {t.n, t.k / 8}, packed);
  std::vector<std::uint16_t> scale_bits;
  for (std::int64_t c = 0; c < t.n; ++c)
    for (std::int64_t g = 0; g < t.groups(); ++g) scale_bits.push_back(int4_test::exact_fp16_bits(t.scale[g * t.n + c]));
  f.weight_scale = make_tensor(ElementType::float16, {t.n, t.groups()}, scale_bits);
  if (asymmetric) {
    f.zero_point = true;
    std::vector<std::int32_t> zp;
    for (std::int64_t w = 0; w < (t.n + 7) / 8; ++w)
      for (std::int64_t g = 0; g < t.groups(); ++g) {
        std::array<int, 8> nib{};
        for (int j = 0; j < 8; ++j) {
          if (w * 8 + j < t.n) nib[j] = (t.zero[g * t.n + w * 8 + j] - 8) + 8;
        }
        zp.push_back(word_from_nibbles(nib));
      }
    f.weight_zero_point = make_tensor(ElementType::int32, {(t.n + 7) / 8, t.groups()}, zp);
  }
  f.weight_shape = make_tensor(ElementType::int64, {2}, std::vector<std::int64_t>{t.n, t.k});
  if (with_g_idx) {
    f.g_idx = true;
    f.weight_g_idx = make_tensor(ElementType::int32, {t.k}, t.row_group);
  }
  return f;
}

void require_error(const slimserve::Status& status, StatusCode code, const char* fragment) {
  INFO(status.to_string());
  REQUIRE(status.code() == code);
  REQUIRE(status.to_string().find(fragment) != std::string::npos);
}

}  // namespace

TEST_CASE("GPTQ import: v1 and v2 zero points, act-order g_idx", "[int4][checkpoint]") {
  const bool v1 = GENERATE(true, false);
  const bool symmetric = GENERATE(true, false);
  const bool act_order = GENERATE(false, true);
  const std::int64_t n = GENERATE(as<std::int64_t>{}, 12, 64);
  CAPTURE(v1, symmetric, act_order, n);
  const Truth t = make_truth(128, n, 32, symmetric, act_order, 11, v1 ? 1 : 0);
  const GptqFile file = pack_gptq(t, v1);
  int4::GptqConfig config{32, act_order, symmetric, v1 ? int4::GptqZeroFormat::v1_minus_one : int4::GptqZeroFormat::v2_plain};
  auto m = int4::import_gptq(file.view(), config);
  REQUIRE(m.ok());
  require_matches(*m, t);
  REQUIRE(m->row_group.empty() == !act_order);

  // Export back to the plain form and import again: bit-identical.
  auto exported = int4::export_gptq(*m, config.zero_format);
  REQUIRE(exported.ok());
  REQUIRE(exported->qweight.bytes == file.qweight.bytes);
  REQUIRE(exported->qzeros.bytes == file.qzeros.bytes);
  REQUIRE(exported->scales.bytes == file.scales.bytes);
  REQUIRE(exported->g_idx.bytes == file.g_idx.bytes);
}

TEST_CASE("GPTQ import: g_idx optional, per-channel", "[int4][checkpoint]") {
  const Truth t = make_truth(64, 16, 64, false, false, 12);
  GptqFile file = pack_gptq(t, false);
  int4::GptqTensorView view = file.view();
  view.g_idx.reset();
  auto m = int4::import_gptq(view, {-1, false, false, int4::GptqZeroFormat::v2_plain});
  REQUIRE(m.ok());
  require_matches(*m, t);
}

TEST_CASE("GPTQ import: contradictions are data_loss, unrepresentable shapes unsupported", "[int4][checkpoint]") {
  const Truth t = make_truth(128, 16, 32, true, false, 13);
  int4::GptqConfig config{32, false, true, int4::GptqZeroFormat::v1_minus_one};
  SECTION("a v2 file labelled v1 (the zeros say 8, v1 would store 7)") {
    const GptqFile v2 = pack_gptq(t, false);
    require_error(int4::import_gptq(v2.view(), config).status(), StatusCode::data_loss, "gptq_v2");
  }
  SECTION("a v1 file labelled v2") {
    const GptqFile v1 = pack_gptq(t, true);
    config.zero_format = int4::GptqZeroFormat::v2_plain;
    require_error(int4::import_gptq(v1.view(), config).status(), StatusCode::data_loss, "GPTQ v1");
  }
  SECTION("v1 nibble 15 = zero point 16") {
    Truth asym = make_truth(128, 16, 32, false, false, 14, 1);
    asym.zero[5] = 16;  // packs to nibble 15 in v1
    const GptqFile f = pack_gptq(asym, true);
    config.symmetric = false;
    require_error(int4::import_gptq(f.view(), config).status(), StatusCode::data_loss, "zero point 16");
  }
  SECTION("g_idx contradicting group_size without desc_act") {
    GptqFile f = pack_gptq(t, true);
    f.g_idx.set(40, std::int32_t{0});  // row 40 belongs to group 1
    require_error(int4::import_gptq(f.view(), config).status(), StatusCode::data_loss, "desc_act");
  }
  SECTION("g_idx out of range") {
    GptqFile f = pack_gptq(t, true);
    f.g_idx.set(3, std::int32_t{4});
    config.desc_act = true;
    require_error(int4::import_gptq(f.view(), config).status(), StatusCode::data_loss, "outside [0, 4)");
  }
  SECTION("scales shape contradicts qweight") {
    GptqFile f = pack_gptq(t, true);
    config.group_size = 64;  // the file has 4 groups, the config implies 2
    require_error(int4::import_gptq(f.view(), config).status(), StatusCode::data_loss, "GPTQ scales has shape [4, 16]");
  }
  SECTION("non-positive scale") {
    GptqFile f = pack_gptq(t, true);
    f.scales.set(7, std::uint16_t{0x8000});  // -0.0
    require_error(int4::import_gptq(f.view(), config).status(), StatusCode::data_loss, "GPTQ scales[0, 7]");
  }
  SECTION("qweight dtype") {
    GptqFile f = pack_gptq(t, true);
    f.qweight.type = ElementType::float32;
    require_error(int4::import_gptq(f.view(), config).status(), StatusCode::data_loss, "dtype F32");
  }
  SECTION("group size that does not divide K") {
    config.group_size = 48;
    const GptqFile f = pack_gptq(t, true);
    require_error(int4::import_gptq(f.view(), config).status(), StatusCode::unsupported, "group_size 48");
  }
}

TEST_CASE("AWQ import: interleaved nibble order, export back", "[int4][checkpoint]") {
  const std::int64_t group = GENERATE(as<std::int64_t>{}, 32, 128);
  const Truth t = make_truth(128, 48, group, false, false, 21);
  const AwqFile file = pack_awq(t);
  auto m = int4::import_awq(file.view(), group);
  REQUIRE(m.ok());
  require_matches(*m, t);
  auto exported = int4::export_awq(*m);
  REQUIRE(exported.ok());
  REQUIRE(exported->qweight.bytes == file.qweight.bytes);
  REQUIRE(exported->qzeros.bytes == file.qzeros.bytes);
  REQUIRE(exported->scales.bytes == file.scales.bytes);
}

TEST_CASE("AWQ import/export: contradictions and limits", "[int4][checkpoint]") {
  const Truth t = make_truth(64, 16, 32, false, false, 22);
  AwqFile f = pack_awq(t);
  SECTION("qzeros shape") {
    f.qzeros.shape = {1, 4};
    require_error(int4::import_awq(f.view(), 32).status(), StatusCode::data_loss, "AWQ qzeros has shape [1, 4]");
  }
  SECTION("scale NaN") {
    f.scales.set(3, std::uint16_t{0x7E00});
    require_error(int4::import_awq(f.view(), 32).status(), StatusCode::data_loss, "AWQ scales[0, 3]");
  }
  SECTION("act-order cannot be exported") {
    auto m = int4::import_awq(f.view(), 32);
    REQUIRE(m.ok());
    m->row_group.assign(64, 0);
    m->row_group[0] = 1;
    require_error(int4::export_awq(*m).status(), StatusCode::invalid_argument, "act-order");
  }
}

TEST_CASE("compressed-tensors import: symmetric, asymmetric, g_idx", "[int4][checkpoint]") {
  const bool asymmetric = GENERATE(false, true);
  const bool with_g_idx = GENERATE(false, true);
  const std::int64_t n = GENERATE(as<std::int64_t>{}, 20, 64);
  CAPTURE(asymmetric, with_g_idx, n);
  const Truth t = make_truth(256, n, 64, !asymmetric, with_g_idx, 31);
  const CtFile file = pack_compressed_tensors(t, asymmetric, with_g_idx);
  auto m = int4::import_compressed_tensors(file.view(), {64, !asymmetric});
  REQUIRE(m.ok());
  require_matches(*m, t);
  auto exported = int4::export_compressed_tensors(*m, ElementType::float16);
  REQUIRE(exported.ok());
  REQUIRE(exported->weight_packed.bytes == file.weight_packed.bytes);
  REQUIRE(exported->weight_scale.bytes == file.weight_scale.bytes);
  REQUIRE(exported->weight_shape.bytes == file.weight_shape.bytes);
  REQUIRE(exported->has_zero_point == asymmetric);
  if (asymmetric) REQUIRE(exported->weight_zero_point.bytes == file.weight_zero_point.bytes);
  REQUIRE(exported->has_g_idx == with_g_idx);
  if (with_g_idx) REQUIRE(exported->weight_g_idx.bytes == file.weight_g_idx.bytes);
}

TEST_CASE("compressed-tensors import: older unpacked I8 zero points; channel strategy", "[int4][checkpoint]") {
  const Truth t = make_truth(64, 10, 64, false, false, 32);
  CtFile file = pack_compressed_tensors(t, true, false);
  std::vector<std::int8_t> zp;
  for (std::int64_t c = 0; c < t.n; ++c) zp.push_back(static_cast<std::int8_t>(t.zero[c] - 8));
  file.weight_zero_point = make_tensor(ElementType::int8, {t.n, 1}, zp);
  auto m = int4::import_compressed_tensors(file.view(), {-1, false});
  REQUIRE(m.ok());
  require_matches(*m, t);
  zp[3] = 9;
  file.weight_zero_point = make_tensor(ElementType::int8, {t.n, 1}, zp);
  require_error(int4::import_compressed_tensors(file.view(), {-1, false}).status(), StatusCode::data_loss, "-8..7");
}

TEST_CASE("compressed-tensors import: contradictions are data_loss", "[int4][checkpoint]") {
  const Truth sym = make_truth(128, 16, 32, true, false, 33);
  const Truth asym = make_truth(128, 16, 32, false, false, 34);
  SECTION("weight_shape disagrees with weight_packed") {
    CtFile f = pack_compressed_tensors(sym, false, false);
    f.weight_shape = make_tensor(ElementType::int64, {2}, std::vector<std::int64_t>{16, 200});
    require_error(int4::import_compressed_tensors(f.view(), {32, true}).status(), StatusCode::data_loss, "weight_shape [16, 200]");
  }
  SECTION("asymmetric config without zero points") {
    CtFile f = pack_compressed_tensors(asym, true, false);
    f.zero_point = false;
    require_error(int4::import_compressed_tensors(f.view(), {32, false}).status(), StatusCode::data_loss, "missing");
  }
  SECTION("symmetric config with non-zero zero points") {
    CtFile f = pack_compressed_tensors(asym, true, false);
    require_error(int4::import_compressed_tensors(f.view(), {32, true}).status(), StatusCode::data_loss, "symmetric");
  }
  SECTION("scale shape") {
    const CtFile f = pack_compressed_tensors(sym, false, false);
    require_error(int4::import_compressed_tensors(f.view(), {64, true}).status(), StatusCode::data_loss, "weight_scale has shape [16, 4]");
  }
  SECTION("g_idx out of range") {
    CtFile f = pack_compressed_tensors(sym, false, true);
    f.weight_g_idx.set(100, std::int32_t{-1});
    require_error(int4::import_compressed_tensors(f.view(), {32, true}).status(), StatusCode::data_loss, "weight_g_idx[100] = -1");
  }
}

TEST_CASE("quantize -> export -> import round-trips bit-exactly in every format", "[int4][checkpoint]") {
  const std::int64_t k = 256, n = 64;
  auto rng = slimserve_test::make_rng(41);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> w(static_cast<std::size_t>(k * n));
  for (auto& x : w) x = normal(rng);
  const auto tensor = make_tensor(ElementType::float32, {n, k}, w);
  const bool symmetric = GENERATE(true, false);
  const std::int64_t group = GENERATE(as<std::int64_t>{}, 32, 128, 0);
  int4::QuantizeOptions options;
  options.group_size = group;
  options.symmetric = symmetric;
  options.scale_type = ElementType::float16;  // exact through FP16 checkpoints
  auto q = int4::quantize(tensor.view(), int4::WeightLayout::n_by_k, options);
  REQUIRE(q.ok());
  const std::int64_t config_group = group == 0 ? -1 : group;

  for (auto format : {int4::GptqZeroFormat::v1_minus_one, int4::GptqZeroFormat::v2_plain}) {
    auto gptq = int4::export_gptq(*q, format);
    if (format == int4::GptqZeroFormat::v1_minus_one &&
        std::find(q->zeros.begin(), q->zeros.end(), 0) != q->zeros.end()) {
      require_error(gptq.status(), StatusCode::invalid_argument, "v1 cannot store zero point 0");
      continue;
    }
    REQUIRE(gptq.ok());
    auto back = int4::import_gptq({gptq->qweight.view(), gptq->qzeros.view(), gptq->scales.view(), gptq->g_idx.view()},
                                  {config_group, false, symmetric, format});
    REQUIRE(back.ok());
    require_same(*back, *q);
  }
  auto awq = int4::export_awq(*q);
  REQUIRE(awq.ok());
  auto from_awq = int4::import_awq({awq->qweight.view(), awq->qzeros.view(), awq->scales.view()}, config_group);
  REQUIRE(from_awq.ok());
  require_same(*from_awq, *q);

  auto ct = int4::export_compressed_tensors(*q, ElementType::float16);
  REQUIRE(ct.ok());
  int4::CompressedTensorsView view{ct->weight_packed.view(), ct->weight_scale.view(), {}, {}, ct->weight_shape.view()};
  if (ct->has_zero_point) view.weight_zero_point = ct->weight_zero_point.view();
  auto from_ct = int4::import_compressed_tensors(view, {config_group, symmetric});
  REQUIRE(from_ct.ok());
  require_same(*from_ct, *q);
}
