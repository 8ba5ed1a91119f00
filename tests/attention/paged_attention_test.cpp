// Tensor-core paged attention against an FP64 reference computed from the stored (already
// quantized) cache: ragged prefill chunks over cached prefixes (1, page-1, page, page+1, long),
// decode and speculative verify, GQA 1/4/8 and MQA 64, FP8 e4m3/e5m2 x per-tensor/per-token
// and BF16/FP16, head_dim 64/96/128/192/256, shuffled pages with holes and a shared prefix, split vs
// unsplit, sliding window, soft-cap, sinks, custom sm_scale, strided q/o, aborted requests,
// bad page ids, preflight errors; block-table vs CSR and one vs two K/V allocations
// (bit-identical), block-table preflight.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <vector>

#include "attention_test_support.hpp"
#include "slimserve/attention/paged_attention.hpp"
#include "slimserve/kv/page_table_builder.hpp"

using namespace attn_test;

namespace {

struct PagedCase {
  KvDtype dtype;
  KvLayout layout;
  KvScaleMode scale_mode;
  int head_dim;
  int num_kv_heads;
  int group;
  int page_size;
  ActivationDtype q_dtype;
  std::vector<std::int64_t> kv_lengths;  // tokens in the pages, the chunk included
  std::vector<std::int32_t> qo_lengths;  // the chunk (query tokens): the last qo positions
};

struct Options {
  std::optional<float> sm_scale;
  std::int32_t window_left = -1;
  float soft_cap = 0.0f;
  std::vector<float> sinks;  // [H_qo] or empty
  bool causal = true;
};

struct Fixture {
  PagedCase c;
  HostPageTable table;
  HostCache cache;
  std::vector<std::int32_t> qo_indptr{0};
  std::vector<float> q_values;  // [tokens, H_qo, D] as the kernel reads them
  std::vector<std::uint16_t> q_bits;
  std::vector<double> v_max;  // per request and KV head: largest |v| of the request

  Fixture(const PagedCase& pc, std::mt19937_64& rng)
      : c(pc), table(make_page_table(pc.kv_lengths, pc.page_size, rng, pc.kv_lengths.size() > 2)),
        cache(CacheShape{pc.dtype, pc.layout, pc.scale_mode, table.num_pages, pc.page_size,
                         pc.num_kv_heads, pc.head_dim}) {
    fill_cache(cache, table, c.kv_lengths, rng);
    for (auto len : c.qo_lengths) qo_indptr.push_back(qo_indptr.back() + len);
    Activations q = random_activations(rng, c.q_dtype, tokens() * static_cast<std::size_t>(num_qo_heads() * c.head_dim));
    q_bits = std::move(q.bits);
    q_values = std::move(q.values);
    for (std::size_t b = 0; b < c.kv_lengths.size(); ++b) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        v_max.push_back(max_abs_value(c.kv_lengths[b], c.head_dim, stored_values(cache, table, b, h, true)));
      }
    }
  }
  int num_qo_heads() const { return c.num_kv_heads * c.group; }
  std::size_t tokens() const { return static_cast<std::size_t>(qo_indptr.back()); }
  PagedAttentionProblem problem(bool causal = true) const {
    PagedAttentionProblem p;
    p.batch_size = static_cast<std::int32_t>(c.kv_lengths.size());
    p.num_qo_heads = num_qo_heads();
    p.num_kv_heads = c.num_kv_heads;
    p.head_dim = c.head_dim;
    p.page_size = c.page_size;
    p.kv_dtype = c.dtype;
    p.q_dtype = c.q_dtype;
    p.causal = causal;
    return p;
  }
};

/// FP64 attention of every (query token, head) over the stored cache, with the options.
Reference reference(const Fixture& f, const Options& opt) {
  const int d_dim = f.c.head_dim;
  const int heads = f.num_qo_heads();
  const std::size_t d_size = static_cast<std::size_t>(d_dim);
  Reference ref;
  ref.o.assign(f.tokens() * static_cast<std::size_t>(heads * d_dim), 0.0);
  ref.lse.assign(f.tokens() * static_cast<std::size_t>(heads), -INFINITY);
  for (std::size_t b = 0; b < f.c.kv_lengths.size(); ++b) {
    const std::int64_t len = f.c.kv_lengths[b];
    const std::int32_t qo_len = f.c.qo_lengths[b];
    for (std::int32_t i = 0; i < qo_len; ++i) {
      const std::int64_t position = len - qo_len + i;
      const std::int64_t end = opt.causal ? position + 1 : len;
      const std::int64_t begin = opt.window_left >= 0 ? std::max<std::int64_t>(0, position - opt.window_left) : 0;
      const std::size_t token = static_cast<std::size_t>(f.qo_indptr[b] + i);
      for (int h = 0; h < heads; ++h) {
        const std::size_t row = token * static_cast<std::size_t>(heads) + static_cast<std::size_t>(h);
        RowOptions row_opt;
        row_opt.sm_scale = opt.sm_scale ? static_cast<double>(*opt.sm_scale) : 1.0 / std::sqrt(static_cast<double>(d_dim));
        row_opt.soft_cap = opt.soft_cap;
        if (!opt.sinks.empty()) row_opt.sink = opt.sinks[static_cast<std::size_t>(h)];
        ref.lse[row] = attend_row(f.q_values.data() + row * d_size, d_dim, begin, end, row_opt,
                                  stored_values(f.cache, f.table, b, h / f.c.group, false),
                                  stored_values(f.cache, f.table, b, h / f.c.group, true), ref.o.data() + row * d_size);
      }
    }
  }
  return ref;
}

struct RunConfig {
  bool allow_split = false;
  std::int32_t num_sms = 132;
  const std::vector<kv::RequestStatus>* status = nullptr;
  const HostCache* cache_override = nullptr;
  const HostPageTable* table_override = nullptr;  // device table (e.g. with bad page ids)
  std::int64_t q_token_stride = 0, q_head_stride = 0;  // elements; 0 = packed
  bool block_table = false;  // the 2-D block table + seq_lens instead of CSR
  bool combined_kv = false;  // K and V pages interleaved in one allocation [pages, 2, page]
  std::int64_t page_padding = 0;  // poisoned elements after each page (strided pages)
  std::uint64_t seed = 0;         // for the garbage past each block-table row's pages
  std::int32_t device_seq_len_bump = 0;  // added to request 0's device seq_len only
  bool warpgroup_mma = false;  // PagedAttentionPlanArguments::warpgroup_mma
  PrefillWgmmaKernel wgmma_kernel = PrefillWgmmaKernel::ping_pong;  // ... and wgmma_kernel
};

/// The same pages as `t` in block-table form: rows of `width` entries; the entries past a
/// request's pages hold garbage (ids of other pages, ids outside the cache) that must never
/// be read.
struct HostBlockTable {
  std::vector<std::int32_t> ids, seq_lens;
  std::int32_t width = 0;
};
HostBlockTable to_block_table(const HostPageTable& t, std::int32_t page_size, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostBlockTable bt;
  const std::size_t batch = t.lengths.size();
  for (std::size_t b = 0; b < batch; ++b) bt.width = std::max(bt.width, t.indptr[b + 1] - t.indptr[b]);
  bt.width += 3;
  std::uniform_int_distribution<std::int32_t> any_page(0, t.num_pages - 1);
  for (std::size_t b = 0; b < batch; ++b) {
    const auto pages = t.pages_of(b);
    for (std::int32_t j = 0; j < bt.width; ++j) {
      const auto at = static_cast<std::size_t>(j);
      bt.ids.push_back(at < pages.size() ? pages[at] : (j % 2 == 0 ? any_page(rng) : t.num_pages + 1000 * j + 7));
    }
    const std::int64_t len = t.indptr[b + 1] == t.indptr[b]
                                 ? 0
                                 : static_cast<std::int64_t>(t.indptr[b + 1] - t.indptr[b] - 1) * page_size +
                                       t.last_page_len[b];
    bt.seq_lens.push_back(static_cast<std::int32_t>(len));
  }
  return bt;
}

struct Output {
  std::vector<std::uint16_t> o_bits;  // packed [tokens, H_qo, D], as written
  std::vector<float> o;    // packed [tokens, H_qo, D]
  std::vector<float> lse;
  PagedAttentionPlan plan;
  bool ran_wgmma = false;  // runs_warpgroup_mma: the wgmma kernel was launched
};

Output run(const Fixture& f, const Options& opt, const RunConfig& rc = {}) {
  const HostCache& host_cache = rc.cache_override ? *rc.cache_override : f.cache;
  DeviceCache cache(host_cache);
  // One allocation: page p is [K page | V page | padding], padding poisoned (0xFF is NaN in
  // every stored format).
  rt::DeviceBuffer<unsigned char> combined;
  if (rc.combined_kv || rc.page_padding != 0) {
    const auto ebytes = static_cast<std::size_t>(element_bytes(f.c.dtype));
    const std::size_t page_bytes = host_cache.elements_total() / static_cast<std::size_t>(f.table.num_pages) * ebytes;
    const std::size_t halves = rc.combined_kv ? 2 : 1;
    const std::size_t stride_bytes = halves * page_bytes + static_cast<std::size_t>(rc.page_padding) * ebytes;
    std::vector<unsigned char> bytes(static_cast<std::size_t>(f.table.num_pages) * stride_bytes * (rc.combined_kv ? 1 : 2), 0xFF);
    const std::size_t v_base = rc.combined_kv ? page_bytes : static_cast<std::size_t>(f.table.num_pages) * stride_bytes;
    for (std::size_t page = 0; page < static_cast<std::size_t>(f.table.num_pages); ++page) {
      std::memcpy(bytes.data() + page * stride_bytes, host_cache.k.data() + page * page_bytes, page_bytes);
      std::memcpy(bytes.data() + v_base + page * stride_bytes, host_cache.v.data() + page * page_bytes, page_bytes);
    }
    combined = upload(bytes);
    cache.view.k_pages = combined.data();
    cache.view.v_pages = combined.data() + v_base;
    cache.view.page_stride = static_cast<std::int64_t>(stride_bytes / ebytes);
  }
  const HostPageTable& device_table = rc.table_override ? *rc.table_override : f.table;
  auto indptr = upload(device_table.indptr);
  auto indices = upload(device_table.indices);
  auto last = upload(device_table.last_page_len);
  HostBlockTable block = to_block_table(device_table, f.c.page_size, rc.seed);
  const std::vector<std::int32_t> host_seq_lens = block.seq_lens;
  block.seq_lens[0] += rc.device_seq_len_bump;
  auto block_ids = upload(block.ids);
  auto seq_lens = upload(block.seq_lens);
  auto qo_indptr = upload(f.qo_indptr);
  const std::size_t heads = static_cast<std::size_t>(f.num_qo_heads());
  const std::size_t d_dim = static_cast<std::size_t>(f.c.head_dim);
  // Queries, possibly strided: token stride and head stride in elements (padding is poison).
  const std::size_t head_stride = rc.q_head_stride ? static_cast<std::size_t>(rc.q_head_stride) : d_dim;
  const std::size_t token_stride = rc.q_token_stride ? static_cast<std::size_t>(rc.q_token_stride) : heads * d_dim;
  std::vector<std::uint16_t> q_host(std::max<std::size_t>(f.tokens(), 1) * token_stride, 0x7FC1);
  for (std::size_t t = 0; t < f.tokens(); ++t) {
    for (std::size_t h = 0; h < heads; ++h) {
      for (std::size_t d = 0; d < d_dim; ++d) {
        q_host[t * token_stride + h * head_stride + d] = f.q_bits[(t * heads + h) * d_dim + d];
      }
    }
  }
  auto q = upload(q_host);
  auto o = rt::DeviceBuffer<std::uint16_t>::create(std::max<std::size_t>(f.q_bits.size(), 1));
  auto lse = rt::DeviceBuffer<float>::create(std::max<std::size_t>(f.tokens() * heads, 1));
  REQUIRE(o.ok());
  REQUIRE(lse.ok());
  REQUIRE(o->fill_bytes(0xFF).ok());
  REQUIRE(lse->fill_bytes(0xFF).ok());
  rt::DeviceBuffer<kv::RequestStatus> status_device;
  if (rc.status != nullptr) status_device = upload(*rc.status);
  rt::DeviceBuffer<float> sinks_device;
  if (!opt.sinks.empty()) sinks_device = upload(opt.sinks);

  PagedAttentionPlanArguments plan_args{f.problem(opt.causal), f.qo_indptr, f.table.indptr, f.table.last_page_len};
  if (rc.block_table) plan_args = {f.problem(opt.causal), f.qo_indptr, {}, {}, host_seq_lens};
  plan_args.allow_split = rc.allow_split;
  plan_args.num_sms = rc.num_sms;
  plan_args.ctas_per_sm = 1;
  plan_args.min_chunk_tokens = 128;
  plan_args.warpgroup_mma = rc.warpgroup_mma;
  plan_args.wgmma_kernel = rc.wgmma_kernel;
  auto bytes = paged_attention_workspace_size(plan_args);
  INFO((bytes.ok() ? std::string() : bytes.status().to_string()));
  REQUIRE(bytes.ok());
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*bytes);
  REQUIRE(workspace.ok());
  REQUIRE(workspace->fill_bytes(0xFF).ok());
  auto plan = plan_paged_attention(plan_args, workspace->data(), *bytes, nullptr);
  REQUIRE(plan.ok());

  PagedAttentionArguments args;
  args.cache = cache.view;
  const auto batch = static_cast<std::int32_t>(f.c.kv_lengths.size());
  if (rc.block_table) {
    args.block_table = kv::BlockTableView{block_ids.data(), nullptr, seq_lens.data(), batch, block.width, f.c.page_size};
  } else {
    args.table = kv::PageTableView{indptr.data(), indices.data(), last.data(), nullptr, batch, f.c.page_size};
  }
  args.request_status = rc.status != nullptr ? status_device.data() : nullptr;
  args.qo_indptr = qo_indptr.data();
  args.q = q.data();
  args.o = o->data();
  args.lse = lse->data();
  args.q_token_stride = rc.q_token_stride;
  args.q_head_stride = rc.q_head_stride;
  args.sm_scale = opt.sm_scale;
  args.window_left = opt.window_left;
  args.logit_soft_cap = opt.soft_cap;
  args.sinks = opt.sinks.empty() ? nullptr : sinks_device.data();
  const Status s = run_paged_attention(args, *plan, workspace->data(), *bytes, nullptr);
  INFO(s.to_string());
  REQUIRE(s.ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());

  Output out;
  out.plan = *plan;
  out.ran_wgmma = runs_warpgroup_mma(args, *plan);
  out.o_bits = download(*o, f.q_bits.size());
  for (auto bits : out.o_bits) out.o.push_back(from_activation(f.c.q_dtype, bits));
  out.lse = download(*lse, f.tokens() * heads);
  return out;
}

double tolerance(const Fixture& f, double ref, double v_max) {
  return tensor_core_tolerance(f.c.q_dtype, f.c.dtype, ref, v_max);
}

/// Request of each output row (token * heads + head).
std::vector<std::size_t> row_requests(const std::vector<std::int32_t>& qo_indptr, std::size_t heads) {
  std::vector<std::size_t> out;
  for (std::size_t b = 0; b + 1 < qo_indptr.size(); ++b) {
    out.insert(out.end(), static_cast<std::size_t>(qo_indptr[b + 1] - qo_indptr[b]) * heads, b);
  }
  return out;
}

void check(const Fixture& f, const Output& out, const Reference& ref, const std::vector<bool>* aborted = nullptr) {
  const std::size_t heads = static_cast<std::size_t>(f.num_qo_heads());
  const std::vector<std::size_t> request = row_requests(f.qo_indptr, heads);
  const RowComparison r = compare_rows(
      out.o, out.lse, ref, f.tokens() * heads, f.c.head_dim,
      [&](std::size_t row, double want) {
        const std::size_t kv_head = row % heads / static_cast<std::size_t>(f.c.group);
        return tolerance(f, want, f.v_max[request[row] * static_cast<std::size_t>(f.c.num_kv_heads) + kv_head]);
      },
      [&](std::size_t row) { return aborted != nullptr && (*aborted)[request[row]]; },
      [&](std::size_t row) {
        return "request " + std::to_string(request[row]) + " token " + std::to_string(row / heads) + " head " +
               std::to_string(row % heads) + " (split " + std::to_string(out.plan.split_kv) + " rows " +
               std::to_string(out.plan.cta_rows) + ")";
      });
  CHECK(r.checked > 0);
  CHECK(r.mismatches == 0);
}

/// Largest |error| / v_max of an output against the reference (for the accuracy report).
double max_relative_error(const Fixture& f, const Output& out, const Reference& ref) {
  double worst = 0.0;
  const std::size_t d_dim = static_cast<std::size_t>(f.c.head_dim);
  const std::size_t heads = static_cast<std::size_t>(f.num_qo_heads());
  for (std::size_t row = 0; row < f.tokens() * heads; ++row) {
    const std::size_t token = row / heads;
    std::size_t b = 0;
    while (static_cast<std::size_t>(f.qo_indptr[b + 1]) <= token) ++b;
    const double v_max = f.v_max[b * static_cast<std::size_t>(f.c.num_kv_heads) + (row % heads) / static_cast<std::size_t>(f.c.group)];
    for (std::size_t d = 0; d < d_dim; ++d) {
      worst = std::max(worst, std::fabs(out.o[row * d_dim + d] - ref.o[row * d_dim + d]) / v_max);
    }
  }
  return worst;
}

void check_split_and_unsplit(const Fixture& f, const Options& opt = {}) {
  const Reference ref = reference(f, opt);
  const Output unsplit = run(f, opt);
  CHECK_FALSE(unsplit.plan.split_kv);
  check(f, unsplit, ref);
  const Output split = run(f, opt, RunConfig{true, 4096});  // a wide device: chunks of 128
  std::int64_t longest = 0;
  for (auto len : f.c.kv_lengths) longest = std::max(longest, len);
  CHECK(split.plan.split_kv == (longest > 128));
  check(f, split, ref);
  std::printf("  %s %s D%d G%d: max |err| / v_max %.2e unsplit, %.2e split (rows/CTA %d)\n",
              std::string(to_string(f.c.dtype)).c_str(), std::string(to_string(f.c.scale_mode)).c_str(),
              f.c.head_dim, f.c.group, max_relative_error(f, unsplit, ref), max_relative_error(f, split, ref),
              unsplit.plan.cta_rows);
}


/// A copy of the cache in which every page that only aborted requests use holds NaN codes (and
/// NaN per-token scales): a kernel that reads any of them, against the tag check's verdict,
/// puts NaN into a live output. Single KV head (head 0).
HostCache poison_pages_only_aborted_read(const Fixture& f, const std::vector<bool>& aborted) {
  std::set<int> live;
  for (std::size_t b = 0; b < aborted.size(); ++b) {
    if (!aborted[b]) {
      for (int page : f.table.pages_of(b)) live.insert(page);
    }
  }
  HostCache poisoned = f.cache;
  const bool token_scales = !poisoned.k_token_scale.empty();
  for (std::size_t b = 0; b < aborted.size(); ++b) {
    if (!aborted[b]) continue;
    for (int page : f.table.pages_of(b)) {
      if (live.count(page) != 0) continue;
      for (int slot = 0; slot < f.c.page_size; ++slot) {
        if (token_scales) {
          poisoned.k_token_scale[poisoned.scale_offset(page, slot, 0)] = NAN;
          poisoned.v_token_scale[poisoned.scale_offset(page, slot, 0)] = NAN;
        }
        for (int d = 0; d < f.c.head_dim; ++d) {
          poisoned.set_bits(poisoned.k, poisoned.offset(page, slot, 0, d), 0x7F);
          poisoned.set_bits(poisoned.v, poisoned.offset(page, slot, 0, d), 0x7F);
        }
      }
    }
  }
  return poisoned;
}

/// The attention options one at a time through `check`: a sliding window whose edges fall
/// mid-page and mid-tile, soft-cap with a custom sm_scale, per-head sinks (with a window), and
/// non-causal.
template <class Check>
void check_each_option(const Fixture& f, float capped_sm_scale, Check&& check) {
  Options window;
  window.window_left = 16;
  check(f, window);
  Options capped;
  capped.soft_cap = 5.0f;
  capped.sm_scale = capped_sm_scale;
  check(f, capped);
  Options sinks;
  for (int h = 0; h < f.num_qo_heads(); ++h) sinks.sinks.push_back(static_cast<float>(h) - 1.5f);
  sinks.window_left = 50;
  check(f, sinks);
  Options full;
  full.causal = false;
  check(f, full);
}

const auto bf = ActivationDtype::bf16;
const auto fp = ActivationDtype::fp16;

}  // namespace

TEST_CASE("paged attention: decode (GQA 8) over FP8 and BF16 pages", "[attention][paged]") {
  auto rng = slimserve_test::make_rng(1001);
  using enum KvDtype;
  for (const PagedCase& c : std::vector<PagedCase>{
           {fp8_e4m3, KvLayout::hnd, KvScaleMode::per_tensor, 128, 2, 8, 16, bf, {1, 15, 16, 17, 300}, {1, 1, 1, 1, 1}},
           {bf16, KvLayout::nhd, KvScaleMode::none, 128, 2, 8, 16, bf, {1, 15, 16, 17, 300}, {1, 1, 1, 1, 1}},
           {fp8_e5m2, KvLayout::nhd, KvScaleMode::per_token, 64, 1, 8, 32, fp, {1, 31, 32, 33, 200}, {1, 1, 1, 1, 1}},
       }) {
    INFO("dtype " << to_string(c.dtype) << " D " << c.head_dim);
    Fixture f(c, rng);
    check_split_and_unsplit(f);
  }
}

TEST_CASE("paged attention: ragged prefill chunks over cached prefixes", "[attention][paged]") {
  auto rng = slimserve_test::make_rng(1002);
  using enum KvDtype;
  for (const PagedCase& c : std::vector<PagedCase>{
           // chunks of 1, page-1, page, page+1 and long, on prefixes that end mid-page
           {bf16, KvLayout::hnd, KvScaleMode::none, 64, 1, 4, 16, bf, {1, 15 + 5, 16 + 16, 17 + 3, 150}, {1, 15, 16, 17, 70}},
           {fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, 128, 1, 2, 16, bf, {9, 15 + 21, 16, 17 + 40, 130}, {1, 15, 16, 17, 90}},
           {fp16, KvLayout::nhd, KvScaleMode::per_tensor, 64, 2, 1, 32, fp, {31 + 2, 32 + 1, 33, 160}, {31, 32, 33, 60}},
           {fp8_e5m2, KvLayout::hnd, KvScaleMode::per_tensor, 256, 1, 1, 16, fp, {20, 17 + 140}, {20, 17}},
       }) {
    INFO("dtype " << to_string(c.dtype) << " D " << c.head_dim << " group " << c.group);
    Fixture f(c, rng);
    check_split_and_unsplit(f);
  }
}

TEST_CASE("paged attention: speculative verify and MQA with 64 query heads", "[attention][paged]") {
  auto rng = slimserve_test::make_rng(1003);
  using enum KvDtype;
  {
    Fixture f({fp8_e4m3, KvLayout::hnd, KvScaleMode::per_tensor, 128, 2, 4, 16, fp, {4, 40, 129}, {4, 3, 4}}, rng);
    check_split_and_unsplit(f);
  }
  {
    // MQA: 64 query heads share one BF16 KV head at head_dim 128 (refused by the CUDA-core decode).
    Fixture f({bf16, KvLayout::nhd, KvScaleMode::none, 128, 1, 64, 16, bf, {33, 150}, {1, 1}}, rng);
    check_split_and_unsplit(f);
  }
}

TEST_CASE("paged attention: window, soft-cap, sinks, sm_scale, non-causal", "[attention][paged]") {
  auto rng = slimserve_test::make_rng(1004);
  Fixture f({KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, 64, 2, 2, 16, bf, {40, 1, 17 + 60, 200}, {20, 1, 17, 1}}, rng);
  check_each_option(f, 0.3f, [](const Fixture& fx, const Options& opt) { check_split_and_unsplit(fx, opt); });
}

TEST_CASE("paged attention: strided queries give the packed result", "[attention][paged]") {
  auto rng = slimserve_test::make_rng(1005);
  Fixture f({KvDtype::bf16, KvLayout::hnd, KvScaleMode::none, 64, 2, 2, 16, bf, {30, 50}, {7, 20}}, rng);
  const Reference ref = reference(f, {});
  RunConfig rc;
  rc.q_head_stride = 64 + 16;          // heads padded
  rc.q_token_stride = 3 * 4 * (64 + 16);  // q is the first third of a fused QKV row
  check(f, run(f, {}, rc), ref);
}

TEST_CASE("paged attention: aborted requests read no page and are marked", "[attention][paged]") {
  auto rng = slimserve_test::make_rng(1006);
  Fixture f({KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, 64, 1, 4, 16, bf, {20, 300, 33, 50}, {3, 1, 33, 10}}, rng);
  std::vector<kv::RequestStatus> status(4, kv::RequestStatus{kv::RequestState::ok, -1});
  status[1] = {kv::RequestState::stale_tag, 3};
  status[3] = {kv::RequestState::page_out_of_range, 0};
  const std::vector<bool> aborted{false, true, false, true};
  const HostCache poisoned = poison_pages_only_aborted_read(f, aborted);
  const Reference ref = reference(f, {});
  for (bool split : {false, true}) {
    RunConfig rc{split, 4096, &status, &poisoned};
    check(f, run(f, {}, rc), ref, &aborted);
  }
}

namespace {
/// Request 0 loses tokens 16..31 (a page id past the cache), request 1 tokens 0..15 (a
/// negative id): those tokens never count, the others do.
void check_bad_page_ids(int head_dim, std::vector<std::int32_t> qo_lengths, bool warpgroup_mma) {
  auto rng = slimserve_test::make_rng(1007);
  Fixture f({KvDtype::bf16, KvLayout::nhd, KvScaleMode::none, head_dim, 1, 2, 16, bf, {64, 40}, std::move(qo_lengths)}, rng);
  HostPageTable broken = f.table;
  broken.indices[static_cast<std::size_t>(broken.indptr[0] + 1)] = f.table.num_pages + 7;  // tokens 16..31
  broken.indices[static_cast<std::size_t>(broken.indptr[1])] = -3;                         // tokens 0..15
  // Reference: those tokens removed, i.e. their V and K never count.
  RunConfig rc{false, 132, nullptr, nullptr, &broken};
  rc.warpgroup_mma = warpgroup_mma;
  const Output out = run(f, {}, rc);
  CHECK(out.ran_wgmma == warpgroup_mma);
  const std::size_t heads = static_cast<std::size_t>(f.num_qo_heads());
  const std::size_t d_dim = static_cast<std::size_t>(head_dim);
  std::size_t bad = 0;
  for (std::size_t b = 0; b < 2; ++b) {
    const auto pages = f.table.pages_of(b);
    const std::int64_t len = f.c.kv_lengths[b];
    for (std::int32_t i = 0; i < f.c.qo_lengths[b]; ++i) {
      const std::int64_t position = len - f.c.qo_lengths[b] + i;
      for (std::size_t h = 0; h < heads; ++h) {
        const std::size_t row = (static_cast<std::size_t>(f.qo_indptr[b] + i)) * heads + h;
        std::vector<double> s, o(d_dim, 0.0);
        std::vector<std::int64_t> kept;
        double m = -INFINITY;
        for (std::int64_t p = 0; p <= position; ++p) {
          const bool lost = (b == 0 && p / 16 == 1) || (b == 1 && p / 16 == 0);
          if (lost) continue;
          double dot = 0;
          for (std::size_t d = 0; d < d_dim; ++d) {
            dot += f.q_values[row * d_dim + d] * f.cache.real(false, pages[static_cast<std::size_t>(p / 16)], static_cast<int>(p % 16), 0, static_cast<int>(d));
          }
          s.push_back(dot / std::sqrt(static_cast<double>(head_dim)));
          kept.push_back(p);
          m = std::max(m, s.back());
        }
        double sum = 0;
        for (std::size_t k = 0; k < kept.size(); ++k) {
          const double w = std::exp(s[k] - m);
          sum += w;
          for (std::size_t d = 0; d < d_dim; ++d) {
            o[d] += w * f.cache.real(true, pages[static_cast<std::size_t>(kept[k] / 16)], static_cast<int>(kept[k] % 16), 0, static_cast<int>(d));
          }
        }
        for (std::size_t d = 0; d < d_dim; ++d) {
          const double want = kept.empty() ? 0.0 : o[d] / sum;
          bad += !(std::fabs(out.o[row * d_dim + d] - want) <= tolerance(f, want, f.v_max[b]));
        }
      }
    }
  }
  CHECK(bad == 0);
}
}  // namespace

TEST_CASE("paged attention: page ids outside the cache are left out", "[attention][paged]") {
  check_bad_page_ids(64, {5, 1}, false);
}

TEST_CASE("paged attention: preflight rejects bad input before launching", "[attention][paged]") {
  PagedAttentionProblem p;
  p.batch_size = 2;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 128;
  p.page_size = 16;
  p.kv_dtype = KvDtype::fp8_e4m3;
  const std::vector<std::int32_t> qo{0, 3, 5}, kv_indptr{0, 1, 3}, last{10, 4};
  PagedAttentionPlanArguments args{p, qo, kv_indptr, last};
  args.num_sms = 132;
  REQUIRE(make_paged_attention_plan(args).ok());

  auto expect = [](const auto& result, StatusCode code, const char* fragment) {
    REQUIRE_FALSE(result.ok());
    CHECK(result.status().code() == code);
    INFO(result.status().to_string());
    CHECK(result.status().to_string().find(fragment) != std::string::npos);
  };
  {
    auto a = args;
    a.problem.head_dim = 80;
    expect(make_paged_attention_plan(a), StatusCode::unsupported, "head_dim 80");
  }
  {
    const std::vector<std::int32_t> bad_qo{0, 4, 3};
    auto a = args;
    a.qo_indptr_host = bad_qo;
    expect(make_paged_attention_plan(a), StatusCode::invalid_argument, "qo_indptr decreases");
  }
  {
    const std::vector<std::int32_t> long_qo{0, 11, 13};  // request 0 has 10 tokens
    auto a = args;
    a.qo_indptr_host = long_qo;
    expect(make_paged_attention_plan(a), StatusCode::invalid_argument, "only 10 tokens");
  }
  {
    auto a = args;
    a.problem.kv_dtype = KvDtype::bf16;
    a.problem.q_dtype = ActivationDtype::fp16;
    expect(make_paged_attention_plan(a), StatusCode::unsupported, "queries must be bf16");
  }
  // Run-time preflight: a short workspace, a negative window, a bad soft-cap.
  auto plan = make_paged_attention_plan(args);
  REQUIRE(plan.ok());
  std::vector<unsigned char> cache_bytes(4 * 16 * 2 * 128 + 64);
  float scales[2] = {0.5f, 0.5f};
  PagedAttentionArguments run_args;
  run_args.cache.k_pages = run_args.cache.v_pages = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(cache_bytes.data()) + 15) / 16 * 16);
  run_args.cache.k_scale = &scales[0];
  run_args.cache.v_scale = &scales[1];
  run_args.cache.num_pages = 4;
  run_args.cache.page_size = 16;
  run_args.cache.num_kv_heads = 2;
  run_args.cache.head_dim = 128;
  run_args.cache.dtype = KvDtype::fp8_e4m3;
  run_args.cache.scale_mode = KvScaleMode::per_tensor;
  std::int32_t ints[8] = {};
  run_args.table = kv::PageTableView{ints, ints, ints, nullptr, 2, 16};
  run_args.qo_indptr = ints;
  alignas(16) std::uint16_t q[16] = {};
  run_args.q = q;
  run_args.o = q;
  alignas(16) unsigned char ws[64];
  {
    const Status s = run_paged_attention(run_args, *plan, ws, 16, nullptr);
    CHECK(s.code() == StatusCode::resource_exhausted);
  }
  std::vector<unsigned char> big(plan->layout.total_bytes + 16);
  void* big_aligned = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(big.data()) + 15) / 16 * 16);
  {
    auto a = run_args;
    a.window_left = -5;
    const Status s = run_paged_attention(a, *plan, big_aligned, plan->layout.total_bytes, nullptr);
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.to_string().find("window_left") != std::string::npos);
  }
  {
    auto a = run_args;
    a.logit_soft_cap = -1.0f;
    CHECK(run_paged_attention(a, *plan, big_aligned, plan->layout.total_bytes, nullptr).code() ==
          StatusCode::invalid_argument);
  }
  {
    auto a = run_args;
    a.sm_scale = 0.0f;
    CHECK(run_paged_attention(a, *plan, big_aligned, plan->layout.total_bytes, nullptr).code() ==
          StatusCode::invalid_argument);
  }
}

TEST_CASE("paged attention: plan shapes, kernel choice and the workspace bound", "[attention][paged]") {
  PagedAttentionProblem p;
  p.batch_size = 3;
  p.num_qo_heads = 32;
  p.num_kv_heads = 8;
  p.head_dim = 128;
  p.page_size = 16;
  p.kv_dtype = KvDtype::fp8_e4m3;
  const std::vector<std::int32_t> decode_qo{0, 1, 2, 3}, kv_indptr{0, 10, 30, 400}, last{16, 3, 8};
  PagedAttentionPlanArguments args{p, decode_qo, kv_indptr, last};
  args.num_sms = 132;
  auto decode = make_paged_attention_plan(args);
  REQUIRE(decode.ok());
  CHECK(decode->warps_m == 1);  // 4 rows: one m16 tile, 4 warps split the KV
  CHECK(decode->choice.kernel == AttentionKernel::tensor_core);
  CHECK_FALSE(decode->choice.reason.empty());
  const std::vector<std::int32_t> prefill_qo{0, 100, 101, 400};
  args.qo_indptr_host = prefill_qo;
  auto prefill = make_paged_attention_plan(args);
  REQUIRE(prefill.ok());
  CHECK(prefill->warps_m == 4);
  // The bound covers every plan up to its sizes.
  PagedAttentionWorkspaceBound bound{p, 400, 400 * 16, 132, 2};
  auto limit = paged_attention_workspace_bound(bound);
  REQUIRE(limit.ok());
  for (auto* qo : {&decode_qo, &prefill_qo}) {
    args.qo_indptr_host = *qo;
    for (std::int32_t sms : {1, 8, 132}) {
      args.num_sms = sms;
      args.ctas_per_sm = 2;
      if (sms > 132) continue;
      auto size = paged_attention_workspace_size(args);
      REQUIRE(size.ok());
      if (sms == 132) CHECK(*size <= *limit);
    }
  }
  // GQA 2 decode on a 16-bit cache: the CUDA-core kernel is the static model's choice.
  p.num_qo_heads = 16;
  p.kv_dtype = KvDtype::bf16;
  CHECK(choose_attention_kernel(p, 1).kernel == AttentionKernel::cuda_core);
  CHECK(choose_attention_kernel(p, 64).kernel == AttentionKernel::tensor_core);
}

// ---- engine-shaped inputs: block table, one K/V allocation, strided pages ---------------------

namespace {

/// Bitwise equality of two runs' outputs and LSEs (NaN rows compare by their bits).
void check_bit_identical(const Output& a, const Output& b) {
  REQUIRE(a.o_bits.size() == b.o_bits.size());
  REQUIRE(a.lse.size() == b.lse.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.o_bits.size(); ++i) differ += a.o_bits[i] != b.o_bits[i];
  for (std::size_t i = 0; i < a.lse.size(); ++i) {
    differ += std::memcmp(&a.lse[i], &b.lse[i], sizeof(float)) != 0;
  }
  CHECK(differ == 0);
}

}  // namespace

TEST_CASE("paged attention: block table and CSR forms give bit-identical outputs", "[attention][paged][inputs]") {
  auto rng = slimserve_test::make_rng(1101);
  using enum KvDtype;
  const auto tensor = KvScaleMode::per_tensor;
  const auto token = KvScaleMode::per_token;
  for (const PagedCase& c : std::vector<PagedCase>{
           // decode, ragged lengths 1, page-1, page, page+1, long; GQA 8 and 16
           {fp8_e4m3, KvLayout::hnd, tensor, 128, 2, 8, 16, bf, {1, 15, 16, 17, 300}, {1, 1, 1, 1, 1}},
           {fp8_e5m2, KvLayout::nhd, token, 64, 1, 16, 32, fp, {1, 31, 32, 33, 260}, {1, 1, 1, 1, 1}},
           // prefill chunks over prefixes; GQA 1 and 4
           {bf16, KvLayout::nhd, KvScaleMode::none, 64, 2, 1, 16, bf, {1, 15 + 4, 16 + 16, 17 + 2, 170}, {1, 15, 16, 17, 40}},
           {fp8_e4m3, KvLayout::nhd, token, 64, 1, 4, 16, fp, {9, 16 + 15, 150}, {9, 15, 30}},
           {fp8_e5m2, KvLayout::hnd, tensor, 64, 1, 4, 16, bf, {40, 17 + 100}, {40, 17}},
           // MQA: 64 query heads on one FP16 KV head
           {fp16, KvLayout::hnd, tensor, 64, 1, 64, 16, fp, {20, 150}, {1, 1}},
       }) {
    INFO("dtype " << to_string(c.dtype) << " scales " << to_string(c.scale_mode) << " D " << c.head_dim
                  << " group " << c.group);
    Fixture f(c, rng);
    const Reference ref = reference(f, {});
    for (bool split : {false, true}) {
      RunConfig csr{split, split ? 4096 : 132};
      RunConfig block = csr;
      block.block_table = true;
      block.seed = rng();
      const Output a = run(f, {}, csr);
      const Output b = run(f, {}, block);
      check(f, b, ref);
      check_bit_identical(a, b);
    }
  }
}

TEST_CASE("paged attention: K and V in one allocation or with strided pages give the same bits", "[attention][paged][inputs]") {
  auto rng = slimserve_test::make_rng(1102);
  using enum KvDtype;
  for (const PagedCase& c : std::vector<PagedCase>{
           {fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, 64, 2, 4, 16, bf, {1, 17, 140}, {1, 17, 30}},
           {bf16, KvLayout::hnd, KvScaleMode::none, 128, 1, 8, 32, bf, {31, 33, 200}, {1, 1, 1}},
           {fp8_e5m2, KvLayout::hnd, KvScaleMode::per_tensor, 64, 1, 2, 16, fp, {16, 50}, {16, 3}},
       }) {
    INFO("dtype " << to_string(c.dtype) << " D " << c.head_dim);
    Fixture f(c, rng);
    const Reference ref = reference(f, {});
    const Output separate = run(f, {});
    check(f, separate, ref);
    RunConfig combined;
    combined.combined_kv = true;  // [pages, 2, page, H, D]
    check_bit_identical(separate, run(f, {}, combined));
    RunConfig padded;
    padded.page_padding = 64;  // separate K and V, pages 64 poisoned elements apart
    check_bit_identical(separate, run(f, {}, padded));
    RunConfig everything = combined;  // one allocation, padded, block table, split
    everything.page_padding = 32;
    everything.block_table = true;
    everything.allow_split = true;
    everything.num_sms = 4096;
    everything.seed = rng();
    check(f, run(f, {}, everything), ref);
  }
}

TEST_CASE("paged attention: block-table requests that are aborted or too long read nothing", "[attention][paged][inputs]") {
  auto rng = slimserve_test::make_rng(1103);
  Fixture f({KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, 64, 1, 4, 16, bf, {20, 300, 33, 50}, {3, 1, 33, 10}}, rng);
  std::vector<kv::RequestStatus> status(4, kv::RequestStatus{kv::RequestState::ok, -1});
  status[1] = {kv::RequestState::stale_tag, 3};
  status[3] = {kv::RequestState::page_out_of_range, 0};
  std::set<int> live;
  for (std::size_t b : {std::size_t{0}, std::size_t{2}}) {
    for (int page : f.table.pages_of(b)) live.insert(page);
  }
  HostCache poisoned = f.cache;
  for (std::size_t b : {std::size_t{1}, std::size_t{3}}) {
    for (int page : f.table.pages_of(b)) {
      if (live.count(page) != 0) continue;
      for (int slot = 0; slot < f.c.page_size; ++slot) {
        poisoned.k_token_scale[poisoned.scale_offset(page, slot, 0)] = NAN;
        poisoned.v_token_scale[poisoned.scale_offset(page, slot, 0)] = NAN;
        for (int d = 0; d < f.c.head_dim; ++d) {
          poisoned.set_bits(poisoned.k, poisoned.offset(page, slot, 0, d), 0x7F);
          poisoned.set_bits(poisoned.v, poisoned.offset(page, slot, 0, d), 0x7F);
        }
      }
    }
  }
  const Reference ref = reference(f, {});
  for (bool split : {false, true}) {
    RunConfig rc{split, 4096, &status, &poisoned};
    rc.block_table = true;
    rc.seed = rng();
    const std::vector<bool> aborted{false, true, false, true};
    check(f, run(f, {}, rc), ref, &aborted);
    // A device seq_len beyond its row (a table that skipped the host checks): that request
    // is aborted on the device, the others are unaffected.
    RunConfig too_long = rc;
    too_long.status = nullptr;
    too_long.cache_override = nullptr;
    too_long.device_seq_len_bump = 16 * 64;
    const std::vector<bool> only_first{true, false, false, false};
    check(f, run(f, {}, too_long), ref, &only_first);
  }
}

TEST_CASE("paged attention: bad block tables and page strides are refused before launch", "[attention][paged][inputs]") {
  PagedAttentionProblem p;
  p.batch_size = 2;
  p.num_qo_heads = 8;
  p.num_kv_heads = 2;
  p.head_dim = 128;
  p.page_size = 16;
  p.kv_dtype = KvDtype::fp8_e4m3;
  const std::vector<std::int32_t> qo{0, 3, 5}, seq_lens{10, 40}, kv_indptr{0, 1, 4}, last{10, 8};
  PagedAttentionPlanArguments args{p, qo, {}, {}, seq_lens};
  args.num_sms = 132;
  auto plan = make_paged_attention_plan(args);
  REQUIRE(plan.ok());
  CHECK(plan->max_kv_tokens == 40);

  auto expect = [](const Status& s, StatusCode code, const char* fragment) {
    INFO(s.to_string());
    CHECK(s.code() == code);
    CHECK(s.to_string().find(fragment) != std::string::npos);
  };
  {
    auto a = args;  // both forms
    a.kv_indptr_host = kv_indptr;
    a.last_page_len_host = last;
    expect(make_paged_attention_plan(a).status(), StatusCode::invalid_argument, "exactly one form");
  }
  {
    const std::vector<std::int32_t> negative{10, -1};
    auto a = args;
    a.seq_lens_host = negative;
    expect(make_paged_attention_plan(a).status(), StatusCode::invalid_argument, "seq_lens[1] = -1");
  }
  {
    const std::vector<std::int32_t> short_lens{2, 40};  // request 0 has 3 query tokens
    auto a = args;
    a.seq_lens_host = short_lens;
    expect(make_paged_attention_plan(a).status(), StatusCode::invalid_argument, "only 2 tokens");
  }
  {
    auto a = args;
    a.problem.head_dim = 96 + 1;
    expect(make_paged_attention_plan(a).status(), StatusCode::unsupported, "head_dim 97");
  }

  // Run-time preflight (nothing is launched: every call fails before).
  std::vector<unsigned char> cache_bytes(4 * 16 * 2 * 128 + 64);
  float scales[2] = {0.5f, 0.5f};
  PagedAttentionArguments run_args;
  run_args.cache.k_pages = run_args.cache.v_pages =
      reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(cache_bytes.data()) + 15) / 16 * 16);
  run_args.cache.k_scale = &scales[0];
  run_args.cache.v_scale = &scales[1];
  run_args.cache.num_pages = 4;
  run_args.cache.page_size = 16;
  run_args.cache.num_kv_heads = 2;
  run_args.cache.head_dim = 128;
  run_args.cache.dtype = KvDtype::fp8_e4m3;
  run_args.cache.scale_mode = KvScaleMode::per_tensor;
  std::int32_t ints[8] = {};
  run_args.block_table = kv::BlockTableView{ints, nullptr, ints, 2, 3, 16};  // 3 pages: 48 tokens
  run_args.qo_indptr = ints;
  alignas(16) std::uint16_t q[16] = {};
  run_args.q = q;
  run_args.o = q;
  std::vector<unsigned char> ws(plan->layout.total_bytes + 16);
  void* ws_aligned = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(ws.data()) + 15) / 16 * 16);
  auto run_status = [&](const PagedAttentionArguments& a) {
    return run_paged_attention(a, *plan, ws_aligned, plan->layout.total_bytes, nullptr);
  };
  {
    auto a = run_args;  // rows of 2 pages hold 32 tokens; the plan has a request of 40
    a.block_table.max_pages_per_request = 2;
    expect(run_status(a), StatusCode::invalid_argument, "holds 32");
  }
  {
    auto a = run_args;  // both forms
    a.table = kv::PageTableView{ints, ints, ints, nullptr, 2, 16};
    expect(run_status(a), StatusCode::invalid_argument, "exactly one");
  }
  {
    auto a = run_args;  // neither
    a.block_table = {};
    expect(run_status(a), StatusCode::invalid_argument, "exactly one");
  }
  {
    auto a = run_args;
    a.block_table.batch_size = 3;
    expect(run_status(a), StatusCode::invalid_argument, "block table has batch_size 3");
  }
  {
    auto a = run_args;  // a page stride shorter than a page
    a.cache.page_stride = 16 * 2 * 128 - 16;
    expect(run_status(a), StatusCode::invalid_argument, "page_stride");
  }
  {
    auto a = run_args;  // not a multiple of 16 bytes
    a.cache.page_stride = 2 * 16 * 2 * 128 + 8;
    expect(run_status(a), StatusCode::invalid_argument, "page_stride");
  }
  // Kernels that address packed pages refuse a strided view instead of writing elsewhere.
  {
    PagedKVCacheView strided = run_args.cache;
    strided.page_stride = 2 * 16 * 2 * 128;
    REQUIRE(validate_cache_view(strided).ok());
    expect(require_packed_pages(strided, "append_kv"), StatusCode::unsupported, "append_kv takes packed pages");
    strided.page_stride = 16 * 2 * 128;  // the packed stride, spelled out
    CHECK(require_packed_pages(strided, "append_kv").ok());
  }
  // The host check of a block table (kv::validate_block_table, which upload_block_table runs)
  // refuses entries outside the cache and lengths beyond the row, naming the request.
  {
    const std::vector<kv::PageId> ids{1, 2, 3, 9, 0, 0};
    const std::vector<kv::PageTag> tags{1, 1, 1, 1, 1, 1};
    const std::vector<std::int32_t> lens{40, 17};
    kv::BlockTableView host{ids.data(), tags.data(), lens.data(), 2, 3, 16};
    const Status s = kv::validate_block_table(host, 4);
    CHECK(s.code() == StatusCode::out_of_range);
    INFO(s.to_string());
    const std::vector<std::int32_t> too_long{49, 17};
    host.seq_lens = too_long.data();
    expect(kv::validate_block_table(host, 4), StatusCode::invalid_argument, "seq_len 49");
  }
}

TEST_CASE("paged attention: head_dim 96 and 192 over every cache type", "[attention][paged][head_dim]") {
  auto rng = slimserve_test::make_rng(1104);
  using enum KvDtype;
  const auto tensor = KvScaleMode::per_tensor;
  const auto token = KvScaleMode::per_token;
  for (int d : {96, 192}) {
    for (const PagedCase& c : std::vector<PagedCase>{
             {bf16, KvLayout::nhd, KvScaleMode::none, d, 2, 4, 16, bf, {1, 17 + 15, 150}, {1, 15, 40}},
             {fp16, KvLayout::hnd, tensor, d, 1, 8, 32, fp, {33, 140}, {1, 1}},
             {fp8_e4m3, KvLayout::hnd, tensor, d, 2, 2, 16, bf, {16, 17 + 50, 140}, {16, 17, 1}},
             {fp8_e4m3, KvLayout::nhd, token, d, 1, 4, 16, fp, {15, 150}, {15, 1}},
             {fp8_e5m2, KvLayout::nhd, token, d, 1, 1, 16, bf, {20, 129}, {20, 9}},
             {fp8_e5m2, KvLayout::hnd, tensor, d, 1, 16, 16, fp, {1, 200}, {1, 1}},
         }) {
      INFO("dtype " << to_string(c.dtype) << " scales " << to_string(c.scale_mode) << " D " << c.head_dim);
      Fixture f(c, rng);
      check_split_and_unsplit(f);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The sm_90a warpgroup-MMA (wgmma) prefill kernel (PagedAttentionPlanArguments::warpgroup_mma):
// the same reference and tolerances as the mma.sync kernel, and the fallbacks the plan and the
// run take where it does not apply.

namespace {

/// Unsplit and split runs asked for the wgmma kernel; `expect_wgmma`: it was launched (false:
/// the mma.sync kernel ran instead, and is still right).
/// Both wgmma kernels (ping-pong and one warpgroup), and the automatic choice unsplit (it must
/// resolve to ping-pong for every KV type).
void check_wgmma(const Fixture& f, const Options& opt = {}, bool expect_wgmma = true, RunConfig base = {}) {
  const Reference ref = reference(f, opt);
  for (PrefillWgmmaKernel asked : {PrefillWgmmaKernel::automatic, PrefillWgmmaKernel::ping_pong,
                                   PrefillWgmmaKernel::one_warpgroup}) {
    const PrefillWgmmaKernel kernel = asked != PrefillWgmmaKernel::automatic ? asked : PrefillWgmmaKernel::ping_pong;
    for (bool split : {false, true}) {
      if (asked == PrefillWgmmaKernel::automatic && split) continue;
      RunConfig rc = base;
      rc.allow_split = split;
      rc.num_sms = split ? 4096 : 132;  // a wide device: chunks of 128
      rc.warpgroup_mma = true;
      rc.wgmma_kernel = asked;
      const Output out = run(f, opt, rc);
      INFO(out.plan.choice.reason);
      CHECK(out.ran_wgmma == expect_wgmma);
      CHECK(out.plan.warpgroup_mma == (expect_wgmma || (out.plan.cta_rows == 64 && PagedWgmmaHeadDims::contains(f.c.head_dim))));
      if (out.plan.warpgroup_mma) CHECK(out.plan.wgmma_kernel == kernel);
      check(f, out, ref);
      std::printf("  wgmma %d (%s) %s %s D%d G%d split %d: max |err| / v_max %.2e\n", out.ran_wgmma ? 1 : 0,
                  kernel == PrefillWgmmaKernel::ping_pong ? "ping-pong" : "one warpgroup",
                  std::string(to_string(f.c.dtype)).c_str(), std::string(to_string(f.c.scale_mode)).c_str(),
                  f.c.head_dim, f.c.group, out.plan.split_kv ? 1 : 0, max_relative_error(f, out, ref));
    }
  }
}

}  // namespace

TEST_CASE("paged attention (wgmma): ragged prefill chunks over cached prefixes, BF16 and FP8", "[attention][paged][wgmma]") {
  auto rng = slimserve_test::make_rng(1101);
  using enum KvDtype;
  for (const PagedCase& c : std::vector<PagedCase>{
           // chunks of 1, page-1, page, page+1 and long, on prefixes that end mid-page; shuffled
           // pages with holes (more than two requests)
           {bf16, KvLayout::nhd, KvScaleMode::none, 128, 2, 4, 16, bf, {1, 15 + 5, 16 + 16, 17 + 3, 150}, {1, 15, 16, 17, 70}},
           {bf16, KvLayout::hnd, KvScaleMode::none, 128, 1, 8, 32, bf, {9, 33 + 31, 200}, {9, 33, 40}},
           {fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 128, 2, 4, 16, bf, {3, 16 + 7, 17 + 64, 140}, {3, 16, 17, 60}},
           {fp8_e4m3, KvLayout::hnd, KvScaleMode::per_tensor, 128, 1, 4, 16, fp, {15 + 2, 130}, {15, 50}},
           {fp8_e5m2, KvLayout::nhd, KvScaleMode::per_tensor, 128, 1, 4, 16, bf, {17, 100}, {17, 40}},
           {fp16, KvLayout::nhd, KvScaleMode::none, 128, 1, 4, 16, fp, {16 + 9, 90}, {16, 45}},
           // long: more tiles than the ping-pong kernel's ring has slots (6 for 16-bit caches,
           // 4 for FP8), so every slot is refilled; one consumer gets a tile more than the other
           {bf16, KvLayout::nhd, KvScaleMode::none, 128, 1, 4, 16, bf, {64 * 9 + 5}, {40}},
           {fp8_e4m3, KvLayout::hnd, KvScaleMode::per_tensor, 128, 1, 4, 16, bf, {64 * 7 + 33}, {20}},
       }) {
    INFO("dtype " << to_string(c.dtype) << " D " << c.head_dim << " group " << c.group);
    Fixture f(c, rng);
    check_wgmma(f);
  }
}

TEST_CASE("paged attention: a NaN key in a live token, or a NaN query element, makes exactly its readers' rows NaN, on every kernel",
          "[attention][paged][wgmma]") {
  // FP8 keeps a NaN input a NaN (0x7F). Position 0 of a request is seen by all its query rows
  // (and a shared prefix's other requests): their rows in that KV head's query group must be
  // NaN in every element with lse NaN unsplit and -inf split (the merge marks a NaN partial),
  // never an empty row (0, lse -inf) nor, split, a NaN row with a finite lse. Every other row
  // is unchanged, bit for bit. mma.sync, and both wgmma prefill kernels. Request 3 is a fresh
  // 130-token prefill: its row 0 sees only the NaN key (every score NaN, so the running max
  // stays -inf), and split, its first chunk's partial for that row holds nothing else. One
  // more row has a NaN query element (BF16 queries into the FP8 cache's fp16 MMA: the
  // saturating conversion must keep it NaN, not turn it into -65504): that row alone is NaN.
  auto rng = slimserve_test::make_rng(1104);
  const Fixture f({KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 128, 2, 4, 16, bf, {40, 17 + 3, 150, 130},
                   {8, 17, 70, 130}},
                  rng);
  HostCache poisoned = f.cache;
  const std::size_t heads = static_cast<std::size_t>(f.num_qo_heads()), d = static_cast<std::size_t>(f.c.head_dim);
  std::vector<bool> nan_row(static_cast<std::size_t>(f.qo_indptr.back()) * heads, false);
  struct Poison { std::size_t request; int kv_head; };
  for (const Poison x : {Poison{1, 1}, Poison{3, 0}}) {
    const int page = f.table.pages_of(x.request)[0];
    poisoned.set_bits(poisoned.k, poisoned.offset(page, 0, x.kv_head, 37), 0x7F);
    for (std::size_t b = 0; b < f.c.kv_lengths.size(); ++b) {
      const auto pages = f.table.pages_of(b);
      if (std::find(pages.begin(), pages.end(), page) == pages.end()) continue;  // slot 0 of a listed page is live
      for (auto t = static_cast<std::size_t>(f.qo_indptr[b]); t < static_cast<std::size_t>(f.qo_indptr[b + 1]); ++t) {
        for (int g = 0; g < f.c.group; ++g) nan_row[t * heads + static_cast<std::size_t>(x.kv_head * f.c.group + g)] = true;
      }
    }
  }
  Fixture nan_query = f;
  std::size_t query_row = nan_row.size();
  for (auto row = static_cast<std::size_t>(f.qo_indptr[2]) * heads + 5; row < nan_row.size(); ++row) {
    if (!nan_row[row]) {
      query_row = row;
      break;
    }
  }
  REQUIRE(query_row < nan_row.size());
  nan_query.q_bits[query_row * d + 77] = 0x7FC0;  // BF16 quiet NaN
  nan_row[query_row] = true;
  for (const int kernel : {0, 1, 2}) {  // mma.sync, ping-pong, one warpgroup
    for (const bool split : {false, true}) {
      INFO("kernel " << kernel << (split ? " split" : " unsplit"));
      RunConfig rc;
      rc.allow_split = split;
      rc.num_sms = split ? 4096 : 132;  // a wide device: chunks of 128
      rc.warpgroup_mma = kernel != 0;
      rc.wgmma_kernel = kernel == 2 ? PrefillWgmmaKernel::one_warpgroup : PrefillWgmmaKernel::ping_pong;
      const Output base = run(f, {}, rc);
      rc.cache_override = &poisoned;
      const Output out = run(nan_query, {}, rc);
      CHECK(out.ran_wgmma == (kernel != 0));
      CHECK(out.plan.split_kv == split);
      const auto [wrong_nan, wrong_lse, wrong_other, nan_rows] =
          tally_nan_rows(nan_row, d, split, out.o, out.lse, base.o, base.lse);
      CHECK(nan_rows >= (17 + 130) * static_cast<std::size_t>(f.c.group));
      CHECK(nan_rows < nan_row.size());
      CHECK(wrong_nan == 0);
      CHECK(wrong_lse == 0);
      CHECK(wrong_other == 0);
    }
  }
}

TEST_CASE("paged attention: BF16 query elements beyond fp16's range saturate to +-65504 in the FP8 cache's fp16 operands, on every kernel",
          "[attention][paged][wgmma]") {
  // The conversion into the fp16 MMA operand (cvt.rn.satfinite) turns +1e6, +65536 and -inf
  // into +65504, +65504 and -65504 (a plain round-to-nearest would make them infinite and the
  // rows NaN). The reference reads exactly those saturated values, so each row with them must
  // match it as every other row does. Such a query dominates its scores: its rows attend to
  // nearly one key each.
  auto rng = slimserve_test::make_rng(1106);
  Fixture f({KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 128, 2, 4, 16, bf, {40, 17 + 3, 150}, {8, 17, 70}},
            rng);
  const std::size_t heads = static_cast<std::size_t>(f.num_qo_heads()), d = static_cast<std::size_t>(f.c.head_dim);
  struct Big { std::size_t column; std::uint16_t bits; float saturated; };
  const Big big[] = {{5, 0x4974, 65504.0f}, {77, 0xFF80, -65504.0f}, {100, 0x4780, 65504.0f}};  // 999424, -inf, 65536
  for (const std::size_t row : {static_cast<std::size_t>(f.qo_indptr[1]) * heads + 3,
                                static_cast<std::size_t>(f.qo_indptr[2] + 69) * heads + 6}) {
    for (const Big& x : big) {
      f.q_bits[row * d + x.column] = x.bits;
      f.q_values[row * d + x.column] = x.saturated;
    }
  }
  const Reference ref = reference(f, {});
  for (const int kernel : {0, 1, 2}) {  // mma.sync, ping-pong, one warpgroup
    for (const bool split : {false, true}) {
      INFO("kernel " << kernel << (split ? " split" : " unsplit"));
      RunConfig rc;
      rc.allow_split = split;
      rc.num_sms = split ? 4096 : 132;
      rc.warpgroup_mma = kernel != 0;
      rc.wgmma_kernel = kernel == 2 ? PrefillWgmmaKernel::one_warpgroup : PrefillWgmmaKernel::ping_pong;
      const Output out = run(f, {}, rc);
      CHECK(out.ran_wgmma == (kernel != 0));
      CHECK(out.plan.split_kv == split);
      check(f, out, ref);
    }
  }
}

TEST_CASE("paged attention (wgmma): window, soft-cap, sinks, sm_scale, non-causal", "[attention][paged][wgmma]") {
  auto rng = slimserve_test::make_rng(1102);
  Fixture f({KvDtype::bf16, KvLayout::nhd, KvScaleMode::none, 128, 2, 2, 16, bf, {40, 1, 17 + 60, 200}, {20, 1, 17, 30}}, rng);
  check_each_option(f, 0.05f, [](const Fixture& fx, const Options& opt) { check_wgmma(fx, opt); });
}

TEST_CASE("paged attention (wgmma): block table, strided queries, aborted requests, bad page ids", "[attention][paged][wgmma]") {
  auto rng = slimserve_test::make_rng(1103);
  Fixture f({KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 128, 1, 4, 16, bf, {20, 100, 33, 50}, {20, 1, 33, 10}}, rng);
  const Reference ref = reference(f, {});
  {
    RunConfig csr;
    csr.warpgroup_mma = true;
    RunConfig block = csr;
    block.block_table = true;
    block.seed = 77;
    const Output a = run(f, {}, csr);
    const Output b = run(f, {}, block);
    CHECK(a.ran_wgmma);
    CHECK(b.ran_wgmma);
    check(f, a, ref);
    check_bit_identical(a, b);
    RunConfig strided = csr;
    strided.q_head_stride = 128 + 16;
    strided.q_token_stride = 3 * 4 * (128 + 16);
    const Output c = run(f, {}, strided);
    CHECK(c.ran_wgmma);
    check_bit_identical(a, c);
  }
  {
    std::vector<kv::RequestStatus> status(4, kv::RequestStatus{kv::RequestState::ok, -1});
    status[1] = {kv::RequestState::stale_tag, 3};
    status[3] = {kv::RequestState::page_out_of_range, 0};
    const std::vector<bool> aborted{false, true, false, true};
    const HostCache poisoned = poison_pages_only_aborted_read(f, aborted);
    for (bool split : {false, true}) {
      RunConfig rc{split, 4096, &status, &poisoned};
      rc.warpgroup_mma = true;
      const Output out = run(f, {}, rc);
      CHECK(out.ran_wgmma);
      check(f, out, ref, &aborted);
    }
  }
  check_bad_page_ids(128, {20, 1}, true);
}

TEST_CASE("paged attention (wgmma): the plan and the run fall back where it does not apply", "[attention][paged][wgmma]") {
  auto rng = slimserve_test::make_rng(1104);
  using enum KvDtype;
  // Per-token scales: planned for, but the run keeps the mma.sync kernel.
  check_wgmma(Fixture({fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, 128, 1, 4, 16, bf, {17, 80}, {17, 40}}, rng), {}, false);
  // 32 rows or fewer (decode, verify): the 64-row M would be mostly padding.
  check_wgmma(Fixture({bf16, KvLayout::nhd, KvScaleMode::none, 128, 2, 4, 16, bf, {5, 70}, {1, 8}}, rng), {}, false);
  // A head_dim the wgmma kernel is not instantiated for.
  check_wgmma(Fixture({bf16, KvLayout::nhd, KvScaleMode::none, 64, 1, 4, 16, bf, {30, 70}, {30, 20}}, rng), {}, false);
}
