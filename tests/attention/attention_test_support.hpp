#pragma once
// Shared pieces of the attention kernel tests: a host model of a paged cache (quantized with
// the formats API, so references start from exactly the stored values), page tables with
// shuffled pages, holes and shared pages, device upload helpers, and the FP64 reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/formats/fp4.hpp"
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
    case KvDtype::nvfp4: break;  // codes and block scales, not a value a code: its own tests
  }
  return 0;
}
inline float dequantize(KvDtype dtype, std::uint16_t bits) {
  switch (dtype) {
    case KvDtype::bf16: return to_float(bf16::from_bits(bits));
    case KvDtype::fp16: return to_float(fp16::from_bits(bits));
    case KvDtype::fp8_e4m3: return to_float(fp8_e4m3::from_bits(static_cast<std::uint8_t>(bits)));
    case KvDtype::fp8_e5m2: return to_float(fp8_e5m2::from_bits(static_cast<std::uint8_t>(bits)));
    case KvDtype::nvfp4: break;
  }
  return 0;
}
inline float format_max(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::bf16: return format_traits<bf16>::max_finite;
    case KvDtype::fp16: return format_traits<fp16>::max_finite;
    case KvDtype::fp8_e4m3: return format_traits<fp8_e4m3>::max_finite;
    case KvDtype::fp8_e5m2: return format_traits<fp8_e5m2>::max_finite;
    case KvDtype::nvfp4: return format_traits<fp4_e2m1>::max_finite;
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

/// Fills every (page, slot, head) that the first `stored[b]` positions of each request own with
/// realistic K/V rows; a page shared by two requests is written once. Per-tensor scales are
/// calibrated from the amax of these rows and of `also_held` (values the cache must also hold,
/// e.g. a chunk about to be appended), times `scale_factor` (< 1 pushes values into FP8
/// saturation); 16-bit caches get 0.37 / 1.9 (non-unit, K != V).
struct AlsoHeld {
  float k_amax = 0.0f, v_amax = 0.0f;
};
inline void fill_cache(HostCache& cache, const HostPageTable& table, const std::vector<std::int64_t>& stored,
                       std::mt19937_64& rng, float scale_factor = 1.0f, AlsoHeld also_held = {}) {
  const int d_dim = cache.shape.head_dim;
  const int page_size = cache.shape.page_size;
  struct Row { int page, slot, head; std::vector<float> k, v; };
  std::vector<Row> rows;
  std::vector<bool> seen(static_cast<std::size_t>(table.num_pages) * static_cast<std::size_t>(page_size), false);
  float k_amax = also_held.k_amax, v_amax = also_held.v_amax;
  for (std::size_t b = 0; b < stored.size(); ++b) {
    const auto pages = table.pages_of(b);
    for (std::int64_t p = 0; p < stored[b]; ++p) {
      const int page = pages[static_cast<std::size_t>(p / page_size)];
      const int slot = static_cast<int>(p % page_size);
      const std::size_t owned = static_cast<std::size_t>(page) * static_cast<std::size_t>(page_size) + static_cast<std::size_t>(slot);
      if (seen[owned]) continue;
      seen[owned] = true;
      for (int h = 0; h < cache.shape.num_kv_heads; ++h) {
        Row r{page, slot, h, std::vector<float>(static_cast<std::size_t>(d_dim)),
              std::vector<float>(static_cast<std::size_t>(d_dim))};
        realistic_row(rng, d_dim, r.k.data(), 1.0f);
        realistic_row(rng, d_dim, r.v.data(), 0.5f);
        for (int d = 0; d < d_dim; ++d) {
          k_amax = std::max(k_amax, std::fabs(r.k[static_cast<std::size_t>(d)]));
          v_amax = std::max(v_amax, std::fabs(r.v[static_cast<std::size_t>(d)]));
        }
        rows.push_back(std::move(r));
      }
    }
  }
  if (cache.shape.scale_mode == KvScaleMode::per_tensor) {
    const bool fp8 = is_fp8(cache.shape.dtype);
    cache.k_scale = fp8 ? k_amax / format_max(cache.shape.dtype) * scale_factor : 0.37f;
    cache.v_scale = fp8 ? v_amax / format_max(cache.shape.dtype) * scale_factor : 1.9f;
  }
  for (const auto& r : rows) {
    cache.store(false, r.page, r.slot, r.head, r.k.data());
    cache.store(true, r.page, r.slot, r.head, r.v.data());
  }
}

/// `count` N(0, 1) activations rounded to `t`: the bits the kernel reads and their values.
struct Activations {
  std::vector<std::uint16_t> bits;
  std::vector<float> values;
};
inline Activations random_activations(std::mt19937_64& rng, ActivationDtype t, std::size_t count) {
  Activations a;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t i = 0; i < count; ++i) {
    a.bits.push_back(to_activation(t, normal(rng)));
    a.values.push_back(from_activation(t, a.bits.back()));
  }
  return a;
}

/// Options of one FP64 reference row.
struct RowOptions {
  double sm_scale = 1.0;
  double soft_cap = 0.0;      // 0: none; else s = cap * tanh(s / cap)
  double sink = -INFINITY;    // natural-log sink logit (counts in the sum, has no value)
};

/// FP64 attention of one query row `q` [D] over positions [begin, end): key(p, d) and
/// value(p, d) are the values the kernel must use there. Writes o [D] (0 when nothing is
/// visible) and returns the natural-log LSE (-inf when nothing is visible).
template <class Key, class Value>
double attend_row(const float* q, int head_dim, std::int64_t begin, std::int64_t end, const RowOptions& opt,
                  Key&& key, Value&& value, double* o) {
  for (int d = 0; d < head_dim; ++d) o[d] = 0.0;
  std::vector<double> s;
  double m = opt.sink;
  for (std::int64_t p = begin; p < end; ++p) {
    double dot = 0.0;
    for (int d = 0; d < head_dim; ++d) dot += static_cast<double>(q[d]) * key(p, d);
    double x = dot * opt.sm_scale;
    if (opt.soft_cap > 0.0) x = opt.soft_cap * std::tanh(x / opt.soft_cap);
    s.push_back(x);
    m = std::max(m, x);
  }
  if (m == -INFINITY) return -INFINITY;
  double sum = std::exp(opt.sink - m);
  for (std::int64_t p = begin; p < end; ++p) {
    const double w = std::exp(s[static_cast<std::size_t>(p - begin)] - m);
    sum += w;
    for (int d = 0; d < head_dim; ++d) o[d] += w * value(p, d);
  }
  for (int d = 0; d < head_dim; ++d) o[d] /= sum;
  return m + std::log(sum);
}

/// The stored (dequantized) value of request b's position p: key or value accessor for
/// attend_row.
inline auto stored_values(const HostCache& cache, const HostPageTable& table, std::size_t b, int kv_head, bool is_v) {
  return [&cache, pages = table.pages_of(b), kv_head, is_v](std::int64_t p, int d) {
    const int page_size = cache.shape.page_size;
    return cache.real(is_v, pages[static_cast<std::size_t>(p / page_size)], static_cast<int>(p % page_size), kv_head, d);
  };
}

/// Largest |value(p, d)| over positions [0, end): the V spread a row's tolerance scales with.
template <class Value>
double max_abs_value(std::int64_t end, int head_dim, Value&& value) {
  double m = 0.0;
  for (std::int64_t p = 0; p < end; ++p) {
    for (int d = 0; d < head_dim; ++d) m = std::max(m, std::fabs(value(p, d)));
  }
  return m;
}

/// FP64 attention over the stored (dequantized) cache. Queries are the activation values.
inline Reference reference_decode(const HostCache& cache, const HostPageTable& table,
                                  const std::vector<float>& q, int num_qo_heads, int query_tokens,
                                  double sm_scale) {
  const int d_dim = cache.shape.head_dim;
  const int group = num_qo_heads / cache.shape.num_kv_heads;
  const std::size_t batch = table.last_page_len.size();
  const std::size_t d_size = static_cast<std::size_t>(d_dim);
  Reference ref;
  ref.o.assign(batch * static_cast<std::size_t>(query_tokens * num_qo_heads * d_dim), 0.0);
  ref.lse.assign(batch * static_cast<std::size_t>(query_tokens * num_qo_heads), -INFINITY);
  for (std::size_t b = 0; b < batch; ++b) {
    const std::int64_t len = table.length(b);
    for (int t = 0; t < query_tokens; ++t) {
      const std::int64_t visible = std::max<std::int64_t>(0, len - query_tokens + t + 1);
      for (int h = 0; h < num_qo_heads; ++h) {
        const std::size_t row = (b * static_cast<std::size_t>(query_tokens) + static_cast<std::size_t>(t)) * static_cast<std::size_t>(num_qo_heads) + static_cast<std::size_t>(h);
        ref.lse[row] = attend_row(q.data() + row * d_size, d_dim, 0, visible, RowOptions{sm_scale},
                                  stored_values(cache, table, b, h / group, false),
                                  stored_values(cache, table, b, h / group, true), ref.o.data() + row * d_size);
      }
    }
  }
  return ref;
}

/// Compares output rows [0, rows) against the reference, every element and the LSE:
///   - an element within tolerance(row, want) of the reference;
///   - the LSE within 1e-3 + 1e-5 |lse| (FP32 scores carry ~1e-5 relative error), -inf exactly;
///   - an aborted row (aborted(row) true): every element NaN and lse -inf.
/// Prints the first few mismatches through describe(row, d) when `print`; returns their count.
struct RowComparison {
  std::size_t mismatches = 0;
  std::size_t checked = 0;  // elements compared against the reference
};
template <class Tolerance, class Aborted, class Describe>
RowComparison compare_rows(const std::vector<float>& o, const std::vector<float>& lse, const Reference& ref,
                           std::size_t rows, int head_dim, Tolerance&& tolerance, Aborted&& aborted,
                           Describe&& describe, bool print = true) {
  const std::size_t d_dim = static_cast<std::size_t>(head_dim);
  RowComparison r;
  for (std::size_t row = 0; row < rows; ++row) {
    if (aborted(row)) {
      for (std::size_t d = 0; d < d_dim; ++d) r.mismatches += !std::isnan(o[row * d_dim + d]);
      r.mismatches += !(lse[row] == -std::numeric_limits<float>::infinity());
      continue;
    }
    for (std::size_t d = 0; d < d_dim; ++d) {
      const double got = o[row * d_dim + d];
      const double want = ref.o[row * d_dim + d];
      const double tol = tolerance(row, want);
      ++r.checked;
      if (!(std::fabs(got - want) <= tol)) {
        if (print && r.mismatches < 5) {
          std::printf("%s d %zu: got %.7g want %.7g tol %.3g\n", describe(row).c_str(), d, got, want, tol);
        }
        ++r.mismatches;
      }
    }
    const double want_lse = ref.lse[row];
    if (std::isinf(want_lse)) {
      r.mismatches += !(lse[row] == static_cast<float>(want_lse));
    } else if (!(std::fabs(lse[row] - want_lse) <= 1e-3 + 1e-5 * std::fabs(want_lse))) {
      if (print && r.mismatches < 5) {
        std::printf("%s lse: got %.7g want %.7g\n", describe(row).c_str(), static_cast<double>(lse[row]), want_lse);
      }
      ++r.mismatches;
    }
  }
  return r;
}

/// Per element of the tensor-core kernel: the output rounding (2^-8 BF16 / 2^-11 FP16 of |ref|)
/// plus the rounding of P to the mma type, which perturbs each softmax weight by up to 2^-9
/// (bf16) / 2^-12 (fp16) relative: the output moves by at most that times the spread of the
/// V values (2 v_max). FP32 accumulation and exp2 add ~1e-5 of v_max.
inline double tensor_core_tolerance(ActivationDtype out, KvDtype cache, double ref, double v_max) {
  const double out_rel = out == ActivationDtype::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double p_rel = cache == KvDtype::bf16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -12);
  return out_rel * std::fabs(ref) + (2.0 * p_rel + 2e-5) * v_max + 1e-6;
}

/// What a NaN-poisoning test counts against a clean run of the same inputs: elements of a row
/// that must be NaN but are not, lse values that break the NaN rule (a split run's partial rows
/// carry lse -inf, a merged row lse NaN), and any element or lse of every other row that is not
/// bit-identical to the clean run. Rows are [rows, head_dim]; `nan_row` marks the rows that read
/// a NaN.
struct NanRowTally {
  std::size_t wrong_nan = 0, wrong_lse = 0, wrong_other = 0, nan_rows = 0;
};

inline NanRowTally tally_nan_rows(const std::vector<bool>& nan_row, std::size_t head_dim, bool split,
                                  std::span<const float> o, std::span<const float> lse,
                                  std::span<const float> clean_o, std::span<const float> clean_lse) {
  const auto differs = [](float a, float b) { return std::memcmp(&a, &b, sizeof(float)) != 0; };
  NanRowTally t;
  for (std::size_t row = 0; row < nan_row.size(); ++row) {
    t.nan_rows += nan_row[row];
    for (std::size_t e = row * head_dim; e < (row + 1) * head_dim; ++e) {
      if (nan_row[row]) {
        t.wrong_nan += !std::isnan(o[e]);
      } else {
        t.wrong_other += differs(o[e], clean_o[e]);
      }
    }
    if (nan_row[row]) {
      t.wrong_lse += split ? !(lse[row] == -INFINITY) : !std::isnan(lse[row]);
    } else {
      t.wrong_other += differs(lse[row], clean_lse[row]);
    }
  }
  return t;
}

}  // namespace attn_test
