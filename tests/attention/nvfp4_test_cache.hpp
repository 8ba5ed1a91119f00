#pragma once
// The host image of an NVFP4 cache for the attention tests (paged attention over NVFP4 pages,
// its fused prefill): the append's block rule through formats/nvfp4.hpp's scalar codec, and
// the stored values decoded in FP64.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention_test_support.hpp"
#include "slimserve/formats/nvfp4.hpp"

namespace attn_test {

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
};

}  // namespace attn_test
