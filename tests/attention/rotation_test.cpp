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
