#pragma once
// Shared pieces of the attention kernel tests: a host model of a paged cache (quantized with
// the formats API, so references start from exactly the stored values), page tables with
// shuffled pages, holes and shared pages, device upload helpers, and the FP64 reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/runtime/memory.hpp"
#include "support/random.hpp"

namespace attn_test {

using namespace slimserve;
using namespace slimserve::attention;

template <class T>
rt::DeviceBuffer<T> upload(const std::vector<T>& host) {
  auto buffer = rt::DeviceBuffer<T>::create(std::max<std::size_t>(host.size(), 1));
  REQUIRE(buffer.ok());
  REQUIRE(buffer->upload(std::span<const T>(host)).ok());
  return std::move(*buffer);
}
template <class T>
std::vector<T> download(const rt::DeviceBuffer<T>& buffer, std::size_t count) {
  std::vector<T> host(count);
  REQUIRE(buffer.download(std::span<T>(host)).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  return host;
}

/// Stored bits of a value in the cache type (saturating RNE, per the formats API).
inline std::uint16_t quantize(KvDtype dtype, float x) {
  switch (dtype) {
    // 16-bit caches saturate too (the kernel clamps before converting; ±inf would poison rows).
    case KvDtype::bf16:
      return from_float<bf16>(std::isnan(x) ? x : std::clamp(x, -format_traits<bf16>::max_finite,
                                                             format_traits<bf16>::max_finite)).bits;
    case KvDtype::fp16:
      return from_float<fp16>(std::isnan(x) ? x : std::clamp(x, -format_traits<fp16>::max_finite,
                                                             format_traits<fp16>::max_finite)).bits;
    case KvDtype::fp8_e4m3: return from_float<fp8_e4m3>(x).bits;
    case KvDtype::fp8_e5m2: return from_float<fp8_e5m2>(x).bits;
  }
  return 0;
}
inline float dequantize(KvDtype dtype, std::uint16_t bits) {
  switch (dtype) {
    case KvDtype::bf16: return to_float(bf16::from_bits(bits));
    case KvDtype::fp16: return to_float(fp16::from_bits(bits));
    case KvDtype::fp8_e4m3: return to_float(fp8_e4m3::from_bits(static_cast<std::uint8_t>(bits)));
    case KvDtype::fp8_e5m2: return to_float(fp8_e5m2::from_bits(static_cast<std::uint8_t>(bits)));
  }
  return 0;
}
inline float format_max(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::bf16: return format_traits<bf16>::max_finite;
    case KvDtype::fp16: return format_traits<fp16>::max_finite;
    case KvDtype::fp8_e4m3: return format_traits<fp8_e4m3>::max_finite;
    case KvDtype::fp8_e5m2: return format_traits<fp8_e5m2>::max_finite;
  }
  return 0;
}
/// Activation values as the kernels see them.
inline std::uint16_t to_activation(ActivationDtype t, float x) {
  return t == ActivationDtype::bf16 ? from_float<bf16>(x).bits : from_float<fp16>(x).bits;
}
inline float from_activation(ActivationDtype t, std::uint16_t bits) {
  return t == ActivationDtype::bf16 ? to_float(bf16::from_bits(bits)) : to_float(fp16::from_bits(bits));
}

struct CacheShape {
  KvDtype dtype = KvDtype::fp8_e4m3;
  KvLayout layout = KvLayout::nhd;
  KvScaleMode scale_mode = KvScaleMode::per_tensor;
  std::int32_t num_pages = 0;
  std::int32_t page_size = 16;
  std::int32_t num_kv_heads = 1;
  std::int32_t head_dim = 128;
};

/// A cache image on the host; all bytes start as NaN of the format (poison).
struct HostCache {
  CacheShape shape;
  std::vector<unsigned char> k, v;  // raw element bytes
  std::vector<float> k_token_scale, v_token_scale;
  float k_scale = 1.0f, v_scale = 1.0f;

  explicit HostCache(const CacheShape& s) : shape(s) {
    const std::size_t elements = elements_total();
    k.assign(elements * static_cast<std::size_t>(element_bytes(s.dtype)), 0xFF);
    v = k;
    const std::size_t tokens = static_cast<std::size_t>(s.num_pages) * static_cast<std::size_t>(s.page_size) *
                               static_cast<std::size_t>(s.num_kv_heads);
    k_token_scale.assign(tokens, std::numeric_limits<float>::quiet_NaN());
    v_token_scale = k_token_scale;
  }
  std::size_t elements_total() const {
    return static_cast<std::size_t>(shape.num_pages) * static_cast<std::size_t>(shape.page_size) *
           static_cast<std::size_t>(shape.num_kv_heads) * static_cast<std::size_t>(shape.head_dim);
  }
  std::size_t offset(int page, int slot, int head, int d) const {
    return static_cast<std::size_t>(cache_offset(shape.layout, shape.page_size, shape.num_kv_heads,
                                                 shape.head_dim, page, slot, head, d));
  }
  std::size_t scale_offset(int page, int slot, int head) const {
    return static_cast<std::size_t>(cache_offset(shape.layout, shape.page_size, shape.num_kv_heads, 1,
                                                 page, slot, head, 0));
  }
  std::uint16_t bits(const std::vector<unsigned char>& data, std::size_t i) const {
    std::uint16_t b = 0;
    std::memcpy(&b, data.data() + i * static_cast<std::size_t>(element_bytes(shape.dtype)),
                static_cast<std::size_t>(element_bytes(shape.dtype)));
    return b;
  }
  void set_bits(std::vector<unsigned char>& data, std::size_t i, std::uint16_t b) {
    std::memcpy(data.data() + i * static_cast<std::size_t>(element_bytes(shape.dtype)), &b,
                static_cast<std::size_t>(element_bytes(shape.dtype)));
  }
  float scale_of(bool is_v, int page, int slot, int head) const {
    switch (shape.scale_mode) {
      case KvScaleMode::none: return 1.0f;
      case KvScaleMode::per_tensor: return is_v ? v_scale : k_scale;
      case KvScaleMode::per_token:
        return (is_v ? v_token_scale : k_token_scale)[scale_offset(page, slot, head)];
    }
    return 1.0f;
  }
  /// Real value of a stored element (what the reference attends over).
  double real(bool is_v, int page, int slot, int head, int d) const {
    return static_cast<double>(dequantize(shape.dtype, bits(is_v ? v : k, offset(page, slot, head, d)))) *
           static_cast<double>(scale_of(is_v, page, slot, head));
  }
  /// Quantizes one token-head vector of real values into the slot (the append semantics).
  void store(bool is_v, int page, int slot, int head, const float* values) {
    float scale = is_v ? v_scale : k_scale;
    if (shape.scale_mode == KvScaleMode::none) scale = 1.0f;
    if (shape.scale_mode == KvScaleMode::per_token) {
      float amax = 0.0f;
      for (int d = 0; d < shape.head_dim; ++d) amax = std::max(amax, std::fabs(values[d]));
      scale = amax / format_max(shape.dtype);
      if (!(scale > 0.0f) || !std::isfinite(scale)) scale = 1.0f;
      (is_v ? v_token_scale : k_token_scale)[scale_offset(page, slot, head)] = scale;
    }
    for (int d = 0; d < shape.head_dim; ++d) {
      set_bits(is_v ? v : k, offset(page, slot, head, d), quantize(shape.dtype, values[d] / scale));
    }
  }
};

/// Device copy of a HostCache plus the view that points into it.
struct DeviceCache {
  rt::DeviceBuffer<unsigned char> k, v;
  rt::DeviceBuffer<float> k_token_scale, v_token_scale, scales;
  PagedKVCacheView view;
  explicit DeviceCache(const HostCache& host) {
    k = upload(host.k);
    v = upload(host.v);
    k_token_scale = upload(host.k_token_scale);
    v_token_scale = upload(host.v_token_scale);
    scales = upload(std::vector<float>{host.k_scale, host.v_scale});
    view.k_pages = k.data();
    view.v_pages = v.data();
    view.k_scale = scales.data();
    view.v_scale = scales.data() + 1;
    view.k_token_scales = k_token_scale.data();
    view.v_token_scales = v_token_scale.data();
    view.num_pages = host.shape.num_pages;
    view.page_size = host.shape.page_size;
    view.num_kv_heads = host.shape.num_kv_heads;
    view.head_dim = host.shape.head_dim;
    view.dtype = host.shape.dtype;
    view.layout = host.shape.layout;
    view.scale_mode = host.shape.scale_mode;
  }
};

/// CSR page table on the host: requests draw pages from a shuffled pool that has holes
/// (pages nobody owns) and, when asked, the last request shares the full pages of the earlier
/// request that has the most of them (a shared prefix), then gets its own pages.
struct HostPageTable {
  std::vector<std::int32_t> indptr{0}, indices, last_page_len;
  std::vector<std::int64_t> lengths;
  std::int32_t num_pages = 0;
  std::int64_t shared_pages = 0;
  std::int64_t length(std::size_t b) const { return lengths[b]; }
  std::vector<std::int32_t> pages_of(std::size_t b) const {
    return {indices.begin() + indptr[b], indices.begin() + indptr[b + 1]};
  }
};

inline HostPageTable make_page_table(const std::vector<std::int64_t>& lengths, std::int32_t page_size,
                                     std::mt19937_64& rng, bool share_prefix) {
  HostPageTable t;
  t.lengths = lengths;
  std::int64_t needed = 0;
  for (auto len : lengths) needed += (len + page_size - 1) / page_size;
  t.num_pages = static_cast<std::int32_t>(needed + needed / 3 + 3);  // a third more: holes
  std::vector<std::int32_t> pool(static_cast<std::size_t>(t.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  // Donor of the shared prefix: the earlier request with the most full pages.
  std::size_t donor = 0;
  for (std::size_t b = 1; b + 1 < lengths.size(); ++b) {
    if (lengths[b] / page_size > lengths[donor] / page_size) donor = b;
  }
  std::size_t next = 0;
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    const auto pages = static_cast<std::int32_t>((lengths[b] + page_size - 1) / page_size);
    std::int64_t shared = 0;
    if (share_prefix && lengths.size() > 1 && b + 1 == lengths.size()) {
      shared = std::min<std::int64_t>(lengths[donor] / page_size, pages - 1);
      shared = std::max<std::int64_t>(shared, 0);
      t.shared_pages = shared;
    }
    for (std::int32_t i = 0; i < pages; ++i) {
      t.indices.push_back(i < shared ? t.indices[static_cast<std::size_t>(t.indptr[donor] + i)] : pool[next++]);
    }
    t.indptr.push_back(static_cast<std::int32_t>(t.indices.size()));
    t.last_page_len.push_back(pages == 0 ? 0 : static_cast<std::int32_t>(lengths[b] - static_cast<std::int64_t>(pages - 1) * page_size));
  }
  return t;
}

/// Realistic K/V rows: N(0, 1) with a few outlier channels (x8 and x20), as real models have.
inline void realistic_row(std::mt19937_64& rng, int head_dim, float* out, float base = 1.0f) {
  std::normal_distribution<float> normal(0.0f, base);
  for (int d = 0; d < head_dim; ++d) out[d] = normal(rng);
  out[3] *= 8.0f;
  out[head_dim / 2 + 1] *= 20.0f;
}

struct Reference {
  std::vector<double> o;    // [rows, D]
  std::vector<double> lse;  // [rows]
};

/// FP64 attention over the stored (dequantized) cache. Queries are the activation values.
inline Reference reference_decode(const HostCache& cache, const HostPageTable& table,
                                  const std::vector<float>& q, int num_qo_heads, int query_tokens,
                                  double sm_scale) {
  const int d_dim = cache.shape.head_dim;
  const int group = num_qo_heads / cache.shape.num_kv_heads;
  const std::size_t batch = table.last_page_len.size();
  Reference ref;
  ref.o.assign(batch * static_cast<std::size_t>(query_tokens * num_qo_heads * d_dim), 0.0);
  ref.lse.assign(batch * static_cast<std::size_t>(query_tokens * num_qo_heads), -INFINITY);
  for (std::size_t b = 0; b < batch; ++b) {
    const auto pages = table.pages_of(b);
    const std::int64_t len = table.length(b);
    for (int t = 0; t < query_tokens; ++t) {
      const std::int64_t visible = std::max<std::int64_t>(0, len - query_tokens + t + 1);
      for (int h = 0; h < num_qo_heads; ++h) {
        const std::size_t row = (b * static_cast<std::size_t>(query_tokens) + static_cast<std::size_t>(t)) * static_cast<std::size_t>(num_qo_heads) + static_cast<std::size_t>(h);
        const int kv_head = h / group;
        std::vector<double> s(static_cast<std::size_t>(visible));
        double m = -INFINITY;
        for (std::int64_t p = 0; p < visible; ++p) {
          const int page = pages[static_cast<std::size_t>(p / cache.shape.page_size)];
          const int slot = static_cast<int>(p % cache.shape.page_size);
          double dot = 0.0;
          for (int d = 0; d < d_dim; ++d) dot += q[row * static_cast<std::size_t>(d_dim) + static_cast<std::size_t>(d)] * cache.real(false, page, slot, kv_head, d);
          s[static_cast<std::size_t>(p)] = dot * sm_scale;
          m = std::max(m, s[static_cast<std::size_t>(p)]);
        }
        if (visible == 0) continue;
        double sum = 0.0;
        for (std::int64_t p = 0; p < visible; ++p) {
          const double w = std::exp(s[static_cast<std::size_t>(p)] - m);
          sum += w;
          const int page = pages[static_cast<std::size_t>(p / cache.shape.page_size)];
          const int slot = static_cast<int>(p % cache.shape.page_size);
          for (int d = 0; d < d_dim; ++d) ref.o[row * static_cast<std::size_t>(d_dim) + static_cast<std::size_t>(d)] += w * cache.real(true, page, slot, kv_head, d);
        }
        for (int d = 0; d < d_dim; ++d) ref.o[row * static_cast<std::size_t>(d_dim) + static_cast<std::size_t>(d)] /= sum;
        ref.lse[row] = m + std::log(sum);
      }
    }
  }
  return ref;
}

}  // namespace attn_test
