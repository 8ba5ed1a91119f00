// MLA attention over a paged latent cache, against FP64 references built from the stored
// (already quantized) records: append (every byte), absorbed decode (every element and LSE)
// over ragged lengths, shuffled pages with holes, heads 8/16/64/128, query tokens 1/2/4, BF16,
// FP8 e4m3 (per-token group and per-tensor scales) and NVFP4 (E4M3 block scales per 16 values
// and a tensor scale), split vs unsplit, CSR vs block table, aborted requests; the prefix
// gather; preflight errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "attention_test_support.hpp"
#include "nvfp4_test_cache.hpp"
#include "support/build_flavour.hpp"
#include "slimserve/attention/mla.hpp"
#include "slimserve/attention/kernels/mla_latent_rounding.hpp"
#include "slimserve/formats/nvfp4.hpp"

using namespace attn_test;

namespace {

constexpr int latent_dim = mla_latent_dim;
constexpr int rope_dim = mla_rope_dim;
constexpr int qk_dim = mla_qk_dim;

/// Host image of the latent cache; every byte starts as 0xFF (NaN in every field).
struct HostMlaCache {
  KvDtype dtype;
  MlaScaleMode mode;
  std::int32_t num_pages, page_size;
  MlaTokenLayout layout;
  float static_scale = 1.0f;
  std::vector<unsigned char> bytes;

  HostMlaCache(KvDtype d, MlaScaleMode m, std::int32_t pages, std::int32_t page)
      : dtype(d), mode(m), num_pages(pages), page_size(page), layout(mla_token_layout(d, m)) {
    bytes.assign(static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) *
                     static_cast<std::size_t>(layout.token_bytes), 0xFF);
  }
  unsigned char* record(int page, int slot) {
    return bytes.data() + (static_cast<std::size_t>(page) * static_cast<std::size_t>(page_size) +
                           static_cast<std::size_t>(slot)) * static_cast<std::size_t>(layout.token_bytes);
  }
  const unsigned char* record(int page, int slot) const {
    return const_cast<HostMlaCache*>(this)->record(page, slot);
  }
  /// The append semantics: latent / scale quantized (RNE, saturating), rope to BF16. NVFP4:
  /// per 16 values the block scale from their amax and the tensor scale (static_scale), codes
  /// two a byte (element 2i low), the 32 scale bytes after the 256 code bytes.
  void store(int page, int slot, const float* latent, const float* rope) {
    unsigned char* r = record(page, slot);
    for (int blk = 0; dtype == KvDtype::nvfp4 && blk < latent_dim / nvfp4_block_elements; ++blk) {
      const float* x = latent + nvfp4_block_elements * blk;
      float amax = 0.0f;
      for (int i = 0; i < nvfp4_block_elements; ++i) amax = std::max(amax, std::fabs(x[i]));
      const fp8_e4m3 scale = nvfp4_block_scale(amax, static_scale);
      const float multiplier = nvfp4_code_multiplier(scale, static_scale);
      for (int i = 0; i < nvfp4_block_elements; i += 2) {
        r[nvfp4_block_code_bytes * blk + i / 2] =
            static_cast<unsigned char>(nvfp4_code(x[i], multiplier) | nvfp4_code(x[i + 1], multiplier) << 4);
      }
      r[latent_dim / 2 + blk] = scale.bits;
    }
    for (int grp = 0; dtype != KvDtype::nvfp4 && grp < mla_scale_groups; ++grp) {
      float scale = 1.0f;
      if (mode == MlaScaleMode::per_tensor) scale = static_scale;
      if (mode == MlaScaleMode::per_token_group) {
        float amax = 0.0f;
        for (int d = 0; d < mla_scale_group; ++d) amax = std::max(amax, std::fabs(latent[grp * mla_scale_group + d]));
        scale = amax / format_max(dtype);
        if (!(scale > 0.0f) || !std::isfinite(scale)) scale = 1.0f;
        std::memcpy(r + layout.scales_offset + 4 * grp, &scale, 4);
      }
      for (int d = grp * mla_scale_group; d < (grp + 1) * mla_scale_group; ++d) {
        const std::uint16_t b = quantize(dtype, latent[d] / scale);
        std::memcpy(r + d * element_bytes(dtype), &b, static_cast<std::size_t>(element_bytes(dtype)));
      }
    }
    for (int d = 0; d < rope_dim; ++d) {
      const std::uint16_t b = quantize(KvDtype::bf16, rope[d]);
      std::memcpy(r + layout.rope_offset + 2 * d, &b, 2);
    }
  }
  /// Real value of element d (< 576) of the cached (latent | rope) row.
  double real(int page, int slot, int d) const {
    const unsigned char* r = record(page, slot);
    std::uint16_t b = 0;
    if (d >= latent_dim) {
      std::memcpy(&b, r + layout.rope_offset + 2 * (d - latent_dim), 2);
      return dequantize(KvDtype::bf16, b);
    }
    if (dtype == KvDtype::nvfp4) {  // the format's definition: e2m1 x e4m3 x tensor scale, in FP64
      const auto code = fp4_e2m1::from_bits(static_cast<std::uint8_t>(r[d / 2] >> (4 * (d % 2))));
      const auto scale = fp8_e4m3::from_bits(r[latent_dim / 2 + d / nvfp4_block_elements]);
      return static_cast<double>(to_float(code)) * static_cast<double>(to_float(scale)) * static_cast<double>(static_scale);
    }
    std::memcpy(&b, r + d * element_bytes(dtype), static_cast<std::size_t>(element_bytes(dtype)));
    double scale = 1.0;
    if (mode == MlaScaleMode::per_tensor) scale = static_scale;
    if (mode == MlaScaleMode::per_token_group) {
      float s = 0.0f;
      std::memcpy(&s, r + layout.scales_offset + 4 * (d / mla_scale_group), 4);
      scale = s;
    }
    return static_cast<double>(dequantize(dtype, b)) * scale;
  }
  /// Latent element d (< 512) of an FP8 record as the wgmma kernel's widening leaves it: the
  /// token's scales split into 2^e (e the exponent of its largest scale, clamped to the
  /// kernel's range) and m_g = scale_g / 2^e rounded to fp16; the value is fp16(code x m_g) x 2^e.
  double wgmma_latent(int page, int slot, int d) const {
    const unsigned char* r = record(page, slot);
    float scales[mla_scale_groups];
    for (int grp = 0; grp < mla_scale_groups; ++grp) {
      scales[grp] = static_scale;
      if (mode == MlaScaleMode::per_token_group) std::memcpy(&scales[grp], r + layout.scales_offset + 4 * grp, 4);
    }
    float largest = 0.0f;
    for (const float scale : scales) largest = std::max(largest, scale);
    using attention::kernels::mla_max_token_exponent;
    using attention::kernels::mla_min_token_exponent;
    const int e = std::clamp(largest > 0.0f ? std::ilogb(largest) : mla_min_token_exponent, mla_min_token_exponent,
                             mla_max_token_exponent);
    const float m = to_float(from_float<fp16>(std::ldexp(scales[d / mla_scale_group], -e)));
    std::uint16_t b = 0;
    std::memcpy(&b, r + d * element_bytes(dtype), static_cast<std::size_t>(element_bytes(dtype)));
    const float value = to_float(from_float<fp16>(dequantize(dtype, b) * m));  // exact product, one rounding
    return std::ldexp(static_cast<double>(value), e);
  }
};

struct DeviceMlaCache {
  rt::DeviceBuffer<unsigned char> pages;
  rt::DeviceBuffer<float> scale;
  MlaCacheView view;
  explicit DeviceMlaCache(const HostMlaCache& host) {
    pages = upload(host.bytes);
    scale = upload(std::vector<float>{host.static_scale});
    view.pages = pages.data();
    view.latent_scale = scale.data();
    view.num_pages = host.num_pages;
    view.page_size = host.page_size;
    view.dtype = host.dtype;
    view.scale_mode = host.mode;
  }
};

/// A latent row like a real model's: N(0, 1) with outlier channels, some tokens louder.
void latent_row(std::mt19937_64& rng, float* latent, float* rope, float loud) {
  realistic_row(rng, latent_dim, latent, loud);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int d = 0; d < rope_dim; ++d) rope[d] = normal(rng) * 2.0f;
}

std::vector<std::int64_t> ragged_lengths(int page_size, std::size_t count) {
  const std::vector<std::int64_t> pattern = {page_size + 1, std::max(3 * page_size + 7, 150), 1, page_size - 1, page_size, 2};
  std::vector<std::int64_t> lengths;
  for (std::size_t i = 0; i < count; ++i) lengths.push_back(pattern[i % pattern.size()]);
  return lengths;
}

struct DecodeCase {
  KvDtype dtype;
  MlaScaleMode mode;
  int heads;
  int query_tokens;
  int page_size;
  std::size_t batch;
  // A larger copy of paths the smaller cases already take (64+ heads): release build only.
  bool release_only = false;
  // Group scales over 12 decades: per request x 2^11, 1, 2^-12 or 2^-24 (q divided by the same
  // down to 2^-12, the rope multiplied), per token and group x 2^3 .. 2^-12. The 2^-24 request's
  // tokens have every scale below 2^-22, where the wgmma kernel's per-token power of two clamps.
  bool wide_scales = false;
};

/// wide_scales: what multiplies group `grp` of the token at `pos` of request `b` (the request's
/// magnitude times the token's group pattern).
double wide_scale_request(std::size_t b) {
  const double magnitude[4] = {2048.0, 1.0, 1.0 / 4096.0, 0x1p-24};
  return magnitude[b % 4];
}
double wide_scale_group(std::int64_t pos, int grp) {
  const double pattern[4] = {1.0, 1.0 / 64.0, 1.0 / 4096.0, 8.0};
  return pattern[static_cast<std::size_t>((pos + grp) % 4)];
}

bool runs_in_this_build(const DecodeCase& c) { return !(c.release_only && slimserve_test::sanitizer_build); }

struct DecodeFixture {
  DecodeCase c;
  HostPageTable table;
  HostMlaCache cache;
  std::vector<float> q_values;  // [B * qt, H, 576] as the kernel reads them (bf16-rounded)
  std::vector<std::uint16_t> q_bits;
  std::vector<double> v_max;    // per request and scale group: largest |latent| it holds [B][4]
  bool ragged = false;          // query counts from qo_indptr (absorbed prefill chunks)
  std::vector<std::int32_t> qo_indptr;  // [B + 1]

  /// qo_lens: per-request query counts of the ragged form (each <= dc.query_tokens), or
  /// empty for dc.query_tokens each.
  DecodeFixture(const DecodeCase& dc, std::mt19937_64& rng, const std::vector<std::int32_t>& qo_lens = {})
      : c(dc), table(make_page_table(ragged_lengths(dc.page_size, dc.batch), dc.page_size, rng, dc.batch > 2)),
        cache(dc.dtype, dc.mode, table.num_pages, dc.page_size), ragged(!qo_lens.empty()) {
    cache.static_scale = 0.05f;  // per_tensor: amax of ~22 maps to 448
    qo_indptr.assign(1, 0);
    for (std::size_t b = 0; b < c.batch; ++b) qo_indptr.push_back(qo_indptr.back() + (ragged ? qo_lens[b] : c.query_tokens));
    std::vector<float> latent(latent_dim), rope(rope_dim);
    std::vector<char> written(static_cast<std::size_t>(table.num_pages) * static_cast<std::size_t>(c.page_size), 0);
    for (std::size_t b = 0; b < c.batch; ++b) {
      const auto pages = table.pages_of(b);
      for (std::int64_t pos = 0; pos < table.length(b); ++pos) {
        const int page = pages[static_cast<std::size_t>(pos / c.page_size)];
        const int slot = static_cast<int>(pos % c.page_size);
        const std::size_t id = static_cast<std::size_t>(page) * static_cast<std::size_t>(c.page_size) + static_cast<std::size_t>(slot);
        if (!written[id]) {  // a shared prefix page keeps its first writer's values
          latent_row(rng, latent.data(), rope.data(), pos % 37 == 5 ? 4.0f : 1.0f);
          if (c.wide_scales) {
            for (int d = 0; d < latent_dim; ++d) {
              latent[static_cast<std::size_t>(d)] *= static_cast<float>(wide_scale_request(b) * wide_scale_group(pos, d / mla_scale_group));
            }
            // One value of 10 x the group's multiplier: the loud request's largest scales
            // pass 256 whatever the draw (10 x 2^11 x 8 / 448 = 366).
            for (int grp = 0; grp < mla_scale_groups; ++grp) {
              latent[static_cast<std::size_t>(grp * mla_scale_group + 5)] =
                  static_cast<float>(10.0 * wide_scale_request(b) * wide_scale_group(pos, grp));
            }
            for (float& r : rope) r *= static_cast<float>(wide_scale_request(b));
          }
          cache.store(page, slot, latent.data(), rope.data());
          written[id] = 1;
        }
      }
    }
    measure_v_max();
    const std::size_t q_count = total_tokens() * static_cast<std::size_t>(c.heads * qk_dim);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    q_bits.resize(q_count);
    q_values.resize(q_count);
    for (std::size_t i = 0; i < q_count; ++i) {
      float x = normal(rng);
      if (c.wide_scales && static_cast<int>(i % qk_dim) < latent_dim) {
        const std::size_t token = i / static_cast<std::size_t>(c.heads * qk_dim);
        std::size_t b = 0;
        while (static_cast<std::size_t>(qo_indptr[b + 1]) <= token) ++b;
        // q compensates the request's magnitude down to 2^-12 only: fp16 (the FP8 paths' mma
        // type) holds |q| up to 65504, and the 2^-24 request tests tiny tokens, not q's range.
        x = static_cast<float>(x / std::max(wide_scale_request(b), 0x1p-12));
      }
      q_bits[i] = from_float<bf16>(x).bits;
      q_values[i] = to_float(bf16::from_bits(q_bits[i]));
    }
  }

  /// v_max from the records as they are now (after a test rewrites some of their bytes).
  void measure_v_max() {
    v_max.assign(c.batch * mla_scale_groups, 0.0);
    for (std::size_t b = 0; b < c.batch; ++b) {
      const auto pages = table.pages_of(b);
      for (std::int64_t pos = 0; pos < table.length(b); ++pos) {
        for (int d = 0; d < latent_dim; ++d) {
          double& m = v_max[b * mla_scale_groups + static_cast<std::size_t>(d / mla_scale_group)];
          m = std::max(m, std::fabs(cache.real(pages[static_cast<std::size_t>(pos / c.page_size)],
                                               static_cast<int>(pos % c.page_size), d)));
        }
      }
    }
  }

  std::size_t total_tokens() const { return static_cast<std::size_t>(qo_indptr.back()); }
  int query_count(std::size_t b) const { return qo_indptr[b + 1] - qo_indptr[b]; }
  std::size_t row_of(std::size_t b, int t, int h) const {
    return (static_cast<std::size_t>(qo_indptr[b]) + static_cast<std::size_t>(t)) * static_cast<std::size_t>(c.heads) +
           static_cast<std::size_t>(h);
  }

  /// Calls fn(row, visible, token_at) for every query row: `visible` cached tokens precede it
  /// (causal within a request's query tokens), token_at(p) is token p's (page, slot).
  template <class Fn>
  void for_each_row(Fn&& fn) const {
    for (std::size_t b = 0; b < c.batch; ++b) {
      const auto pages = table.pages_of(b);
      const std::int64_t len = table.length(b);
      const auto token_at = [&](std::int64_t p) {
        return std::pair<int, int>{pages[static_cast<std::size_t>(p / c.page_size)], static_cast<int>(p % c.page_size)};
      };
      for (int t = 0; t < query_count(b); ++t) {
        const std::int64_t visible = std::max<std::int64_t>(0, len - query_count(b) + t + 1);
        for (int h = 0; h < c.heads; ++h) fn(row_of(b, t, h), visible, token_at);
      }
    }
  }

  /// FP64 attention over the cached values; wgmma_latent: the latent as that kernel rounds it.
  Reference reference(double sm_scale, bool wgmma_latent = false) const {
    const auto value = [&](int page, int slot, int d) {
      return wgmma_latent && d < latent_dim ? cache.wgmma_latent(page, slot, d) : cache.real(page, slot, d);
    };
    Reference ref;
    const std::size_t rows = total_tokens() * static_cast<std::size_t>(c.heads);
    ref.o.assign(rows * latent_dim, 0.0);
    ref.lse.assign(rows, -INFINITY);
    for_each_row([&](std::size_t row, std::int64_t visible, auto token_at) {
      if (visible == 0) return;
      std::vector<double> s(static_cast<std::size_t>(visible));
      double m = -INFINITY;
      for (std::int64_t p = 0; p < visible; ++p) {
        const auto [page, slot] = token_at(p);
        double dot = 0.0;
        for (int d = 0; d < qk_dim; ++d) dot += q_values[row * qk_dim + static_cast<std::size_t>(d)] * value(page, slot, d);
        s[static_cast<std::size_t>(p)] = dot * sm_scale;
        m = std::max(m, s[static_cast<std::size_t>(p)]);
      }
      double sum = 0.0;
      for (std::int64_t p = 0; p < visible; ++p) {
        const double w = std::exp(s[static_cast<std::size_t>(p)] - m);
        sum += w;
        const auto [page, slot] = token_at(p);
        for (int d = 0; d < latent_dim; ++d) ref.o[row * latent_dim + static_cast<std::size_t>(d)] += w * value(page, slot, d);
      }
      for (int d = 0; d < latent_dim; ++d) ref.o[row * latent_dim + static_cast<std::size_t>(d)] /= sum;
      ref.lse[row] = m + std::log(sum);
    });
    return ref;
  }
};

struct RunOptions {
  bool split = false;
  bool block_table = false;
  bool wgmma = false;  // MlaDecodeProblem::warpgroup_mma
  std::vector<kv::RequestStatus> status;  // empty: no tag check
  std::int32_t num_sms = 0;  // 0: 64 when split, else 1
};

/// The wgmma kernel's FP8 path (asked for, 64+ rows per request) rounds the dequantized latent
/// to fp16 (HostMlaCache::wgmma_latent); every other path multiplies the exact codes.
bool wgmma_rounds_latent(const DecodeCase& c, const RunOptions& opt) {
  // NVFP4's widening is exact in both kernels.
  return opt.wgmma && c.dtype == KvDtype::fp8_e4m3 && c.heads * c.query_tokens >= 64;
}

/// Plans and runs one decode step; returns o (as floats) and lse. Outputs are poisoned first.
std::pair<std::vector<float>, std::vector<float>> run_decode_case(const DecodeFixture& f, const RunOptions& opt,
                                                                  float sm_scale, MlaDecodePlan* plan_out = nullptr) {
  const DecodeCase& c = f.c;
  DeviceMlaCache cache(f.cache);
  auto indptr = upload(f.table.indptr);
  auto indices = upload(f.table.indices);
  auto last = upload(f.table.last_page_len);
  std::vector<std::int32_t> seq_lens;
  std::int32_t max_pages = 1;
  for (std::size_t b = 0; b < c.batch; ++b) {
    seq_lens.push_back(static_cast<std::int32_t>(f.table.length(b)));
    max_pages = std::max(max_pages, f.table.indptr[b + 1] - f.table.indptr[b]);
  }
  ++max_pages;  // a spare column of -1: ids past the length are never read
  std::vector<std::int32_t> block(c.batch * static_cast<std::size_t>(max_pages), -1);
  for (std::size_t b = 0; b < c.batch; ++b) {
    for (std::int32_t i = f.table.indptr[b]; i < f.table.indptr[b + 1]; ++i) {
      block[b * static_cast<std::size_t>(max_pages) + static_cast<std::size_t>(i - f.table.indptr[b])] = f.table.indices[static_cast<std::size_t>(i)];
    }
  }
  auto block_dev = upload(block);
  auto seq_dev = upload(seq_lens);

  MlaDecodePlanArguments pa;
  pa.problem = {static_cast<std::int32_t>(c.batch), c.heads, c.query_tokens, c.page_size, c.dtype, c.mode};
  pa.problem.ragged_queries = f.ragged;
  pa.problem.warpgroup_mma = opt.wgmma;
  if (f.ragged) pa.qo_indptr_host = f.qo_indptr;
  if (opt.block_table) {
    pa.seq_lens_host = seq_lens;
  } else {
    pa.kv_indptr_host = f.table.indptr;
    pa.last_page_len_host = f.table.last_page_len;
  }
  pa.num_sms = opt.num_sms != 0 ? opt.num_sms : opt.split ? 64 : 1;
  pa.min_chunk_tokens = 1;
  pa.allow_split = opt.split;
  auto bytes = mla_decode_workspace_size(pa);
  REQUIRE(bytes.ok());
  MlaDecodeWorkspaceBound bound{pa.problem, pa.num_sms, pa.ctas_per_sm};
  auto bound_bytes = mla_decode_workspace_bound(bound);
  REQUIRE(bound_bytes.ok());
  CHECK(*bound_bytes >= *bytes);
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*bytes);
  REQUIRE(workspace.ok());
  auto plan = plan_mla_decode(pa, workspace->data(), *bytes, nullptr);
  REQUIRE(plan.ok());
  if (opt.split) CHECK(plan->split_kv);
  if (!opt.split) CHECK_FALSE(plan->split_kv);
  // The wgmma kernel (64 rows per CTA) only when asked for and a request fills its rows.
  CHECK(plan->cta_rows == (opt.wgmma && c.heads * c.query_tokens >= 64 ? 64 : c.heads * c.query_tokens <= 16 ? 16 : 32));
  if (plan_out != nullptr) *plan_out = *plan;

  const std::size_t rows = f.total_tokens() * static_cast<std::size_t>(c.heads);
  auto q = upload(f.q_bits);
  auto o = upload(std::vector<std::uint16_t>(rows * latent_dim, from_float<bf16>(12345.0f).bits));  // poison
  auto lse = upload(std::vector<float>(rows, 777.0f));
  rt::DeviceBuffer<kv::RequestStatus> status;
  if (!opt.status.empty()) status = upload(opt.status);

  MlaDecodeArguments a;
  a.cache = cache.view;
  if (opt.block_table) {
    a.block_table.block_table = block_dev.data();
    a.block_table.seq_lens = seq_dev.data();
    a.block_table.batch_size = static_cast<std::int32_t>(c.batch);
    a.block_table.max_pages_per_request = max_pages;
    a.block_table.page_size = c.page_size;
  } else {
    a.table.indptr = indptr.data();
    a.table.indices = indices.data();
    a.table.last_page_len = last.data();
    a.table.batch_size = static_cast<std::int32_t>(c.batch);
    a.table.page_size = c.page_size;
  }
  a.request_status = opt.status.empty() ? nullptr : status.data();
  a.q = q.data();
  a.o = o.data();
  a.lse = lse.data();
  a.sm_scale = sm_scale;
  REQUIRE(run_mla_decode(a, *plan, workspace->data(), *bytes, nullptr).ok());
  const auto o_bits = download(o, rows * latent_dim);
  std::vector<float> o_values(o_bits.size());
  for (std::size_t i = 0; i < o_bits.size(); ++i) o_values[i] = to_float(bf16::from_bits(o_bits[i]));
  return {o_values, download(lse, rows)};
}

void check_decode(const DecodeFixture& f, const std::vector<float>& o, const std::vector<float>& lse,
                  const Reference& ref, const std::vector<kv::RequestStatus>& status) {
  const DecodeCase& c = f.c;
  // P is rounded to the mma type (BF16: 2^-9 relative; FP8 path: fp16, 2^-11) and o to BF16.
  const double tol_v = c.dtype == KvDtype::bf16 ? 6e-3 : 3e-3;
  std::size_t bad = 0;
  for (std::size_t b = 0; b < c.batch; ++b) {
    const bool aborted = !status.empty() && !kv::request_ok(status[b]);
    for (int t = 0; t < f.query_count(b); ++t) {
      for (int h = 0; h < c.heads; ++h) {
        const std::size_t row = f.row_of(b, t, h);
        if (aborted) {
          if (!(lse[row] == -INFINITY)) ++bad;
          for (int d = 0; d < latent_dim; ++d) if (!std::isnan(o[row * latent_dim + static_cast<std::size_t>(d)])) ++bad;
          continue;
        }
        if (ref.lse[row] == -INFINITY) {
          if (!(lse[row] == -INFINITY)) ++bad;
        } else if (!(std::fabs(lse[row] - ref.lse[row]) <= 2e-3 + 1e-4 * std::fabs(ref.lse[row]))) {
          if (bad++ < 5) std::printf("lse row %zu: %f vs %f\n", row, static_cast<double>(lse[row]), ref.lse[row]);
        }
        for (int d = 0; d < latent_dim; ++d) {
          const double want = ref.o[row * latent_dim + static_cast<std::size_t>(d)];
          const double got = o[row * latent_dim + static_cast<std::size_t>(d)];
          // Output column d averages scale group d / 128 of the tokens: that group's largest
          // value bounds what P's rounding can move it by.
          const double v_max = f.v_max[b * mla_scale_groups + static_cast<std::size_t>(d / mla_scale_group)];
          if (!(std::fabs(got - want) <= tol_v * v_max + 8e-3 * std::fabs(want) + 1e-6 * v_max + 1e-12)) {
            if (bad++ < 5) std::printf("o row %zu d %d: %g vs %g (group vmax %g)\n", row, d, got, want, v_max);
          }
        }
      }
    }
  }
  CHECK(bad == 0);
}

std::string describe(const DecodeCase& c) {
  return std::string(to_string(c.dtype)) + "/" + std::string(to_string(c.mode)) + " heads " + std::to_string(c.heads) +
         " qt " + std::to_string(c.query_tokens) + " page " + std::to_string(c.page_size);
}

}  // namespace

TEST_CASE("mla cache view: record layout, capacity, validation") {
  CHECK(mla_bytes_per_token(KvDtype::fp8_e4m3, MlaScaleMode::per_token_group) == 656);
  CHECK(mla_bytes_per_token(KvDtype::fp8_e4m3, MlaScaleMode::per_tensor) == 640);
  CHECK(mla_bytes_per_token(KvDtype::bf16, MlaScaleMode::none) == 1152);
  CHECK(mla_bytes_per_token(KvDtype::nvfp4, MlaScaleMode::per_tensor) == 416);
  // NVFP4 holds 1152 / 416 = 2.77x BF16's tokens, 1.58x FP8 e4m3's with group scales.
  CHECK(mla_tokens_in(std::int64_t{1} << 30, KvDtype::nvfp4, MlaScaleMode::per_tensor, 64) == 2581056);
  CHECK(mla_tokens_in(std::int64_t{1} << 30, KvDtype::bf16, MlaScaleMode::none, 64) == 932032);  // 14,563 whole pages of 64 x 1152 B
  alignas(16) static unsigned char storage[16];
  MlaCacheView v;
  v.pages = storage;
  v.num_pages = 1;
  v.page_size = 64;
  CHECK(validate_mla_cache_view(v).ok());
  v.dtype = KvDtype::fp8_e4m3;
  CHECK(validate_mla_cache_view(v).code() == StatusCode::invalid_argument);  // FP8 without scales
  v.scale_mode = MlaScaleMode::per_tensor;
  CHECK_FALSE(validate_mla_cache_view(v).ok());  // per_tensor without the scale pointer
  v.scale_mode = MlaScaleMode::per_token_group;
  CHECK(validate_mla_cache_view(v).ok());
  v.rope_dim = 32;
  CHECK(validate_mla_cache_view(v).code() == StatusCode::unsupported);
  v.rope_dim = 64;
  v.latent_dim = 256;
  CHECK(validate_mla_cache_view(v).code() == StatusCode::unsupported);
  v.latent_dim = 512;
  v.page_size = 8;
  CHECK_FALSE(validate_mla_cache_view(v).ok());
  v.page_size = 16;
  v.dtype = KvDtype::fp8_e5m2;
  CHECK(validate_mla_cache_view(v).code() == StatusCode::unsupported);
  v.dtype = KvDtype::nvfp4;  // the tensor scale is per_tensor's pointer; block scales are in the record
  CHECK(validate_mla_cache_view(v).code() == StatusCode::invalid_argument);  // per_token_group
  v.scale_mode = MlaScaleMode::none;
  CHECK(validate_mla_cache_view(v).code() == StatusCode::invalid_argument);
  v.scale_mode = MlaScaleMode::per_tensor;
  CHECK(validate_mla_cache_view(v).code() == StatusCode::invalid_argument);  // no tensor scale pointer
  static float tensor_scale = 1.0f;
  v.latent_scale = &tensor_scale;
  CHECK(validate_mla_cache_view(v).ok());
  CHECK(v.token_layout().rope_offset == 288);
}

TEST_CASE("mla append: every byte of every record, aborted requests untouched") {
  auto rng = slimserve_test::make_rng(1401);
  struct AppendCase { KvDtype dtype; MlaScaleMode mode; int page_size; ActivationDtype input; bool explicit_form; };
  const AppendCase cases[] = {
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 64, ActivationDtype::bf16, false},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_tensor, 16, ActivationDtype::fp16, true},
      {KvDtype::bf16, MlaScaleMode::none, 32, ActivationDtype::bf16, true},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 128, ActivationDtype::fp16, true},
      {KvDtype::nvfp4, MlaScaleMode::per_tensor, 16, ActivationDtype::bf16, false},
      {KvDtype::nvfp4, MlaScaleMode::per_tensor, 64, ActivationDtype::fp16, true},
  };
  for (const AppendCase& ac : cases) {
    SECTION(std::string(to_string(ac.dtype)) + "/" + std::string(to_string(ac.mode)) + " page " + std::to_string(ac.page_size)) {
      const std::size_t batch = 5;
      const auto lengths = ragged_lengths(ac.page_size, batch);
      HostPageTable table = make_page_table(lengths, ac.page_size, rng, false);
      HostMlaCache expected(ac.dtype, ac.mode, table.num_pages, ac.page_size);
      expected.static_scale = 0.04f;
      HostMlaCache before = expected;
      // New tokens: each request's last min(len, 3) tokens (chunk form), or the same as explicit
      // destinations in shuffled order.
      std::vector<std::int32_t> append_indptr{0}, token_request, token_position;
      for (std::size_t b = 0; b < batch; ++b) {
        const std::int64_t n = std::min<std::int64_t>(lengths[b], 3);
        for (std::int64_t i = 0; i < n; ++i) {
          token_request.push_back(static_cast<std::int32_t>(b));
          token_position.push_back(static_cast<std::int32_t>(lengths[b] - n + i));
        }
        append_indptr.push_back(static_cast<std::int32_t>(token_request.size()));
      }
      const std::size_t tokens = token_request.size();
      std::vector<float> latent(tokens * latent_dim), rope(tokens * rope_dim);
      std::vector<std::uint16_t> latent_bits(latent.size()), rope_bits(rope.size());
      for (std::size_t t = 0; t < tokens; ++t) latent_row(rng, &latent[t * latent_dim], &rope[t * rope_dim], t % 4 == 1 ? 6.0f : 1.0f);
      latent[3] = 0.0f;  // an exact zero and, in one token, an all-zero group (scale 1)
      for (int d = 0; d < mla_scale_group; ++d) latent[latent_dim + 128 + static_cast<std::size_t>(d)] = 0.0f;
      for (std::size_t i = 0; i < latent.size(); ++i) {
        latent_bits[i] = to_activation(ac.input, latent[i]);
        latent[i] = from_activation(ac.input, latent_bits[i]);
      }
      for (std::size_t i = 0; i < rope.size(); ++i) {
        rope_bits[i] = to_activation(ac.input, rope[i]);
        rope[i] = from_activation(ac.input, rope_bits[i]);
      }
      std::vector<kv::RequestStatus> status(batch, kv::RequestStatus{kv::RequestState::ok, -1});
      status[2] = {kv::RequestState::stale_tag, 0};
      for (std::size_t t = 0; t < tokens; ++t) {
        const auto b = static_cast<std::size_t>(token_request[t]);
        if (!kv::request_ok(status[b])) continue;
        const auto pages = table.pages_of(b);
        const std::int32_t pos = token_position[t];
        expected.store(pages[static_cast<std::size_t>(pos / ac.page_size)], pos % ac.page_size, &latent[t * latent_dim],
                       &rope[t * rope_dim]);
      }
      if (ac.explicit_form) {  // shuffled order
        std::vector<std::size_t> perm(tokens);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        auto permute = [&](auto& v, std::size_t width) {
          auto copy = v;
          for (std::size_t i = 0; i < tokens; ++i) std::copy_n(&copy[perm[i] * width], width, &v[i * width]);
        };
        permute(token_request, 1);
        permute(token_position, 1);
        permute(latent_bits, latent_dim);
        permute(rope_bits, rope_dim);
      }
      DeviceMlaCache cache(before);
      auto indptr = upload(table.indptr);
      auto indices = upload(table.indices);
      auto last = upload(table.last_page_len);
      auto request = upload(token_request);
      auto position = upload(token_position);
      auto chunk = upload(append_indptr);
      auto latent_dev = upload(latent_bits);
      auto rope_dev = upload(rope_bits);
      auto status_dev = upload(status);
      MlaAppendArguments a;
      a.cache = cache.view;
      a.table = {indptr.data(), indices.data(), last.data(), nullptr, static_cast<std::int32_t>(batch), ac.page_size};
      a.request_status = status_dev.data();
      a.latent_new = latent_dev.data();
      a.rope_new = rope_dev.data();
      a.input_dtype = ac.input;
      a.num_tokens = static_cast<std::int32_t>(tokens);
      if (ac.explicit_form) {
        a.token_request = request.data();
        a.token_position = position.data();
      } else {
        a.append_indptr = chunk.data();
      }
      REQUIRE(append_mla(a, nullptr).ok());
      const auto got = download(cache.pages, expected.bytes.size());
      std::size_t mismatches = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i] != expected.bytes[i] && mismatches++ < 5) std::printf("byte %zu: %u vs %u\n", i, got[i], expected.bytes[i]);
      }
      CHECK(mismatches == 0);

      // Preflight: both destination forms, a misaligned input.
      MlaAppendArguments both = a;
      both.append_indptr = chunk.data();
      both.token_request = request.data();
      both.token_position = position.data();
      CHECK_FALSE(append_mla(both, nullptr).ok());
      MlaAppendArguments misaligned = a;
      misaligned.latent_new = static_cast<const unsigned char*>(a.latent_new) + 2;
      CHECK_FALSE(append_mla(misaligned, nullptr).ok());
    }
  }
}

TEST_CASE("mla decode: every element and lse against FP64, split vs unsplit, CSR vs block table") {
  const DecodeCase cases[] = {
      {KvDtype::bf16, MlaScaleMode::none, 8, 1, 16, 6},
      {KvDtype::bf16, MlaScaleMode::none, 16, 2, 32, 5},
      {KvDtype::bf16, MlaScaleMode::none, 64, 1, 64, 4, true},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 8, 4, 16, 6},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 16, 1, 64, 5},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 64, 2, 16, 4, true},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 128, 1, 32, 3, true},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_tensor, 16, 4, 128, 3},
      {KvDtype::bf16, MlaScaleMode::none, 128, 1, 16, 3, true},
      {KvDtype::nvfp4, MlaScaleMode::per_tensor, 8, 4, 16, 6},
      {KvDtype::nvfp4, MlaScaleMode::per_tensor, 16, 1, 32, 5},
      {KvDtype::nvfp4, MlaScaleMode::per_tensor, 32, 2, 64, 4},
      {KvDtype::nvfp4, MlaScaleMode::per_tensor, 128, 1, 16, 3, true},
  };
  const float sm_scale = 1.0f / std::sqrt(192.0f);
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    const DecodeCase& c = cases[i];
    if (!runs_in_this_build(c)) continue;
    SECTION(describe(c)) {
      auto rng = slimserve_test::make_rng(1410 + i);
      DecodeFixture f(c, rng);
      const Reference ref = f.reference(sm_scale);
      {
        INFO("unsplit, CSR");
        auto [o, lse] = run_decode_case(f, RunOptions{}, sm_scale);
        check_decode(f, o, lse, ref, {});
      }
      {
        INFO("split, block table, one request aborted");
        RunOptions opt;
        opt.split = true;
        opt.block_table = (i % 2) == 0;
        opt.status.assign(c.batch, kv::RequestStatus{kv::RequestState::ok, -1});
        opt.status[1] = {kv::RequestState::stale_tag, 0};
        auto [o, lse] = run_decode_case(f, opt, sm_scale);
        check_decode(f, o, lse, ref, opt.status);
      }
    }
  }
}

// The default split of the 16-row FP8 kernel fills its two CTA slots per SM: on 4 SMs, 6 row
// tiles (batch 6, 16 heads) split into 8 work items, where one slot per SM (4) would not split.
TEST_CASE("mla decode at 16 heads: the split over two FP8 CTA slots per SM, every element against FP64") {
  const DecodeCase c{KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 16, 1, 16, 6};
  const float sm_scale = 1.0f / std::sqrt(192.0f);
  MlaDecodePlanArguments one_slot;
  one_slot.problem = {6, 16, 1, 16, c.dtype, c.mode};
  const std::vector<std::int32_t> lens{17, 150, 1, 15, 16, 2};  // ragged_lengths(16, 6)
  one_slot.seq_lens_host = lens;
  one_slot.num_sms = 4;
  one_slot.min_chunk_tokens = 1;
  one_slot.ctas_per_sm = 1;
  auto unsplit = make_mla_decode_plan(one_slot);
  REQUIRE(unsplit.ok());
  CHECK_FALSE(unsplit->split_kv);
  auto rng = slimserve_test::make_rng(1460);
  DecodeFixture f(c, rng);
  for (std::size_t b = 0; b < c.batch; ++b) REQUIRE(f.table.length(b) == lens[b]);
  const Reference ref = f.reference(sm_scale);
  for (const bool block_table : {false, true}) {
    INFO((block_table ? "block table, one request aborted" : "CSR"));
    RunOptions opt;
    opt.split = true;
    opt.num_sms = 4;
    opt.block_table = block_table;
    if (block_table) {
      opt.status.assign(c.batch, kv::RequestStatus{kv::RequestState::ok, -1});
      opt.status[3] = {kv::RequestState::stale_tag, 0};
    }
    MlaDecodePlan plan;
    auto [o, lse] = run_decode_case(f, opt, sm_scale, &plan);
    CHECK(plan.cta_rows == 16);
    CHECK(plan.num_work_items == 8);  // the 150-token request in 3 chunks of 64
    CHECK(plan.chunk_tokens == 64);
    check_decode(f, o, lse, ref, opt.status);
  }
}

TEST_CASE("mla decode on wgmma (warpgroup_mma): every element and lse against FP64, split and aborted") {
  const DecodeCase cases[] = {
      {KvDtype::bf16, MlaScaleMode::none, 64, 1, 64, 3, true},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 64, 2, 16, 3, true},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_tensor, 128, 1, 32, 3},
      {KvDtype::bf16, MlaScaleMode::none, 16, 4, 128, 3},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 128, 2, 64, 2, true},
      {KvDtype::bf16, MlaScaleMode::none, 32, 1, 16, 3},  // 32 rows: stays on mma.sync
      {KvDtype::bf16, MlaScaleMode::none, 8, 8, 32, 3},  // 64 rows of 8 tokens: causal in the tile
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 16, 4, 64, 2},
      {KvDtype::nvfp4, MlaScaleMode::per_tensor, 16, 4, 32, 3},
      {KvDtype::nvfp4, MlaScaleMode::per_tensor, 64, 1, 16, 3, true},
      {KvDtype::nvfp4, MlaScaleMode::per_tensor, 8, 8, 64, 2},  // causal in the tile
      {KvDtype::nvfp4, MlaScaleMode::per_tensor, 128, 1, 32, 2, true},
  };
  const float sm_scale = 1.0f / std::sqrt(192.0f);
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    const DecodeCase& c = cases[i];
    if (!runs_in_this_build(c)) continue;
    SECTION(describe(c)) {
      auto rng = slimserve_test::make_rng(1510 + i);
      DecodeFixture f(c, rng);
      RunOptions wgmma;
      wgmma.wgmma = true;
      const Reference ref = f.reference(sm_scale, wgmma_rounds_latent(c, wgmma));
      {
        INFO("wgmma, unsplit, CSR");
        RunOptions opt;
        opt.wgmma = true;
        MlaDecodePlan plan;
        auto [o, lse] = run_decode_case(f, opt, sm_scale, &plan);
        CHECK((plan.warps_m == 4) == (c.heads * c.query_tokens >= 64));  // the wgmma kernel ran
        check_decode(f, o, lse, ref, {});
      }
      {
        INFO("wgmma, split, block table, one request aborted");
        RunOptions opt;
        opt.wgmma = true;
        opt.split = true;
        opt.block_table = (i % 2) == 0;
        opt.status.assign(c.batch, kv::RequestStatus{kv::RequestState::ok, -1});
        opt.status[1] = {kv::RequestState::stale_tag, 0};
        auto [o, lse] = run_decode_case(f, opt, sm_scale);
        check_decode(f, o, lse, ref, opt.status);
      }
    }
  }
}

// The wgmma kernel folds each group scale into the widened fp16 latent (2^e per token in FP32,
// scale / 2^e in fp16); the mma.sync kernel widens code x 2^k (k >= 0 per token, exact) and
// keeps a P copy per group of P x scale x 2^(8 - k). Scales far from 1 in both directions,
// and groups of one token 2^15 apart, must keep every element within the per-group tolerance
// (tokens past fp16 for a naive code x scale, P x scale x 2^8 past fp16 for a per-group P copy
// without k). Every head count: 8 and 16 heads (with their query tokens) stay on mma.sync
// even when wgmma is asked for.
TEST_CASE("mla decode, FP8 group scales from 1e-8 to 1e4: every element against FP64") {
  const DecodeCase cases[] = {
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 64, 1, 16, 4, false, true},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 128, 1, 64, 3, true, true},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 16, 4, 32, 3, true, true},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 8, 2, 16, 4, false, true},
      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 32, 1, 32, 3, false, true},
  };
  const float sm_scale = 1.0f / std::sqrt(192.0f);
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    const DecodeCase& c = cases[i];
    if (!runs_in_this_build(c)) continue;
    SECTION(describe(c) + " wide scales") {
      auto rng = slimserve_test::make_rng(3710 + i);
      DecodeFixture f(c, rng);
      // The fixture spans what it claims: the largest group scale past 146 (code x scale would
      // leave fp16) and past 256 (P x scale x 2^8 would), the smallest below 1e-6, and tokens
      // whose largest scale is below 2^-22 (the wgmma kernel's per-token power of two clamps).
      float smallest = INFINITY, largest = 0.0f, smallest_token_largest = INFINITY;
      for (std::int32_t page = 0; page < f.table.num_pages; ++page) {
        for (int slot = 0; slot < c.page_size; ++slot) {
          float token_largest = 0.0f;
          for (int grp = 0; grp < mla_scale_groups; ++grp) {
            float scale = 0.0f;
            std::memcpy(&scale, f.cache.record(page, slot) + f.cache.layout.scales_offset + 4 * grp, 4);
            if (!std::isfinite(scale)) continue;  // never written (0xFF bytes)
            smallest = std::min(smallest, scale);
            largest = std::max(largest, scale);
            token_largest = std::max(token_largest, scale);
          }
          if (token_largest > 0.0f) smallest_token_largest = std::min(smallest_token_largest, token_largest);
        }
      }
      CHECK(largest > 256.0f);
      CHECK(smallest < 1e-6f);
      if (c.batch > 3) CHECK(smallest_token_largest < 0x1p-22f);  // the fourth request
      // The default kernel (mma.sync) multiplies exact codes; the wgmma kernel (where it runs)
      // rounds code x scale to fp16, and its reference rounds the same way.
      const Reference ref = f.reference(sm_scale);
      RunOptions wgmma;
      wgmma.wgmma = true;
      const bool rounded = wgmma_rounds_latent(c, wgmma);
      const Reference ref_wgmma = rounded ? f.reference(sm_scale, true) : Reference{};
      struct Run {
        const char* label;
        bool wgmma, split, block_table;
      };
      for (const Run run : {Run{"wgmma, split, CSR", true, true, false},
                            Run{"wgmma, unsplit, block table", true, false, true},
                            Run{"mma.sync, unsplit, CSR", false, false, false},
                            Run{"mma.sync, split, block table", false, true, true}}) {
        INFO(run.label);
        RunOptions opt;
        opt.wgmma = run.wgmma;
        opt.split = run.split;
        opt.block_table = run.block_table;
        auto [o, lse] = run_decode_case(f, opt, sm_scale);
        check_decode(f, o, lse, run.wgmma && rounded ? ref_wgmma : ref, {});
      }
    }
  }
}

// NVFP4 block scales at the ends of E4M3: every record's 32 scale bytes are rewritten to cycle
// through 0 (a zero block), the smallest subnormal 2^-9, the largest subnormal, the smallest
// normal 2^-6, 1, 2^7 and 448 (the widened fp16 values then span e2m1 x 2^-23 .. 6 x 448 x
// 2^-14, subnormals included); first each scale alone in every block, then all mixed. Then
// tensor scales that are not finite and > 0 (or whose x 2^14 is not finite) give NaN rows.
// Both kernels: the 64-row case asks for the wgmma one.
TEST_CASE("mla decode, NVFP4 block scales at the extremes, invalid tensor scales: every element") {
  struct ExtremeCase {
    DecodeCase c;
    bool wgmma;
  };
  const ExtremeCase cases[] = {
      {{KvDtype::nvfp4, MlaScaleMode::per_tensor, 16, 2, 16, 5}, false},
      {{KvDtype::nvfp4, MlaScaleMode::per_tensor, 8, 1, 32, 4}, false},
      {{KvDtype::nvfp4, MlaScaleMode::per_tensor, 16, 4, 32, 3}, true},
  };
  const float sm_scale = 1.0f / std::sqrt(192.0f);
  const std::uint8_t extreme_scales[] = {0x00, 0x01, 0x07, 0x08, 0x38, 0x70, 0x7E};
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    const DecodeCase& c = cases[i].c;
    const bool wgmma = cases[i].wgmma;
    SECTION(describe(c) + (wgmma ? " wgmma" : "")) {
      auto rng = slimserve_test::make_rng(3760 + i);
      DecodeFixture f(c, rng);
      std::size_t rewritten = 0;
      for (std::size_t b = 0; b < c.batch; ++b) {
        const auto pages = f.table.pages_of(b);
        for (std::int64_t pos = 0; pos < f.table.length(b); ++pos) {
          unsigned char* r = f.cache.record(pages[static_cast<std::size_t>(pos / c.page_size)], static_cast<int>(pos % c.page_size));
          for (int blk = 0; blk < latent_dim / nvfp4_block_elements; ++blk) {
            r[latent_dim / 2 + blk] = extreme_scales[static_cast<std::size_t>(pos + blk) % std::size(extreme_scales)];
          }
          ++rewritten;
        }
      }
      REQUIRE(rewritten > 0);
      // One scale for every block first: the tolerance is relative to the largest value a
      // request's scale group holds, so a tiny or subnormal block scale is only seen when no
      // larger one shares its group (a block that widened to zeros would fail here).
      for (const std::uint8_t uniform : extreme_scales) {
        if (uniform == 0x00) continue;  // all zeros: nothing to compare but zeros
        INFO("every block scale 0x" << std::hex << static_cast<int>(uniform));
        DecodeFixture one = f;
        for (std::int32_t page = 0; page < one.table.num_pages; ++page) {
          for (int slot = 0; slot < c.page_size; ++slot) {
            std::memset(one.cache.record(page, slot) + latent_dim / 2, uniform, latent_dim / nvfp4_block_elements);
          }
        }
        one.measure_v_max();
        RunOptions opt;
        opt.wgmma = wgmma;
        MlaDecodePlan plan;
        auto [o, lse] = run_decode_case(one, opt, sm_scale, &plan);
        CHECK((plan.warps_m == 4) == wgmma);
        check_decode(one, o, lse, one.reference(sm_scale), {});
      }
      f.measure_v_max();
      const Reference ref = f.reference(sm_scale);
      for (const bool split : {false, true}) {
        INFO((split ? "split" : "unsplit"));
        RunOptions opt;
        opt.split = split;
        opt.block_table = split;
        opt.wgmma = wgmma;
        auto [o, lse] = run_decode_case(f, opt, sm_scale);
        check_decode(f, o, lse, ref, {});
      }
      for (const float bad_scale : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                    0.0f, -0.05f, nvfp4_above_domain_scale}) {
        INFO("tensor scale " << bad_scale);
        DecodeFixture bad = f;
        bad.cache.static_scale = bad_scale;
        for (const bool split : {false, true}) {
          RunOptions opt;
          opt.split = split;
          opt.wgmma = wgmma;
          auto [o, lse] = run_decode_case(bad, opt, sm_scale);
          std::size_t not_nan = 0, lse_not_marked = 0;
          for (const float v : o) not_nan += !std::isnan(v);
          // Unsplit: the lse is NaN; split: the merge reads a NaN partial lse as an aborted
          // partial (NaN row, lse -inf).
          for (const float l : lse) lse_not_marked += split ? !(l == -INFINITY) : !std::isnan(l);
          CHECK(not_nan == 0);
          CHECK(lse_not_marked == 0);
        }
      }
    }
  }
}

TEST_CASE("mla decode, NVFP4: a NaN block scale in a live record, or a NaN query element, makes exactly its readers' rows NaN") {
  // The append stores a NaN input as its block's E4M3 NaN scale (0x7F). The latent is both K
  // and V, so every row that reads the record (position 0 of a request: all its rows, and a
  // shared prefix's other requests) is NaN in every element, its lse NaN unsplit and -inf split
  // (the merge marks a NaN partial), never an empty row (0, lse -inf); every other row is
  // unchanged, bit for bit. Both kernels. One more row has a NaN query element in its latent
  // part (BF16 queries into NVFP4's fp16 MMA: the saturating conversion must keep it NaN,
  // not turn it into -65504): that row alone is NaN.
  auto rng = slimserve_test::make_rng(2620);
  const DecodeFixture clean({KvDtype::nvfp4, MlaScaleMode::per_tensor, 16, 4, 32, 3}, rng);
  DecodeFixture poisoned = clean;
  const int page = clean.table.pages_of(1)[0];
  poisoned.cache.record(page, 0)[latent_dim / 2 + 5] = nvfp4_nan_scale_code;
  const std::size_t heads = static_cast<std::size_t>(clean.c.heads);
  std::vector<bool> nan_row(static_cast<std::size_t>(clean.qo_indptr.back()) * heads, false);
  for (std::size_t b = 0; b < clean.c.batch; ++b) {
    const auto pages = clean.table.pages_of(b);
    if (std::find(pages.begin(), pages.end(), page) == pages.end()) continue;  // slot 0 of a listed page is live
    for (auto row = static_cast<std::size_t>(clean.qo_indptr[b]) * heads; row < static_cast<std::size_t>(clean.qo_indptr[b + 1]) * heads; ++row) {
      nan_row[row] = true;
    }
  }
  std::size_t query_row = nan_row.size();
  for (std::size_t row = 0; row < nan_row.size(); ++row) {
    if (!nan_row[row] && row % heads == 7) {
      query_row = row;
      break;
    }
  }
  REQUIRE(query_row < nan_row.size());
  poisoned.q_bits[query_row * qk_dim + 100] = 0x7FC0;  // BF16 quiet NaN, latent column 100
  nan_row[query_row] = true;
  const float sm_scale = 1.0f / std::sqrt(192.0f);
  for (const bool wgmma : {false, true}) {
    for (const bool split : {false, true}) {
      INFO((wgmma ? "wgmma" : "mma.sync") << (split ? " split" : " unsplit"));
      RunOptions opt;
      opt.split = split;
      opt.wgmma = wgmma;
      MlaDecodePlan plan;
      const auto [base_o, base_lse] = run_decode_case(clean, opt, sm_scale);
      const auto [o, lse] = run_decode_case(poisoned, opt, sm_scale, &plan);
      CHECK((plan.warps_m == 4) == wgmma);
      const auto [wrong_nan, wrong_lse, wrong_other, nan_rows] =
          tally_nan_rows(nan_row, static_cast<std::size_t>(latent_dim), split, o, lse, base_o, base_lse);
      CHECK(nan_rows >= 4 * heads);
      CHECK(nan_rows < nan_row.size());
      CHECK(wrong_nan == 0);
      CHECK(wrong_lse == 0);
      CHECK(wrong_other == 0);
    }
  }
}

TEST_CASE("mla ragged absorbed prefill: chunks of 0..N query tokens, causal within the chunk") {
  struct RaggedCase {
    DecodeCase c;
    std::vector<std::int32_t> qo_lens;
  };
  const RaggedCase cases[] = {
      {{KvDtype::bf16, MlaScaleMode::none, 16, 24, 16, 4}, {1, 24, 0, 9}},
      {{KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 64, 12, 32, 3, true}, {12, 3, 7}},
      {{KvDtype::fp8_e4m3, MlaScaleMode::per_tensor, 8, 20, 64, 4}, {20, 2, 5, 13}},
      {{KvDtype::bf16, MlaScaleMode::none, 128, 3, 16, 3, true}, {3, 1, 2}},
      {{KvDtype::nvfp4, MlaScaleMode::per_tensor, 16, 9, 32, 3}, {9, 1, 5}},
  };
  const float sm_scale = 1.0f / std::sqrt(192.0f);
  for (std::size_t i = 0; i < std::size(cases); ++i) {
    const RaggedCase& rc = cases[i];
    if (!runs_in_this_build(rc.c)) continue;
    SECTION(describe(rc.c) + " ragged") {
      auto rng = slimserve_test::make_rng(2610 + i);
      DecodeFixture f(rc.c, rng, rc.qo_lens);
      const Reference ref = f.reference(sm_scale);
      {
        INFO("unsplit, CSR");
        auto [o, lse] = run_decode_case(f, RunOptions{}, sm_scale);
        check_decode(f, o, lse, ref, {});
      }
      {
        INFO("split, block table, one request aborted");
        RunOptions opt;
        opt.split = true;
        opt.block_table = (i % 2) == 1;
        opt.status.assign(rc.c.batch, kv::RequestStatus{kv::RequestState::ok, -1});
        opt.status[1] = {kv::RequestState::stale_tag, 0};
        auto [o, lse] = run_decode_case(f, opt, sm_scale);
        check_decode(f, o, lse, ref, opt.status);
      }
      if (i >= 2) {  // three of the cases (TSan time): FP8 per-tensor 8 heads, BF16 128 heads, NVFP4 16 heads
        INFO("wgmma (64-row tiles), split, CSR, one request aborted");
        RunOptions opt;
        opt.wgmma = true;
        opt.split = true;
        opt.status.assign(rc.c.batch, kv::RequestStatus{kv::RequestState::ok, -1});
        opt.status[2] = {kv::RequestState::stale_tag, 0};
        auto [o, lse] = run_decode_case(f, opt, sm_scale);
        check_decode(f, o, lse, wgmma_rounds_latent(rc.c, opt) ? f.reference(sm_scale, true) : ref, opt.status);
      }
    }
  }
  // The plan refuses counts past query_tokens, a short qo_indptr, and qo_indptr without the form.
  MlaDecodePlanArguments pa;
  const std::vector<std::int32_t> indptr{0, 1, 2}, last{5, 7};
  pa.kv_indptr_host = indptr;
  pa.last_page_len_host = last;
  pa.num_sms = 4;
  pa.problem = {2, 64, 16, 16, KvDtype::bf16, MlaScaleMode::none};
  pa.problem.ragged_queries = true;
  const std::vector<std::int32_t> good{0, 16, 20}, too_many{0, 17, 20}, short_indptr{0, 16};
  pa.qo_indptr_host = good;
  CHECK(make_mla_decode_plan(pa).ok());
  pa.qo_indptr_host = too_many;
  CHECK_FALSE(make_mla_decode_plan(pa).ok());
  pa.qo_indptr_host = short_indptr;
  CHECK_FALSE(make_mla_decode_plan(pa).ok());
  pa.qo_indptr_host = good;
  pa.problem.query_tokens = mla_max_chunk_query_tokens + 1;
  CHECK(make_mla_decode_plan(pa).status().code() == StatusCode::unsupported);
  pa.problem.query_tokens = 4;  // a valid uniform problem, but qo_indptr_host without the form
  pa.problem.ragged_queries = false;
  CHECK(make_mla_decode_plan(pa).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("mla decode: bad problems are refused before launch") {
  MlaDecodePlanArguments pa;
  const std::vector<std::int32_t> indptr{0, 1}, last{5};
  pa.kv_indptr_host = indptr;
  pa.last_page_len_host = last;
  pa.num_sms = 4;
  pa.problem = {1, 64, 1, 16, KvDtype::fp8_e4m3, MlaScaleMode::per_token_group};
  CHECK(make_mla_decode_plan(pa).ok());
  auto expect = [&](MlaDecodeProblem p, StatusCode code) {
    MlaDecodePlanArguments bad = pa;
    bad.problem = p;
    const auto plan = make_mla_decode_plan(bad);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == code);
    INFO(plan.status().message());
    CHECK_FALSE(plan.status().message().empty());
  };
  MlaDecodeProblem p = pa.problem;
  p.num_heads = 12;
  expect(p, StatusCode::unsupported);
  p = pa.problem;
  p.num_heads = 256;
  expect(p, StatusCode::unsupported);
  p = pa.problem;
  p.rope_dim = 128;
  expect(p, StatusCode::unsupported);
  p = pa.problem;
  p.latent_dim = 256;
  expect(p, StatusCode::unsupported);
  p = pa.problem;
  p.scale_mode = MlaScaleMode::none;  // FP8 without scales
  expect(p, StatusCode::invalid_argument);
  p = pa.problem;
  p.query_tokens = 9;
  expect(p, StatusCode::unsupported);
  p = pa.problem;
  p.kv_dtype = KvDtype::bf16;  // bf16 with group scales
  expect(p, StatusCode::invalid_argument);
  p = pa.problem;
  p.kv_dtype = KvDtype::nvfp4;  // NVFP4 with group scales (its scales: per-block in the record, per tensor)
  expect(p, StatusCode::invalid_argument);
  // Bad host table.
  MlaDecodePlanArguments bad = pa;
  const std::vector<std::int32_t> bad_last{17};
  bad.last_page_len_host = bad_last;
  CHECK_FALSE(make_mla_decode_plan(bad).ok());
  // Run: a short workspace, missing scales in the view, a cache that differs from the plan.
  auto plan = make_mla_decode_plan(pa);
  REQUIRE(plan.ok());
  alignas(16) static unsigned char ws[64];
  alignas(16) static unsigned char pages[16];
  alignas(16) static unsigned char q[16];
  MlaDecodeArguments a;
  a.cache.pages = pages;
  a.cache.num_pages = 1;
  a.cache.page_size = 16;
  a.cache.dtype = KvDtype::fp8_e4m3;
  a.cache.scale_mode = MlaScaleMode::per_tensor;  // no latent_scale pointer
  a.q = q;
  a.o = q;
  a.sm_scale = 0.1f;
  CHECK_FALSE(run_mla_decode(a, *plan, ws, sizeof(ws), nullptr).ok());
  a.cache.scale_mode = MlaScaleMode::per_token_group;
  const Status short_ws = run_mla_decode(a, *plan, ws, 8, nullptr);
  CHECK(short_ws.code() == StatusCode::resource_exhausted);
  // A cache other than the plan's, and neither / both page-table forms.
  MlaDecodeArguments other = a;
  other.cache.dtype = KvDtype::bf16;
  other.cache.scale_mode = MlaScaleMode::none;
  CHECK_FALSE(run_mla_decode(other, *plan, ws, sizeof(ws), nullptr).ok());
  const std::int32_t ids[1] = {0};
  MlaDecodeArguments both = a;
  both.table = {ids, ids, ids, nullptr, 1, 16};
  both.block_table = {ids, nullptr, ids, 1, 1, 16};
  CHECK_FALSE(run_mla_decode(both, *plan, ws, sizeof(ws), nullptr).ok());
  CHECK_FALSE(run_mla_decode(a, *plan, ws, sizeof(ws), nullptr).ok());  // neither
  // The graph-safe bound covers every smaller batch and any lengths.
  MlaDecodeWorkspaceBound bound{{16, 128, 4, 64, KvDtype::fp8_e4m3, MlaScaleMode::per_token_group}, 132, 1};
  auto limit = mla_decode_workspace_bound(bound);
  REQUIRE(limit.ok());
  for (const std::int32_t batch : {1, 3, 16}) {
    for (const std::int32_t len : {1, 700, 40000}) {
      std::vector<std::int32_t> lens(static_cast<std::size_t>(batch), len);
      MlaDecodePlanArguments args;
      args.problem = bound.problem;
      args.problem.batch_size = batch;
      args.seq_lens_host = lens;
      args.num_sms = 132;
      auto bytes = mla_decode_workspace_size(args);
      REQUIRE(bytes.ok());
      CHECK(*bytes <= *limit);
    }
  }
}

// Few heads per GPU (16, as DeepSeek-V3 at tensor-parallel 8): one 16-row tile per request, so
// batch 64 is 64 CTAs; the split must fill the CTA slots the kernel has, not just the SMs.
TEST_CASE("mla decode plan: the split fills the chosen kernel's CTA slots") {
  constexpr std::int32_t sms = 132;
  const std::vector<std::int32_t> lens(64, 8192);
  struct Row {
    KvDtype dtype;
    MlaScaleMode mode;
    std::int32_t heads;
    bool wgmma;
    std::int32_t ctas_per_sm;  // 0: the kernel's
    std::int32_t warps_m, resident, items, chunk;
  };
  for (const Row row : {
           Row{KvDtype::bf16, MlaScaleMode::none, 16, false, 0, 1, 1, 128, 4096},  // 126 KB: one per SM
           Row{KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 16, false, 0, 1, 2, 256, 2048},  // two per SM
           Row{KvDtype::fp8_e4m3, MlaScaleMode::per_tensor, 8, false, 0, 1, 2, 256, 2048},
           Row{KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 16, false, 1, 1, 2, 128, 4096},  // the caller's
           Row{KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 32, false, 0, 2, 1, 128, 4096},
           Row{KvDtype::fp8_e4m3, MlaScaleMode::per_token_group, 64, true, 0, 4, 1, 128, 4096},
           Row{KvDtype::bf16, MlaScaleMode::none, 128, false, 0, 2, 1, 256, 8192},  // fills: no split
           Row{KvDtype::nvfp4, MlaScaleMode::per_tensor, 16, false, 0, 1, 2, 256, 2048},  // two per SM, as FP8
           Row{KvDtype::nvfp4, MlaScaleMode::per_tensor, 64, false, 0, 2, 1, 128, 8192},  // 128 tiles fill
           Row{KvDtype::nvfp4, MlaScaleMode::per_tensor, 64, true, 0, 4, 1, 128, 4096},  // wgmma, as FP8
       }) {
    INFO(to_string(row.dtype) << " H" << row.heads << (row.wgmma ? " wgmma" : "") << " ctas_per_sm " << row.ctas_per_sm);
    CHECK(mla_decode_resident_ctas(row.dtype, row.warps_m) == row.resident);
    MlaDecodePlanArguments pa;
    pa.problem = {64, row.heads, 1, 64, row.dtype, row.mode};
    pa.problem.warpgroup_mma = row.wgmma;
    pa.seq_lens_host = lens;
    pa.num_sms = sms;
    pa.ctas_per_sm = row.ctas_per_sm;
    auto plan = make_mla_decode_plan(pa);
    REQUIRE(plan.ok());
    CHECK(plan->warps_m == row.warps_m);
    CHECK(plan->num_work_items == row.items);
    CHECK(plan->chunk_tokens == row.chunk);
    CHECK(plan->split_kv == (row.items > plan->num_units));
    if (plan->split_kv) {
      // The partials the merge reads: one [rows, 512] block and LSE per work item.
      CHECK(plan->layout.partial_lse - plan->layout.partial_o >=
            static_cast<std::size_t>(row.items) * static_cast<std::size_t>(plan->cta_rows) * mla_latent_dim * sizeof(float));
    }
    // The graph bound with the same ctas_per_sm covers the plan (also for every smaller batch).
    MlaDecodeWorkspaceBound bound{pa.problem, sms, row.ctas_per_sm};
    auto limit = mla_decode_workspace_bound(bound);
    REQUIRE(limit.ok());
    CHECK(*limit >= plan->layout.total_bytes);
    for (const std::int32_t batch : {1, 7, 33}) {
      MlaDecodePlanArguments smaller = pa;
      smaller.problem.batch_size = batch;
      smaller.seq_lens_host = std::span<const std::int32_t>(lens).first(static_cast<std::size_t>(batch));
      auto bytes = mla_decode_workspace_size(smaller);
      REQUIRE(bytes.ok());
      CHECK(*bytes <= *limit);
    }
  }
  MlaDecodePlanArguments bad;
  bad.problem = {64, 16, 1, 64, KvDtype::bf16, MlaScaleMode::none};
  bad.seq_lens_host = lens;
  bad.num_sms = sms;
  bad.ctas_per_sm = -1;
  const auto refused = make_mla_decode_plan(bad);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::invalid_argument);
  CHECK(mla_decode_workspace_bound(MlaDecodeWorkspaceBound{bad.problem, sms, -1}).status().code() ==
        StatusCode::invalid_argument);
}

TEST_CASE("mla gather: cached prefix to BF16, aborted rows NaN") {
  for (const auto& [dtype, mode] : {std::pair{KvDtype::fp8_e4m3, MlaScaleMode::per_token_group},
                                    std::pair{KvDtype::bf16, MlaScaleMode::none},
                                    std::pair{KvDtype::fp8_e4m3, MlaScaleMode::per_tensor},
                                    std::pair{KvDtype::nvfp4, MlaScaleMode::per_tensor}}) {
    auto rng = slimserve_test::make_rng(1420 + static_cast<int>(mode) + 7 * static_cast<int>(dtype));
    const DecodeCase c{dtype, mode, 8, 1, 32, 5};
    DecodeFixture f(c, rng);
    std::vector<std::int32_t> token_indptr{0};
    for (std::size_t b = 0; b < c.batch; ++b) token_indptr.push_back(token_indptr.back() + static_cast<std::int32_t>(f.table.length(b)));
    std::vector<kv::RequestStatus> status(c.batch, kv::RequestStatus{kv::RequestState::ok, -1});
    status[3] = {kv::RequestState::page_out_of_range, 0};
    const auto rows = static_cast<std::size_t>(token_indptr.back());
    const std::int64_t stride = 584;  // a strided output
    DeviceMlaCache cache(f.cache);
    auto indptr = upload(f.table.indptr);
    auto indices = upload(f.table.indices);
    auto last = upload(f.table.last_page_len);
    auto tok = upload(token_indptr);
    auto st = upload(status);
    auto out = upload(std::vector<std::uint16_t>((rows + 2) * static_cast<std::size_t>(stride), 0x7777));
    MlaGatherArguments a;
    a.cache = cache.view;
    a.table = {indptr.data(), indices.data(), last.data(), nullptr, static_cast<std::int32_t>(c.batch), c.page_size};
    a.request_status = st.data();
    a.token_indptr = tok.data();
    a.out = out.data();
    a.out_stride = stride;
    a.num_rows = static_cast<std::int32_t>(rows + 2);  // an upper bound: the extra rows stay
    REQUIRE(gather_mla_latent(a, nullptr).ok());
    const auto got = download(out, (rows + 2) * static_cast<std::size_t>(stride));
    std::size_t bad = 0;
    for (std::size_t b = 0; b < c.batch; ++b) {
      const auto pages = f.table.pages_of(b);
      for (std::int64_t pos = 0; pos < f.table.length(b); ++pos) {
        const std::size_t row = static_cast<std::size_t>(token_indptr[b] + pos);
        for (int d = 0; d < qk_dim; ++d) {
          const float v = to_float(bf16::from_bits(got[row * static_cast<std::size_t>(stride) + static_cast<std::size_t>(d)]));
          if (!kv::request_ok(status[b])) {
            if (!std::isnan(v)) ++bad;
            continue;
          }
          const float want = to_float(from_float<bf16>(static_cast<float>(
              f.cache.real(pages[static_cast<std::size_t>(pos / c.page_size)], static_cast<int>(pos % c.page_size), d))));
          if (!(v == want) && bad++ < 5) std::printf("row %zu d %d: %f vs %f\n", row, d, static_cast<double>(v), static_cast<double>(want));
        }
        for (std::int64_t d = qk_dim; d < stride; ++d) {
          if (got[row * static_cast<std::size_t>(stride) + static_cast<std::size_t>(d)] != 0x7777) ++bad;
        }
      }
    }
    for (std::size_t i = rows * static_cast<std::size_t>(stride); i < got.size(); ++i) if (got[i] != 0x7777) ++bad;
    CHECK(bad == 0);
  }
}
