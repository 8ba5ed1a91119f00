// NVFP4 pages written and read back. Fused quantize-and-append: every code nibble and every
// E4M3 block scale of every appended head vector equals the host image built with nvfp4.hpp's
// scalar rule (block amax, then scale, then codes), every other byte of the poisoned pages is
// untouched, and the decoded values are within the rule's FP64 error bound of the inputs:
// ragged lengths, shuffled pages with holes, both destination forms, both layouts, head_dim
// 64, 128, 192 and 256 (96 is refused: 54-byte vectors), blocks whose scales sit at E4M3's
// extremes (0, subnormal, 448 saturated), NaN and infinite inputs and an invalid device-held
// tensor scale, as nvfp4.hpp documents them. dequantize_pages: every element against the FP64
// decode of random page bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attention_test_support.hpp"
#include "nvfp4_test_cache.hpp"
#include "slimserve/attention/append.hpp"
#include "slimserve/attention/dequantize.hpp"
#include "slimserve/formats/fp4.hpp"
#include "slimserve/formats/nvfp4.hpp"

using namespace attn_test;

namespace {

struct Nvfp4Case {
  KvLayout layout;
  int head_dim;
  int num_kv_heads;
  int page_size;
  ActivationDtype input;
  bool slot_form;
};

std::vector<Nvfp4Case> nvfp4_grid() {
  return {
      {KvLayout::nhd, 128, 2, 16, ActivationDtype::bf16, false},
      {KvLayout::hnd, 64, 3, 32, ActivationDtype::fp16, false},
      {KvLayout::nhd, 256, 1, 16, ActivationDtype::fp16, true},
      {KvLayout::hnd, 64, 5, 16, ActivationDtype::bf16, true},  // 36-byte vectors: not 8-byte aligned
      {KvLayout::nhd, 192, 3, 16, ActivationDtype::bf16, false},
      {KvLayout::hnd, 128, 1, 64, ActivationDtype::fp16, true},
  };
}

std::int64_t vector_bytes(int head_dim) { return head_vector_bytes(KvDtype::nvfp4, head_dim); }

/// New rows [num_tokens, H, D] as activation bits and values. Blocks draw their magnitude from
/// 2^-24 .. 2^12 (in range of the input type) so block scales land anywhere from 0 through
/// E4M3 subnormals to 448 saturated; some blocks are all zero, some hold NaN or +-inf.
struct Rows {
  std::vector<std::uint16_t> bits;
  std::vector<float> values;
};
Rows make_rows(std::mt19937_64& rng, const Nvfp4Case& c, int num_tokens, float tensor_scale) {
  Rows r;
  const auto count = static_cast<std::size_t>(num_tokens) * c.num_kv_heads * c.head_dim;
  r.bits.resize(count);
  r.values.resize(count);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int low_exp = c.input == ActivationDtype::fp16 ? -22 : -40;
  std::uniform_int_distribution<int> exponent(low_exp, 12);
  std::uniform_int_distribution<int> kind(0, 19);
  for (std::size_t block = 0; block < count / 16; ++block) {
    const float magnitude = std::ldexp(1.0f, exponent(rng));
    const int k = kind(rng);
    for (std::size_t i = 0; i < 16; ++i) {
      float x = normal(rng) * magnitude;
      if (k == 0) x = 0.0f;                                                  // scale 0, codes 0
      if (k == 1 && i == 5) x = std::numeric_limits<float>::quiet_NaN();     // block decodes to NaN
      if (k == 2 && i == 9) x = std::numeric_limits<float>::infinity();     // saturates at 448, 6
      if (k == 3 && i % 4 == 0) x = -std::numeric_limits<float>::infinity();
      // The first vector's blocks sit at the scale's extremes for certain: a block amax of
      // 6 * tensor_scale * s gives block scale s: 448 (the largest), 2^-9 (the smallest
      // subnormal), 2^-11 (below half of it: scale 0, codes 0), 2^20 (saturates to 448).
      const float extremes[] = {448.0f, 0x1p-9f, 0x1p-11f, 0x1p20f};
      if (block >= 1 && block <= 4) {
        const float amax = 6.0f * tensor_scale * extremes[block - 1];
        x = i == 3 ? -amax : std::fmod(std::fabs(normal(rng)), 1.0f) * amax;
      }
      const std::size_t e = block * 16 + i;
      r.bits[e] = to_activation(c.input, x);
      r.values[e] = from_activation(c.input, r.bits[e]);  // saturates overflow to inf: a case too
    }
  }
  return r;
}

/// The host image of one head vector with nvfp4.hpp's scalar rule.
void host_vector(const float* x, int head_dim, float tensor_scale, std::uint8_t* out) {
  for (int b = 0; b < head_dim / nvfp4_block_elements; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < nvfp4_block_elements; ++i) {
      const float a = std::fabs(x[b * 16 + i]);
      if (a != a || amax != amax) {
        amax = std::numeric_limits<float>::quiet_NaN();
      } else if (a > amax) {
        amax = a;
      }
    }
    const fp8_e4m3 scale = nvfp4_block_scale(amax, tensor_scale);
    const float multiplier = nvfp4_code_multiplier(scale, tensor_scale);
    for (int i = 0; i < nvfp4_block_elements; i += 2) {
      const std::uint32_t lo = nvfp4_code(x[b * 16 + i], multiplier);
      const std::uint32_t hi = nvfp4_code(x[b * 16 + i + 1], multiplier);
      out[(b * 16 + i) / 2] = static_cast<std::uint8_t>(lo | hi << 4);
    }
    out[head_dim / 2 + b] = scale.bits;
  }
}

/// FP64 check of the rule itself on one stored vector: a NaN block decodes to NaN; a finite
/// block's values are within half a code step of x / step (the E2M1 grid: step 0.5 up to 2,
/// 1 up to 4, 2 up to 6) or saturated at +-6 steps; a zero scale stores zeros.
std::size_t rule_violations(const float* x, const std::uint8_t* stored, int head_dim, float tensor_scale) {
  std::size_t bad = 0;
  for (int b = 0; b < head_dim / 16; ++b) {
    const fp8_e4m3 scale = fp8_e4m3::from_bits(stored[head_dim / 2 + b]);
    const double step = static_cast<double>(to_float(scale)) * tensor_scale;
    bool nan_in = false;
    for (int i = 0; i < 16; ++i) nan_in |= std::isnan(x[b * 16 + i]);
    for (int i = 0; i < 16; ++i) {
      const int e = b * 16 + i;
      const fp4_e2m1 code = fp4_e2m1::from_bits(static_cast<std::uint8_t>(stored[e / 2] >> (4 * (e % 2))));
      const double decoded = static_cast<double>(nvfp4_decode(code, scale, tensor_scale));
      if (nan_in) {
        bad += !std::isnan(decoded);
        continue;
      }
      if (step == 0.0) {
        bad += decoded != 0.0;
        continue;
      }
      const double q = static_cast<double>(x[e]) / step;  // +-inf for an infinite input
      const double d = decoded / step;
      const double a = std::fabs(q);
      const double half = a <= 2.0 ? 0.25 : a <= 4.0 ? 0.5 : 1.0;
      // The code itself is +-6 (0x7 / 0xF) for a saturated element; d carries the tensor
      // scale's FP32 rounding.
      const bool saturated = a >= 6.0 && (code.bits & 0x7) == 0x7 && ((code.bits & 0x8) != 0) == (q < 0);
      bad += !(saturated || std::fabs(q - d) <= half * (1.0 + 1e-6));
    }
  }
  return bad;
}

struct Fixture {
  Nvfp4Case c;
  HostPageTable table;
  std::int32_t num_pages = 0;
  std::vector<unsigned char> k_pages, v_pages;  // poisoned images
};

/// A packed NVFP4 cache view over device K/V pages and their two device tensor scales.
PagedKVCacheView nvfp4_view(void* k_pages, void* v_pages, const float* scales, std::int32_t num_pages,
                            std::int32_t page_size, std::int32_t heads, std::int32_t head_dim, KvLayout layout) {
  PagedKVCacheView cache;
  cache.k_pages = k_pages;
  cache.v_pages = v_pages;
  cache.k_scale = scales;
  cache.v_scale = scales + 1;
  cache.num_pages = num_pages;
  cache.page_size = page_size;
  cache.num_kv_heads = heads;
  cache.head_dim = head_dim;
  cache.dtype = KvDtype::nvfp4;
  cache.layout = layout;
  cache.scale_mode = KvScaleMode::per_tensor;
  return cache;
}

}  // namespace

TEST_CASE("NVFP4 append: codes and block scales equal the scalar rule's, neighbours untouched",
          "[attention][append][nvfp4]") {
  auto rng = slimserve_test::make_rng(2501);
  int case_index = 0;
  for (const Nvfp4Case& c : nvfp4_grid()) {
    // Every other case writes one combined K/V allocation (vLLM's blocks: K page, V page),
    // pages 2 * page_bytes apart.
    const bool combined = case_index++ % 2 == 1;
    INFO("layout " << to_string(c.layout) << " D " << c.head_dim << " H " << c.num_kv_heads << " page "
                   << c.page_size << " input " << to_string(c.input) << (c.slot_form ? " slot form" : " chunk form")
                   << (combined ? " combined K/V pages" : ""));
    const std::int64_t ps = c.page_size;
    // Lengths after the append: 1, page-1, page, page+1, long; each appends its last tokens.
    const std::vector<std::int64_t> lengths = {1, ps - 1, ps, ps + 1, 3 * ps + 5};
    const std::vector<std::int32_t> appended = {1, 3, static_cast<std::int32_t>(ps), 2, static_cast<std::int32_t>(2 * ps + 1)};
    const HostPageTable table = make_page_table(lengths, c.page_size, rng, false);
    std::vector<std::int32_t> append_indptr{0};
    for (const auto n : appended) append_indptr.push_back(append_indptr.back() + n);
    const int num_tokens = append_indptr.back();
    const float k_scale = std::ldexp(1.0f, -7), v_scale = 0.0123f;  // decode-side tensor scales
    const Rows k = make_rows(rng, c, num_tokens, k_scale);
    const Rows v = make_rows(rng, c, num_tokens, v_scale);

    const std::size_t page_bytes = static_cast<std::size_t>(ps) * c.num_kv_heads * vector_bytes(c.head_dim);
    std::vector<unsigned char> k_image(page_bytes * table.num_pages), v_image(page_bytes * table.num_pages);
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto& b : k_image) b = static_cast<unsigned char>(byte(rng));
    for (auto& b : v_image) b = static_cast<unsigned char>(byte(rng));
    // The combined image: page p's K at 2 p pages, its V one page later.
    std::vector<unsigned char> kv_image(2 * k_image.size());
    for (std::size_t p = 0; p < static_cast<std::size_t>(table.num_pages); ++p) {
      std::copy_n(k_image.begin() + static_cast<std::ptrdiff_t>(p * page_bytes), page_bytes,
                  kv_image.begin() + static_cast<std::ptrdiff_t>(2 * p * page_bytes));
      std::copy_n(v_image.begin() + static_cast<std::ptrdiff_t>(p * page_bytes), page_bytes,
                  kv_image.begin() + static_cast<std::ptrdiff_t>((2 * p + 1) * page_bytes));
    }
    auto k_dev = upload(combined ? kv_image : k_image);
    auto v_dev = upload(v_image);
    auto scales = upload(std::vector<float>{k_scale, v_scale});

    // Destinations: the chunk form's, and the same as slots (plus skipped ones: -1, and a page
    // past the cache) for the slot form.
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
    auto k_new = upload(k.bits);
    auto v_new = upload(v.bits);

    AppendArguments a;
    a.cache.k_pages = k_dev.data();
    a.cache.v_pages = combined ? k_dev.data() + page_bytes : v_dev.data();
    if (combined) a.cache.page_stride = static_cast<std::int64_t>(2 * page_bytes);  // bytes: nvfp4's storage
    a.cache.k_scale = scales.data();
    a.cache.v_scale = scales.data() + 1;
    a.cache.num_pages = table.num_pages;
    a.cache.page_size = c.page_size;
    a.cache.num_kv_heads = c.num_kv_heads;
    a.cache.head_dim = c.head_dim;
    a.cache.dtype = KvDtype::nvfp4;
    a.cache.layout = c.layout;
    a.cache.scale_mode = KvScaleMode::per_tensor;
    a.input_dtype = c.input;
    a.num_tokens = num_tokens;
    a.k_new = k_new.data();
    a.v_new = v_new.data();
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

    // The expected image: the poison, with every written head vector replaced by the rule's.
    const auto vb = static_cast<std::size_t>(vector_bytes(c.head_dim));
    std::size_t rule_bad = 0;
    for (int t = 0; t < num_tokens; ++t) {
      if (!written[static_cast<std::size_t>(t)]) continue;
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const auto vector = static_cast<std::size_t>(
            cache_offset(c.layout, c.page_size, c.num_kv_heads, 1, dest_page[t], dest_slot[t], h, 0));
        const std::size_t row = (static_cast<std::size_t>(t) * c.num_kv_heads + h) * c.head_dim;
        host_vector(k.values.data() + row, c.head_dim, k_scale, k_image.data() + vector * vb);
        host_vector(v.values.data() + row, c.head_dim, v_scale, v_image.data() + vector * vb);
        rule_bad += rule_violations(k.values.data() + row, k_image.data() + vector * vb, c.head_dim, k_scale);
        rule_bad += rule_violations(v.values.data() + row, v_image.data() + vector * vb, c.head_dim, v_scale);
      }
    }
    CHECK(rule_bad == 0);
    // The scale bytes cover E4M3's extremes: 0, the smallest subnormal, 448, NaN.
    bool seen[256] = {};
    for (int t = 0; t < num_tokens; ++t) {
      if (!written[static_cast<std::size_t>(t)]) continue;
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const auto vector = static_cast<std::size_t>(
            cache_offset(c.layout, c.page_size, c.num_kv_heads, 1, dest_page[t], dest_slot[t], h, 0));
        for (int b = 0; b < c.head_dim / 16; ++b) seen[k_image[vector * vb + static_cast<std::size_t>(c.head_dim / 2 + b)]] = true;
      }
    }
    CHECK((seen[0x00] && seen[0x01] && seen[0x7E] && seen[nvfp4_nan_scale_code]));
    std::vector<unsigned char> k_out, v_out;
    if (combined) {
      const auto kv_out = download(k_dev, kv_image.size());
      for (std::size_t p = 0; p < static_cast<std::size_t>(table.num_pages); ++p) {
        const auto page_k = kv_out.begin() + static_cast<std::ptrdiff_t>(2 * p * page_bytes);
        k_out.insert(k_out.end(), page_k, page_k + static_cast<std::ptrdiff_t>(page_bytes));
        v_out.insert(v_out.end(), page_k + static_cast<std::ptrdiff_t>(page_bytes),
                     page_k + static_cast<std::ptrdiff_t>(2 * page_bytes));
      }
    } else {
      k_out = download(k_dev, k_image.size());
      v_out = download(v_dev, v_image.size());
    }
    std::size_t k_diff = 0, v_diff = 0;
    for (std::size_t i = 0; i < k_out.size(); ++i) k_diff += k_out[i] != k_image[i];
    for (std::size_t i = 0; i < v_out.size(); ++i) v_diff += v_out[i] != v_image[i];
    CHECK(k_diff == 0);
    CHECK(v_diff == 0);
  }
}

TEST_CASE("NVFP4 append: an invalid device-held tensor scale makes every block scale NaN",
          "[attention][append][nvfp4]") {
  // The host cannot read a device value: a 0, negative, infinite or NaN tensor scale, or one
  // above the format's domain, is made visible (every block decodes to NaN, codes are signed
  // zeros) instead of rescaling.
  auto rng = slimserve_test::make_rng(2502);
  const Nvfp4Case c{KvLayout::nhd, 64, 2, 16, ActivationDtype::bf16, true};
  const Rows k = make_rows(rng, c, 3, 1.0f);
  for (const float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                          nvfp4_above_domain_scale}) {
    INFO("tensor scale " << bad);
    std::vector<unsigned char> image(static_cast<std::size_t>(2 * 16 * 2 * vector_bytes(64)), 0xA5);
    auto k_dev = upload(image);
    auto v_dev = upload(image);
    auto scales = upload(std::vector<float>{bad, bad});
    auto slot_dev = upload(std::vector<std::int64_t>{0, 17, 5});
    auto rows = upload(k.bits);
    AppendArguments a;
    a.cache.k_pages = k_dev.data();
    a.cache.v_pages = v_dev.data();
    a.cache.k_scale = scales.data();
    a.cache.v_scale = scales.data() + 1;
    a.cache.num_pages = 2;
    a.cache.page_size = 16;
    a.cache.num_kv_heads = 2;
    a.cache.head_dim = 64;
    a.cache.dtype = KvDtype::nvfp4;
    a.cache.scale_mode = KvScaleMode::per_tensor;
    a.input_dtype = c.input;
    a.num_tokens = 3;
    a.k_new = rows.data();
    a.v_new = rows.data();
    a.slot_mapping = slot_dev.data();
    REQUIRE(append_kv(a, nullptr).ok());
    const auto out = download(k_dev, image.size());
    const std::size_t vb = static_cast<std::size_t>(vector_bytes(64));
    std::size_t not_nan = 0, not_zero = 0;
    for (const int slot : {0, 17, 5}) {
      for (int h = 0; h < 2; ++h) {
        const std::size_t base = (static_cast<std::size_t>(slot) * 2 + static_cast<std::size_t>(h)) * vb;
        for (std::size_t i = 0; i < 32; ++i) not_zero += (out[base + i] & 0x77) != 0;  // signed zeros
        for (std::size_t b = 0; b < 4; ++b) not_nan += out[base + 32 + b] != nvfp4_nan_scale_code;
      }
    }
    CHECK(not_nan == 0);
    CHECK(not_zero == 0);
  }
}

TEST_CASE("NVFP4 dequantize_pages: every element is the FP64 decode of the stored bytes", "[attention][dequantize][nvfp4]") {
  // Random page bytes (any code, any scale byte, NaN scales included), listed pages shuffled
  // with a repeat and one outside the cache (NaN page); outputs poisoned first.
  auto rng = slimserve_test::make_rng(2503);
  for (const KvLayout layout : {KvLayout::nhd, KvLayout::hnd}) {
    for (const int head_dim : {64, 128, 192, 256}) {
      INFO("layout " << to_string(layout) << " D " << head_dim);
      const int page_size = 16, heads = 3, num_pages = 5;
      const auto vb = static_cast<std::size_t>(vector_bytes(head_dim));
      const std::size_t page_bytes = static_cast<std::size_t>(page_size) * heads * vb;
      std::vector<unsigned char> k_image(page_bytes * num_pages), v_image(page_bytes * num_pages);
      std::uniform_int_distribution<int> byte(0, 255);
      for (auto& b : k_image) b = static_cast<unsigned char>(byte(rng));
      for (auto& b : v_image) b = static_cast<unsigned char>(byte(rng));
      const float k_scale = 0.37f, v_scale = std::ldexp(1.0f, -12);
      const std::vector<std::int32_t> listed = {3, 0, 4, 3, num_pages + 2, 1};
      auto k_dev = upload(k_image);
      auto v_dev = upload(v_image);
      auto scales = upload(std::vector<float>{k_scale, v_scale});
      auto ids = upload(listed);
      const std::size_t out_count = listed.size() * static_cast<std::size_t>(page_size) * heads * head_dim;
      auto k_out = upload(std::vector<std::uint16_t>(out_count, 0x7F7Fu));
      auto v_out = upload(std::vector<std::uint16_t>(out_count, 0x7F7Fu));
      const PagedKVCacheView cache = nvfp4_view(k_dev.data(), v_dev.data(), scales.data(), num_pages, page_size, heads, head_dim, layout);
      REQUIRE(dequantize_pages(cache, ids.data(), static_cast<std::int32_t>(listed.size()),
                               reinterpret_cast<bf16*>(k_out.data()), reinterpret_cast<bf16*>(v_out.data()), nullptr)
                  .ok());
      std::size_t mismatches = 0;
      for (int which = 0; which < 2; ++which) {
        const auto& image = which == 0 ? k_image : v_image;
        const float tensor = which == 0 ? k_scale : v_scale;
        const auto out = download(which == 0 ? k_out : v_out, out_count);
        for (std::size_t l = 0; l < listed.size(); ++l) {
          for (int slot = 0; slot < page_size; ++slot) {
            for (int h = 0; h < heads; ++h) {
              const std::size_t dst = ((l * page_size + static_cast<std::size_t>(slot)) * heads + static_cast<std::size_t>(h)) * head_dim;
              const bool valid = listed[l] >= 0 && listed[l] < num_pages;
              const std::uint8_t* vector =
                  valid ? image.data() + static_cast<std::size_t>(cache_offset(layout, page_size, heads, 1, listed[l], slot, h, 0)) * vb
                        : nullptr;
              for (int d = 0; d < head_dim; ++d) {
                const float got = to_float(bf16::from_bits(out[dst + static_cast<std::size_t>(d)]));
                if (!valid) {
                  mismatches += !std::isnan(got);
                  continue;
                }
                // FP64: e2m1 * e4m3 * tensor scale, exact; the kernel rounds it to FP32, then BF16.
                const std::uint8_t scale_bits = vector[head_dim / 2 + d / 16];
                const double code = to_float(fp4_e2m1::from_bits(static_cast<std::uint8_t>(vector[d / 2] >> (4 * (d % 2)))));
                const double exact = code * static_cast<double>(to_float(fp8_e4m3::from_bits(scale_bits))) * tensor;
                const float expected = to_float(from_float<bf16>(static_cast<float>(exact)));
                if (std::isnan(expected)) {
                  mismatches += !std::isnan(got);
                } else {
                  mismatches += got != expected;
                  mismatches += std::fabs(static_cast<double>(got) - exact) > std::fabs(exact) * 0x1p-8;
                }
              }
            }
          }
        }
      }
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("NVFP4 dequantize_pages: a tensor scale outside the format's domain gives NaN elements",
          "[attention][dequantize][nvfp4]") {
  // As every reader: the append would have made such a cache's blocks NaN, and a scale that
  // went bad afterwards must not rescale the stored values silently. Random bytes with no NaN
  // block scale, so only the tensor scale can make an element NaN.
  auto rng = slimserve_test::make_rng(2504);
  const int page_size = 16, heads = 2, head_dim = 128, num_pages = 3;
  const auto vb = static_cast<std::size_t>(vector_bytes(head_dim));
  std::vector<unsigned char> image(static_cast<std::size_t>(page_size) * heads * vb * num_pages);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : image) b = static_cast<unsigned char>(byte(rng));
  for (std::size_t v = 0; v < image.size() / vb; ++v) {
    for (std::size_t s = head_dim / 2; s < vb; ++s) {
      image[v * vb + s] = static_cast<unsigned char>(image[v * vb + s] & 0x3Fu);  // finite E4M3 scales
    }
  }
  for (const float bad : {nvfp4_above_domain_scale, std::numeric_limits<float>::max(), -0.5f, 0.0f}) {
    INFO("tensor scale " << bad);
    auto k_dev = upload(image);
    auto v_dev = upload(image);
    auto scales = upload(std::vector<float>{bad, 0.25f});  // K bad, V good: only K's elements are NaN
    const std::vector<std::int32_t> listed = {2, 0};
    auto ids = upload(listed);
    const std::size_t out_count = listed.size() * static_cast<std::size_t>(page_size) * heads * head_dim;
    auto k_out = upload(std::vector<std::uint16_t>(out_count, 0x3F80u));  // poisoned with 1.0
    auto v_out = upload(std::vector<std::uint16_t>(out_count, 0x7FC1u));  // poisoned with NaN
    const PagedKVCacheView cache = nvfp4_view(k_dev.data(), v_dev.data(), scales.data(), num_pages, page_size, heads, head_dim, KvLayout::nhd);
    REQUIRE(dequantize_pages(cache, ids.data(), static_cast<std::int32_t>(listed.size()),
                             reinterpret_cast<bf16*>(k_out.data()), reinterpret_cast<bf16*>(v_out.data()), nullptr)
                .ok());
    std::size_t k_not_nan = 0, v_nan = 0;
    for (const std::uint16_t bits : download(k_out, out_count)) k_not_nan += !std::isnan(to_float(bf16::from_bits(bits)));
    for (const std::uint16_t bits : download(v_out, out_count)) v_nan += std::isnan(to_float(bf16::from_bits(bits)));
    CHECK(k_not_nan == 0);
    CHECK(v_nan == 0);
  }
}
