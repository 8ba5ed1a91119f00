#pragma once
// The host image of an NVFP4 cache for the attention tests (paged attention over NVFP4 pages,
// its fused prefill, the CUDA-core decode): the append's block rule through formats/nvfp4.hpp's scalar codec, and
// the stored values decoded in FP64.

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "attention_test_support.hpp"
#include "slimserve/formats/nvfp4.hpp"

namespace attn_test {

/// The smallest tensor scale above NVFP4's domain, written from the format's rule (FLT_MAX / 2^14,
/// so that a reader's widening unit 2^14 times the scale is finite), not from the code's
/// constant: the append and every reader must treat it as invalid (NaN blocks, NaN rows).
inline const float nvfp4_above_domain_scale = std::nextafter(std::ldexp(FLT_MAX, -14), INFINITY);

/// An NVFP4 cache image: head vectors of head_dim / 2 code bytes then head_dim / 16 E4M3
/// scales, 0xFF everywhere nothing was stored (scale 0xFF is the E4M3 NaN: a read of an unowned
/// slot makes its row NaN).
struct Nvfp4HostCache {
  KvLayout layout;
  std::int32_t num_pages, page_size, num_kv_heads, head_dim;
  std::vector<unsigned char> k, v;
  float k_scale = 1.0f, v_scale = 1.0f;  // per-tensor FP32 scales

  Nvfp4HostCache(KvLayout l, std::int32_t pages, std::int32_t ps, std::int32_t heads, std::int32_t d)
      : layout(l), num_pages(pages), page_size(ps), num_kv_heads(heads), head_dim(d) {
    k.assign(static_cast<std::size_t>(pages) * ps * heads * vector_bytes(), 0xFF);
    v = k;
  }
  std::size_t vector_bytes() const { return static_cast<std::size_t>(head_dim) * 9 / 16; }
  std::size_t vector_at(int page, int slot, int head) const {
    return static_cast<std::size_t>(cache_offset(layout, page_size, num_kv_heads, 1, page, slot, head, 0)) *
           vector_bytes();
  }
  /// Quantizes one head vector with the host codec (the append's rule).
  void store(bool is_v, int page, int slot, int head, const float* x) {
    unsigned char* vec = (is_v ? v : k).data() + vector_at(page, slot, head);
    const float ts = is_v ? v_scale : k_scale;
    for (int b = 0; b < head_dim / nvfp4_block_elements; ++b) {
      float amax = 0.0f;
      for (int i = 0; i < nvfp4_block_elements; ++i) amax = std::max(amax, std::fabs(x[16 * b + i]));
      const fp8_e4m3 scale = nvfp4_block_scale(amax, ts);
      const float multiplier = nvfp4_code_multiplier(scale, ts);
      for (int i = 0; i < nvfp4_block_elements; i += 2) {
        const std::uint32_t lo = nvfp4_code(x[16 * b + i], multiplier);
        const std::uint32_t hi = nvfp4_code(x[16 * b + i + 1], multiplier);
        vec[8 * b + i / 2] = static_cast<unsigned char>((lo & 0xF) | (hi & 0xF) << 4);
      }
      vec[head_dim / 2 + b] = scale.bits;
    }
  }
  /// The stored value, decoded in FP64 from the bytes.
  double real(bool is_v, int page, int slot, int head, int d) const {
    const unsigned char* vec = (is_v ? v : k).data() + vector_at(page, slot, head);
    const auto code = fp4_e2m1::from_bits(static_cast<std::uint8_t>(vec[d / 2] >> (4 * (d % 2)) & 0xF));
    const auto scale = fp8_e4m3::from_bits(vec[head_dim / 2 + d / nvfp4_block_elements]);
    return static_cast<double>(to_float(code)) * static_cast<double>(to_float(scale)) *
           static_cast<double>(is_v ? v_scale : k_scale);
  }
  /// Realistic rows (outlier channels) in every slot the first lengths[b] positions own (a
  /// shared page once), tensor scales from their amax (the largest block scale near 448).
  void fill(const HostPageTable& table, const std::vector<std::int64_t>& lengths, std::mt19937_64& rng) {
    struct Row { int page, slot, head; std::vector<float> k, v; };
    std::vector<Row> rows;
    std::vector<bool> seen(static_cast<std::size_t>(num_pages) * page_size, false);
    float k_amax = 0.0f, v_amax = 0.0f;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      const auto pages = table.pages_of(b);
      for (std::int64_t p = 0; p < lengths[b]; ++p) {
        const int page = pages[static_cast<std::size_t>(p / page_size)];
        const int slot = static_cast<int>(p % page_size);
        const auto owned = static_cast<std::size_t>(page) * page_size + slot;
        if (seen[owned]) continue;
        seen[owned] = true;
        for (int h = 0; h < num_kv_heads; ++h) {
          Row r{page, slot, h, std::vector<float>(static_cast<std::size_t>(head_dim)),
                std::vector<float>(static_cast<std::size_t>(head_dim))};
          realistic_row(rng, head_dim, r.k.data(), 1.0f);
          realistic_row(rng, head_dim, r.v.data(), 0.5f);
          for (int d = 0; d < head_dim; ++d) {
            k_amax = std::max(k_amax, std::fabs(r.k[static_cast<std::size_t>(d)]));
            v_amax = std::max(v_amax, std::fabs(r.v[static_cast<std::size_t>(d)]));
          }
          rows.push_back(std::move(r));
        }
      }
    }
    k_scale = k_amax / 2688.0f;
    v_scale = v_amax / 2688.0f;
    for (const Row& r : rows) {
      store(false, r.page, r.slot, r.head, r.k.data());
      store(true, r.page, r.slot, r.head, r.v.data());
    }
  }
};

}  // namespace attn_test
