// Rotated caches (attention/rotation.hpp). append_kv with rotation keys / keys_and_values
// against an FP64 reference: each head vector rotated on the host in double (H x / sqrt(D)),
// then quantized with the formats' host codecs under the scale the kernel stored, which must
// itself be the host rule's for the reference amax. The kernel rotates in FP32, so each
// rotated element is known to within E = 2 (log2 D + 2) 2^-24 |x|_1 / sqrt(D) (hadamard.cuh's
// rounding bound, doubled): a stored code or scale is accepted when it is the host rule's for
// some value within E of the reference (every element is checked that way; an unrotated V is
// checked with E = 0, bit for bit). Every other byte of the poisoned pages and scale arrays is
// untouched. Random rows with outlier channels (fresh seeds), ragged lengths (1, page-1, page,
// page+1, long), shuffled pages with holes, the chunk and the slot forms, both layouts, NVFP4,
// FP8 e4m3 (per tensor and per token) and BF16; head_dim 64, 128, 256. Bad input (head_dim
// 96 / 192, an unknown rotation value) is refused before anything is written.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "attention_test_support.hpp"
#include "slimserve/attention/append.hpp"
#include "slimserve/attention/rotate_heads.hpp"
#include "slimserve/attention/rotation.hpp"
#include "slimserve/formats/fp4.hpp"
#include "slimserve/formats/nvfp4.hpp"

using namespace attn_test;

namespace rotation_test {

struct RotatedCase {
  KvDtype dtype;
  KvLayout layout;
  KvScaleMode scale_mode;
  int head_dim;
  int num_kv_heads;
  int page_size;
  ActivationDtype input;
  KvRotation rotation;
  bool slot_form;
};

inline std::vector<RotatedCase> rotated_grid() {
  using enum KvDtype;
  using R = KvRotation;
  return {
      {nvfp4, KvLayout::nhd, KvScaleMode::per_tensor, 128, 2, 16, ActivationDtype::bf16, R::keys, false},
      {nvfp4, KvLayout::hnd, KvScaleMode::per_tensor, 64, 3, 32, ActivationDtype::fp16, R::keys_and_values, true},
      {nvfp4, KvLayout::nhd, KvScaleMode::per_tensor, 256, 1, 16, ActivationDtype::bf16, R::keys_and_values, false},
      {fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 128, 2, 16, ActivationDtype::bf16, R::keys_and_values, false},
      {fp8_e4m3, KvLayout::hnd, KvScaleMode::per_token, 64, 5, 16, ActivationDtype::fp16, R::keys, true},
      {fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, 256, 1, 32, ActivationDtype::bf16, R::keys_and_values, false},
      {bf16, KvLayout::hnd, KvScaleMode::none, 128, 3, 16, ActivationDtype::bf16, R::keys_and_values, true},
      {bf16, KvLayout::nhd, KvScaleMode::per_tensor, 64, 2, 16, ActivationDtype::fp16, R::keys, false},
  };
}

/// y = H x / sqrt(D) in FP64, and the FP32 kernel's error bound on each element (see top).
inline double hadamard_reference(const float* x, int d_dim, double* y) {
  double l1 = 0.0;
  for (int j = 0; j < d_dim; ++j) l1 += std::fabs(static_cast<double>(x[j]));
  const double root = std::sqrt(static_cast<double>(d_dim));
  for (int i = 0; i < d_dim; ++i) {
    double sum = 0.0;
    for (int j = 0; j < d_dim; ++j) {
      sum += (__builtin_popcount(static_cast<unsigned>(i & j)) & 1 ? -1.0 : 1.0) * static_cast<double>(x[j]);
    }
    y[i] = sum / root;
  }
  return 2.0 * (std::log2(static_cast<double>(d_dim)) + 2.0) * std::ldexp(1.0, -24) * l1 / root;
}

/// [lo, hi] widened by a relative 2^-22 (the kernel's FP32 products and quotients), as floats.
inline float below(double v) { return static_cast<float>(v - std::fabs(v) * 0x1p-22); }
inline float above(double v) { return static_cast<float>(v + std::fabs(v) * 0x1p-22); }

/// Host per-token scale rule (kv_store.cuh's, from the formats' constants).
inline float host_token_scale(KvDtype dtype, float amax) {
  const float scale = amax / format_max(dtype);
  return (scale > 0.0f && std::isfinite(scale)) ? scale : 1.0f;
}

/// A stored scaled-format vector (bf16 / fp16 / fp8) against the reference y within e.
/// `scale`: the one the kernel stored (per token) or was given; returns the elements outside.
inline std::size_t scaled_violations(KvDtype dtype, const double* y, double e, int d_dim, float scale,
                                     const HostCache& image, bool is_v, int page, int slot, int head,
                                     std::size_t& exact) {
  std::size_t bad = 0;
  for (int d = 0; d < d_dim; ++d) {
    const float got = dequantize(dtype, image.bits(is_v ? image.v : image.k, image.offset(page, slot, head, d)));
    if (e == 0.0) {  // not rotated: bit for bit the host rule on the input value
      const std::uint16_t want = quantize(dtype, static_cast<float>(y[d]) / scale);
      bad += image.bits(is_v ? image.v : image.k, image.offset(page, slot, head, d)) != want;
      ++exact;
      continue;
    }
    const float lo = dequantize(dtype, quantize(dtype, below((y[d] - e) / scale)));
    const float hi = dequantize(dtype, quantize(dtype, above((y[d] + e) / scale)));
    bad += !(got >= lo && got <= hi);
    exact += got == dequantize(dtype, quantize(dtype, static_cast<float>(y[d] / scale)));
  }
  return bad;
}

/// A stored NVFP4 vector (codes, then block scales) against the reference y within e.
inline std::size_t nvfp4_violations(const double* y, double e, int d_dim, float tensor_scale,
                                    const std::uint8_t* stored, std::size_t& exact) {
  std::size_t bad = 0;
  for (int b = 0; b < d_dim / nvfp4_block_elements; ++b) {
    double amax = 0.0;
    for (int i = 0; i < nvfp4_block_elements; ++i) amax = std::max(amax, std::fabs(y[b * 16 + i]));
    const fp8_e4m3 scale = fp8_e4m3::from_bits(stored[d_dim / 2 + b]);
    const std::uint8_t lo_scale = nvfp4_block_scale(below(std::max(amax - e, 0.0)), tensor_scale).bits;
    const std::uint8_t hi_scale = nvfp4_block_scale(above(amax + e), tensor_scale).bits;
    bad += !(scale.bits >= lo_scale && scale.bits <= hi_scale);  // positive E4M3 codes: monotonic
    const float multiplier = nvfp4_code_multiplier(scale, tensor_scale);
    for (int i = 0; i < nvfp4_block_elements; ++i) {
      const int el = b * 16 + i;
      const float got = to_float(fp4_e2m1::from_bits(static_cast<std::uint8_t>(stored[el / 2] >> (4 * (el % 2)))));
      const auto code_value = [&](float x) {
        return to_float(fp4_e2m1::from_bits(static_cast<std::uint8_t>(nvfp4_code(x, multiplier))));
      };
      if (e == 0.0) {
        bad += got != code_value(static_cast<float>(y[el]));
      } else {
        bad += !(got >= code_value(below(y[el] - e)) && got <= code_value(above(y[el] + e)));
      }
      exact += got == code_value(static_cast<float>(y[el]));
    }
  }
  return bad;
}

}  // namespace rotation_test

using namespace rotation_test;

TEST_CASE("rotated append: every stored code and scale is the host rule's on the FP64-rotated vector",
          "[attention][append][rotation]") {
  auto rng = slimserve_test::make_rng(2531);
  for (const RotatedCase& c : rotated_grid()) {
    INFO("dtype " << to_string(c.dtype) << " layout " << to_string(c.layout) << " scales " << to_string(c.scale_mode)
                  << " D " << c.head_dim << " H " << c.num_kv_heads << " rotation " << to_string(c.rotation)
                  << (c.slot_form ? " slot form" : " chunk form"));
    const bool fp4 = c.dtype == KvDtype::nvfp4;
    const int d_dim = c.head_dim, heads = c.num_kv_heads;
    const std::int64_t ps = c.page_size;
    const std::vector<std::int64_t> lengths = {1, ps - 1, ps, ps + 1, 3 * ps + 5};
    const std::vector<std::int32_t> appended = {1, 3, static_cast<std::int32_t>(ps), 2,
                                                static_cast<std::int32_t>(2 * ps + 1)};
    const HostPageTable table = make_page_table(lengths, c.page_size, rng, false);
    std::vector<std::int32_t> append_indptr{0};
    for (const auto n : appended) append_indptr.push_back(append_indptr.back() + n);
    const int num_tokens = append_indptr.back();

    // Rows with outlier channels (what the rotation is for), as the activation type holds them.
    const std::size_t count = static_cast<std::size_t>(num_tokens) * heads * d_dim;
    std::vector<std::uint16_t> k_bits(count), v_bits(count);
    std::vector<float> k_in(count), v_in(count);
    for (std::size_t row = 0; row < count / d_dim; ++row) {
      realistic_row(rng, d_dim, k_in.data() + row * d_dim, 1.0f);
      realistic_row(rng, d_dim, v_in.data() + row * d_dim, 0.5f);
    }
    for (std::size_t i = 0; i < count; ++i) {
      k_bits[i] = to_activation(c.input, k_in[i]);
      v_bits[i] = to_activation(c.input, v_in[i]);
      k_in[i] = from_activation(c.input, k_bits[i]);
      v_in[i] = from_activation(c.input, v_bits[i]);
    }
    // The FP64 references: rotated (with their bound) or as given (bound 0).
    std::vector<double> k_ref(count), v_ref(count), k_err(count / d_dim), v_err(count / d_dim);
    double k_amax = 0.0, v_amax = 0.0;
    for (std::size_t row = 0; row < count / d_dim; ++row) {
      k_err[row] = hadamard_reference(k_in.data() + row * d_dim, d_dim, k_ref.data() + row * d_dim);
      if (rotates_values(c.rotation)) {
        v_err[row] = hadamard_reference(v_in.data() + row * d_dim, d_dim, v_ref.data() + row * d_dim);
      } else {
        for (int d = 0; d < d_dim; ++d) v_ref[row * d_dim + d] = v_in[row * d_dim + d];
        v_err[row] = 0.0;
      }
      for (int d = 0; d < d_dim; ++d) {
        k_amax = std::max(k_amax, std::fabs(k_ref[row * d_dim + d]));
        v_amax = std::max(v_amax, std::fabs(v_ref[row * d_dim + d]));
      }
    }

    HostCache image(CacheShape{c.dtype == KvDtype::nvfp4 ? KvDtype::fp8_e4m3 : c.dtype, c.layout, c.scale_mode,
                               table.num_pages, c.page_size, heads, d_dim});
    const std::size_t vb = static_cast<std::size_t>(head_vector_bytes(c.dtype, d_dim));
    const std::size_t vectors = static_cast<std::size_t>(table.num_pages) * ps * heads;
    if (fp4) {
      image.k.assign(vectors * vb, 0);
      image.v.assign(vectors * vb, 0);
    }
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : image.k) b = static_cast<unsigned char>(byte(rng));
    for (auto& b : image.v) b = static_cast<unsigned char>(byte(rng));
    std::uniform_real_distribution<float> poison_scale(0.5f, 2.0f);
    for (auto& s : image.k_token_scale) s = poison_scale(rng);
    for (auto& s : image.v_token_scale) s = poison_scale(rng);
    // Per-tensor scales from the rotated amax: FP8 saturates its largest values (x 0.8).
    if (fp4) {
      image.k_scale = static_cast<float>(k_amax / 2688.0);
      image.v_scale = static_cast<float>(v_amax / 2688.0);
    } else if (c.dtype == KvDtype::fp8_e4m3) {
      image.k_scale = static_cast<float>(k_amax / 448.0 * 0.8);
      image.v_scale = static_cast<float>(v_amax / 448.0 * 0.8);
    } else {
      image.k_scale = 0.37f;
      image.v_scale = 1.9f;
    }
    DeviceCache device(image);
    device.view.dtype = c.dtype;

    std::vector<std::int64_t> slots;
    std::vector<std::int32_t> dest_page, dest_slot;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      for (std::int64_t pos = lengths[b] - appended[b]; pos < lengths[b]; ++pos) {
        const std::int32_t page = table.indices[static_cast<std::size_t>(table.indptr[b] + pos / ps)];
        dest_page.push_back(page);
        dest_slot.push_back(static_cast<std::int32_t>(pos % ps));
        slots.push_back(static_cast<std::int64_t>(page) * ps + pos % ps);
      }
    }
    std::vector<bool> written(static_cast<std::size_t>(num_tokens), true);
    if (c.slot_form) {
      slots[1] = -1;
      written[1] = false;
      slots[4] = static_cast<std::int64_t>(table.num_pages) * ps + 2;
      written[4] = false;
    }
    auto indptr = upload(table.indptr);
    auto indices = upload(table.indices);
    auto last = upload(table.last_page_len);
    auto chunk = upload(append_indptr);
    auto slot_dev = upload(slots);
    auto k_new = upload(k_bits);
    auto v_new = upload(v_bits);
    AppendArguments a;
    a.cache = device.view;
    a.input_dtype = c.input;
    a.num_tokens = num_tokens;
    a.k_new = k_new.data();
    a.v_new = v_new.data();
    a.rotation = c.rotation;
    if (c.slot_form) {
      a.slot_mapping = slot_dev.data();
    } else {
      a.table.indptr = indptr.data();
      a.table.indices = indices.data();
      a.table.last_page_len = last.data();
      a.table.batch_size = static_cast<std::int32_t>(lengths.size());
      a.table.page_size = c.page_size;
      a.append_indptr = chunk.data();
    }
    REQUIRE(append_kv(a, nullptr).ok());

    HostCache got = image;
    got.k = download(device.k, image.k.size());
    got.v = download(device.v, image.v.size());
    got.k_token_scale = download(device.k_token_scale, image.k_token_scale.size());
    got.v_token_scale = download(device.v_token_scale, image.v_token_scale.size());
    std::vector<bool> vector_written(vectors, false);
    std::size_t bad = 0, exact = 0, checked = 0, scale_bad = 0;
    for (int t = 0; t < num_tokens; ++t) {
      if (!written[static_cast<std::size_t>(t)]) continue;
      for (int h = 0; h < heads; ++h) {
        const std::size_t row = static_cast<std::size_t>(t) * heads + h;
        const std::size_t vector = image.scale_offset(dest_page[t], dest_slot[t], h);
        vector_written[vector] = true;
        for (int is_v = 0; is_v < 2; ++is_v) {
          const double* y = (is_v ? v_ref : k_ref).data() + row * d_dim;
          const double e = (is_v ? v_err : k_err)[row];
          checked += static_cast<std::size_t>(d_dim);
          if (fp4) {
            bad += nvfp4_violations(y, e, d_dim, is_v ? image.v_scale : image.k_scale,
                                    (is_v ? got.v : got.k).data() + vector * vb, exact);
            continue;
          }
          float scale = c.scale_mode == KvScaleMode::none ? 1.0f : is_v ? image.v_scale : image.k_scale;
          if (c.scale_mode == KvScaleMode::per_token) {
            double amax = 0.0;
            for (int d = 0; d < d_dim; ++d) amax = std::max(amax, std::fabs(y[d]));
            scale = (is_v ? got.v_token_scale : got.k_token_scale)[vector];
            const float lo = e == 0.0 ? host_token_scale(c.dtype, static_cast<float>(amax))
                                      : host_token_scale(c.dtype, below(std::max(amax - e, 0.0)));
            const float hi = e == 0.0 ? lo : host_token_scale(c.dtype, above(amax + e));
            scale_bad += !(scale >= lo && scale <= hi);
          }
          bad += scaled_violations(c.dtype, y, e, d_dim, scale, got, is_v != 0, dest_page[t], dest_slot[t], h, exact);
        }
      }
    }
    CHECK(scale_bad == 0);
    CHECK(bad == 0);
    CHECK(checked == static_cast<std::size_t>(std::count(written.begin(), written.end(), true)) * heads * d_dim * 2);
    // The interval is a few FP32 ulps wide: nearly every element is the reference's own code.
    CHECK(static_cast<double>(exact) >= 0.99 * static_cast<double>(checked));
    // Untouched: every byte of the vectors nothing was appended to, and their token scales.
    const std::size_t vector_bytes_stored = fp4 ? vb : static_cast<std::size_t>(d_dim) * static_cast<std::size_t>(element_bytes(c.dtype));
    std::size_t disturbed = 0;
    for (int page = 0; page < table.num_pages; ++page) {
      for (int slot = 0; slot < c.page_size; ++slot) {
        for (int h = 0; h < heads; ++h) {
          const std::size_t vector = image.scale_offset(page, slot, h);
          if (vector_written[vector]) continue;
          const std::size_t start = fp4 ? vector * vb : image.offset(page, slot, h, 0) * static_cast<std::size_t>(element_bytes(c.dtype));
          disturbed += std::memcmp(got.k.data() + start, image.k.data() + start, vector_bytes_stored) != 0;
          disturbed += std::memcmp(got.v.data() + start, image.v.data() + start, vector_bytes_stored) != 0;
          if (c.scale_mode == KvScaleMode::per_token) {
            disturbed += std::memcmp(&got.k_token_scale[vector], &image.k_token_scale[vector], 4) != 0;
            disturbed += std::memcmp(&got.v_token_scale[vector], &image.v_token_scale[vector], 4) != 0;
          }
        }
      }
    }
    CHECK(disturbed == 0);
  }
}

TEST_CASE("rotated append: unsupported head_dim and unknown rotation are refused, nothing written",
          "[attention][append][rotation]") {
  for (const KvDtype dtype : {KvDtype::fp8_e4m3, KvDtype::bf16}) {
    for (const int head_dim : {96, 192, 128}) {
      const int page_size = 16, heads = 2;
      HostCache image(CacheShape{dtype, KvLayout::nhd, KvScaleMode::per_tensor, 2, page_size, heads, head_dim});
      DeviceCache device(image);
      const std::vector<std::uint16_t> rows(static_cast<std::size_t>(heads) * head_dim * 2, 0x3F80);
      auto k_new = upload(rows);
      auto slot_dev = upload(std::vector<std::int64_t>{3, 20});
      AppendArguments a;
      a.cache = device.view;
      a.num_tokens = 2;
      a.k_new = k_new.data();
      a.v_new = k_new.data();
      a.slot_mapping = slot_dev.data();
      const bool supported = head_dim == 128;
      a.rotation = supported ? static_cast<KvRotation>(3) : KvRotation::keys;
      INFO("dtype " << to_string(dtype) << " D " << head_dim);
      const Status status = append_kv(a, nullptr);
      CHECK_FALSE(status.ok());
      CHECK(status.code() == (supported ? StatusCode::invalid_argument : StatusCode::unsupported));
      CHECK_THAT(std::string(status.message()), Catch::Contains("rotation"));
      CHECK(download(device.k, image.k.size()) == image.k);
      CHECK(download(device.v, image.v.size()) == image.v);
    }
  }
}


// ---- rotate_heads -------------------------------------------------------------------------

namespace rotation_test {

/// Half an ulp of the activation type at |x| (subnormals: their fixed spacing).
inline double half_ulp(ActivationDtype t, double x) {
  const int mantissa = t == ActivationDtype::bf16 ? 7 : 10;
  const int min_exp = t == ActivationDtype::bf16 ? -126 : -14;
  const int e = x == 0.0 ? min_exp : std::max(std::ilogb(x), min_exp);
  return std::ldexp(1.0, e - mantissa - 1);
}

/// Rows [tokens][stride] of activation bits: heads x D values, then a gap (NaN bits) to the
/// stride. `values`: what the bits hold.
struct HeadRows {
  std::vector<std::uint16_t> bits;
  std::vector<float> values;
};
inline HeadRows make_head_rows(std::mt19937_64& rng, ActivationDtype type, int tokens, int heads, int d_dim,
                               std::int64_t stride) {
  HeadRows r;
  r.bits.assign(static_cast<std::size_t>(tokens) * static_cast<std::size_t>(stride), 0x7E00);
  r.values.assign(r.bits.size(), 0.0f);
  std::vector<float> row(static_cast<std::size_t>(d_dim));
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      realistic_row(rng, d_dim, row.data(), 2.0f);
      for (int d = 0; d < d_dim; ++d) {
        const std::size_t i = static_cast<std::size_t>(t * stride + h * d_dim + d);
        r.bits[i] = to_activation(type, row[static_cast<std::size_t>(d)]);
        r.values[i] = from_activation(type, r.bits[i]);
      }
    }
  }
  return r;
}

}  // namespace rotation_test

TEST_CASE("rotate_heads: every element is the FP64 rotation rounded once; in place twice gives the input back",
          "[attention][rotation]") {
  auto rng = slimserve_test::make_rng(2532);
  for (const ActivationDtype type : {ActivationDtype::bf16, ActivationDtype::fp16}) {
    for (const int d_dim : {64, 128, 256}) {
      for (const int tokens : {1, 7, 33}) {
        const int heads = 3;
        const std::int64_t row = static_cast<std::int64_t>(heads) * d_dim;
        const std::int64_t in_stride = row + 8 * (tokens % 3), out_stride = row + 16;  // strided views
        INFO("dtype " << to_string(type) << " D " << d_dim << " tokens " << tokens);
        const HeadRows x = make_head_rows(rng, type, tokens, heads, d_dim, in_stride);
        std::vector<std::uint16_t> poison(static_cast<std::size_t>(tokens * out_stride), 0x7C01);
        auto in = upload(x.bits);
        auto out = upload(poison);
        RotateHeadsArguments a;
        a.input = in.data();
        a.output = out.data();
        a.dtype = type;
        a.num_tokens = tokens;
        a.num_heads = heads;
        a.head_dim = d_dim;
        a.input_row_stride = in_stride;
        a.output_row_stride = out_stride;
        REQUIRE(rotate_heads(a, nullptr).ok());
        const auto once = download(out, poison.size());
        CHECK(download(in, x.bits.size()) == x.bits);  // the input is read only
        std::size_t bad = 0, gap_bad = 0;
        std::vector<double> y(static_cast<std::size_t>(d_dim));
        for (int t = 0; t < tokens; ++t) {
          for (int h = 0; h < heads; ++h) {
            const double e = hadamard_reference(x.values.data() + t * in_stride + h * d_dim, d_dim, y.data());
            for (int d = 0; d < d_dim; ++d) {
              const float got = from_activation(type, once[static_cast<std::size_t>(t * out_stride + h * d_dim + d)]);
              const float lo = from_activation(type, to_activation(type, below(y[d] - e)));
              const float hi = from_activation(type, to_activation(type, above(y[d] + e)));
              bad += !(got >= lo && got <= hi);
            }
          }
          for (std::int64_t g = row; g < out_stride; ++g) gap_bad += once[static_cast<std::size_t>(t * out_stride + g)] != 0x7C01;
        }
        CHECK(bad == 0);
        CHECK(gap_bad == 0);

        // In place, twice: x back within the two roundings (the first one's error, carried
        // through the orthogonal transform, is at most its L1 norm / sqrt(D) an element).
        RotateHeadsArguments twice = a;
        twice.input = twice.output = in.data();
        twice.output_row_stride = in_stride;
        REQUIRE(rotate_heads(twice, nullptr).ok());
        const auto first = download(in, x.bits.size());
        REQUIRE(rotate_heads(twice, nullptr).ok());
        const auto back = download(in, x.bits.size());
        std::size_t far = 0, gap_moved = 0;
        for (int t = 0; t < tokens; ++t) {
          for (int h = 0; h < heads; ++h) {
            const std::size_t base = static_cast<std::size_t>(t * in_stride + h * d_dim);
            double r1 = 0.0, l1 = 0.0;
            for (int d = 0; d < d_dim; ++d) {
              r1 += half_ulp(type, std::fabs(from_activation(type, first[base + static_cast<std::size_t>(d)])));
              l1 += std::fabs(x.values[base + static_cast<std::size_t>(d)]);
            }
            const double root = std::sqrt(static_cast<double>(d_dim));
            for (int d = 0; d < d_dim; ++d) {
              const double want = x.values[base + static_cast<std::size_t>(d)];
              const double got = from_activation(type, back[base + static_cast<std::size_t>(d)]);
              const double bound = r1 / root + half_ulp(type, std::fabs(got)) + 4.0 * (std::log2(d_dim) + 2.0) * 0x1p-24 * l1;
              far += std::fabs(got - want) > bound;
            }
          }
          for (std::int64_t g = row; g < in_stride; ++g) gap_moved += back[static_cast<std::size_t>(t * in_stride + g)] != 0x7E00;
        }
        CHECK(far == 0);
        CHECK(gap_moved == 0);
      }
    }
  }
}

TEST_CASE("rotation keeps q.k: rotated q against rotated-then-quantized NVFP4 keys, within the quantization error",
          "[attention][append][rotation][nvfp4]") {
  // Keys appended rotated into an NVFP4 cache, queries rotated by rotate_heads (BF16). The
  // rotated product differs from the plain q.k only by the two quantizations: NVFP4's half a
  // code step per element (1.375 steps when saturated) and BF16's half an ulp, plus the FP32
  // rotations' rounding: sum |Hq| kerr + sum qerr |Hk| + sum qerr kerr.
  auto rng = slimserve_test::make_rng(2533);
  for (const int d_dim : {64, 128, 256}) {
    INFO("D " << d_dim);
    const int heads = 2, tokens = 40, page_size = 16, num_pages = 4;
    const auto type = ActivationDtype::bf16;
    const HeadRows k = make_head_rows(rng, type, tokens, heads, d_dim, heads * d_dim);
    const HeadRows q = make_head_rows(rng, type, tokens, heads, d_dim, heads * d_dim);
    std::vector<double> hk(k.values.size()), hq(q.values.size());
    std::vector<double> k_err(static_cast<std::size_t>(tokens * heads)), q_err(k_err.size());
    double amax = 0.0;
    for (std::size_t v = 0; v < k_err.size(); ++v) {
      k_err[v] = hadamard_reference(k.values.data() + v * d_dim, d_dim, hk.data() + v * d_dim);
      q_err[v] = hadamard_reference(q.values.data() + v * d_dim, d_dim, hq.data() + v * d_dim);
      for (int d = 0; d < d_dim; ++d) amax = std::max(amax, std::fabs(hk[v * d_dim + d]));
    }
    const float tensor_scale = static_cast<float>(amax / 2688.0);
    const std::size_t vb = static_cast<std::size_t>(head_vector_bytes(KvDtype::nvfp4, d_dim));
    std::vector<unsigned char> image(static_cast<std::size_t>(num_pages * page_size * heads) * vb, 0);
    auto k_pages = upload(image);
    auto v_pages = upload(image);
    auto scale = upload(std::vector<float>{tensor_scale});
    std::vector<std::int64_t> slots(static_cast<std::size_t>(tokens));
    for (int t = 0; t < tokens; ++t) slots[static_cast<std::size_t>(t)] = (t * 37) % (num_pages * page_size);
    auto slot_dev = upload(slots);
    auto k_new = upload(k.bits);
    AppendArguments a;
    a.cache.k_pages = k_pages.data();
    a.cache.v_pages = v_pages.data();
    a.cache.k_scale = scale.data();
    a.cache.v_scale = scale.data();
    a.cache.num_pages = num_pages;
    a.cache.page_size = page_size;
    a.cache.num_kv_heads = heads;
    a.cache.head_dim = d_dim;
    a.cache.dtype = KvDtype::nvfp4;
    a.cache.scale_mode = KvScaleMode::per_tensor;
    a.input_dtype = type;
    a.num_tokens = tokens;
    a.k_new = k_new.data();
    a.v_new = k_new.data();
    a.slot_mapping = slot_dev.data();
    a.rotation = KvRotation::keys;
    REQUIRE(append_kv(a, nullptr).ok());
    const auto stored = download(k_pages, image.size());
    auto q_dev = upload(q.bits);
    RotateHeadsArguments r;
    r.input = r.output = q_dev.data();
    r.dtype = type;
    r.num_tokens = tokens;
    r.num_heads = heads;
    r.head_dim = d_dim;
    REQUIRE(rotate_heads(r, nullptr).ok());
    const auto q_rot = download(q_dev, q.bits.size());

    std::size_t outside = 0;
    double worst = 0.0;
    for (int qt = 0; qt < tokens; qt += 3) {
      for (int kt = 0; kt < tokens; ++kt) {
        for (int h = 0; h < heads; ++h) {
          const std::size_t qv = static_cast<std::size_t>(qt * heads + h), kv = static_cast<std::size_t>(kt * heads + h);
          const std::uint8_t* vec = stored.data() + static_cast<std::size_t>(slots[static_cast<std::size_t>(kt)] * heads + h) * vb;
          double plain = 0.0, rotated = 0.0, bound = 0.0;
          for (int d = 0; d < d_dim; ++d) {
            const fp8_e4m3 block = fp8_e4m3::from_bits(vec[d_dim / 2 + d / 16]);
            const fp4_e2m1 code = fp4_e2m1::from_bits(static_cast<std::uint8_t>(vec[d / 2] >> (4 * (d % 2))));
            const double k_stored = static_cast<double>(to_float(code)) * to_float(block) * tensor_scale;
            const double q_stored = from_activation(type, q_rot[qv * d_dim + static_cast<std::size_t>(d)]);
            plain += static_cast<double>(q.values[qv * d_dim + d]) * k.values[kv * d_dim + d];
            rotated += q_stored * k_stored;
            const double step = static_cast<double>(to_float(block)) * tensor_scale;
            const double m = std::fabs(hk[kv * d_dim + d]) / step;
            const double kb = step * (m < 2.0 ? 0.25 : m < 4.0 ? 0.5 : 1.0) + 0.375 * step * (m > 6.0) + k_err[kv];
            const double qb = half_ulp(type, std::fabs(q_stored)) + q_err[qv];
            bound += std::fabs(hq[qv * d_dim + d]) * kb + qb * std::fabs(hk[kv * d_dim + d]) + qb * kb;
          }
          outside += std::fabs(rotated - plain) > bound * 1.001 + 1e-9;
          worst = std::max(worst, std::fabs(rotated - plain) / bound);
        }
      }
    }
    INFO("worst |error| / bound " << worst);
    CHECK(outside == 0);
  }
}

TEST_CASE("rotate_heads: bad input is refused by name, nothing written", "[attention][rotation]") {
  const int heads = 2, tokens = 3;
  std::vector<std::uint16_t> poison(static_cast<std::size_t>(tokens * heads * 256 * 2), 0x7C01);
  auto in = upload(poison);
  auto out = upload(poison);
  const auto base = [&] {
    RotateHeadsArguments a;
    a.input = in.data();
    a.output = out.data();
    a.dtype = ActivationDtype::fp16;
    a.num_tokens = tokens;
    a.num_heads = heads;
    a.head_dim = 128;
    return a;
  };
  struct Bad {
    const char* what;
    RotateHeadsArguments args;
    StatusCode code;
  };
  std::vector<Bad> cases;
  auto add = [&](const char* what, auto change, StatusCode code) {
    RotateHeadsArguments a = base();
    change(a);
    cases.push_back({what, a, code});
  };
  add("head_dim", [](RotateHeadsArguments& a) { a.head_dim = 96; }, StatusCode::unsupported);
  add("head_dim", [](RotateHeadsArguments& a) { a.head_dim = 192; }, StatusCode::unsupported);
  add("dtype", [](RotateHeadsArguments& a) { a.dtype = static_cast<ActivationDtype>(7); }, StatusCode::invalid_argument);
  add("input_row_stride", [](RotateHeadsArguments& a) { a.input_row_stride = 2 * 128 - 8; }, StatusCode::invalid_argument);
  add("output_row_stride", [](RotateHeadsArguments& a) { a.output_row_stride = 2 * 128 + 4; }, StatusCode::invalid_argument);
  add("num_heads", [](RotateHeadsArguments& a) { a.num_heads = 0; }, StatusCode::invalid_argument);
  add("num_tokens", [](RotateHeadsArguments& a) { a.num_tokens = -1; }, StatusCode::invalid_argument);
  add("non-null", [](RotateHeadsArguments& a) { a.output = nullptr; }, StatusCode::invalid_argument);
  add("aligned", [&](RotateHeadsArguments& a) { a.output = out.data() + 4; }, StatusCode::invalid_argument);
  add("overlaps", [&](RotateHeadsArguments& a) { a.output = in.data() + 8; }, StatusCode::invalid_argument);
  add("row strides", [&](RotateHeadsArguments& a) {
    a.output = in.data();
    a.output_row_stride = 2 * 128 + 8;
  }, StatusCode::invalid_argument);
  for (const Bad& b : cases) {
    INFO(b.what);
    const Status status = rotate_heads(b.args, nullptr);
    CHECK(status.code() == b.code);
    CHECK_THAT(std::string(status.message()), Catch::Contains(b.what));
  }
  CHECK(download(in, poison.size()) == poison);
  CHECK(download(out, poison.size()) == poison);
}
