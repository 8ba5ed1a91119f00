// Tensor-core paged attention over NVFP4 pages against an FP64 reference decoded on the host
// from the stored codes and block scales (formats/nvfp4.hpp's codec; e2m1 * e4m3 * tensor
// scale in FP64): decode (GQA 8, GQA 4) and causal prefill chunks over cached prefixes,
// ragged lengths (1, page-1, page, page+1, long), NHD and HND, head_dim 64/128/192/256,
// shuffled pages with holes (poisoned: NaN scales) and a shared prefix, split and unsplit
// plans, poisoned outputs; an invalid device-held tensor scale gives NaN (as the append
// does); the wgmma kernels and head_dim 96 are refused or fall back (the fused prefill over
// NVFP4 pages: fused_prefill_nvfp4_test.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_test_support.hpp"
#include "nvfp4_test_cache.hpp"
#include "slimserve/attention/paged_attention.hpp"
#include "slimserve/formats/nvfp4.hpp"

using namespace attn_test;

namespace {

struct Case {
  KvLayout layout;
  int head_dim, num_kv_heads, group, page_size;
  ActivationDtype q_dtype;
  std::vector<std::int64_t> kv_lengths;
  std::vector<std::int32_t> qo_lengths;
};

struct Fixture {
  Case c;
  HostPageTable table;
  Nvfp4HostCache cache;
  std::vector<std::int32_t> qo_indptr{0};
  std::vector<float> q_values;
  std::vector<std::uint16_t> q_bits;
  std::vector<double> v_max;  // per request and KV head

  /// The stored value of request b's position p (attend_row's key or value accessor).
  auto value(std::size_t b, int kv_head, bool is_v) const {
    return [this, pages = table.pages_of(b), kv_head, is_v](std::int64_t p, int d) {
      return cache.real(is_v, pages[static_cast<std::size_t>(p / c.page_size)], static_cast<int>(p % c.page_size),
                        kv_head, d);
    };
  }

  Fixture(const Case& cc, std::mt19937_64& rng)
      : c(cc), table(make_page_table(cc.kv_lengths, cc.page_size, rng, cc.kv_lengths.size() > 2)),
        cache(cc.layout, table.num_pages, cc.page_size, cc.num_kv_heads, cc.head_dim) {
    // Realistic rows (outlier channels), tensor scales from their amax: the largest block
    // scale lands near E4M3's 448; a page shared by two requests is written once.
    cache.fill(table, c.kv_lengths, rng);
    for (auto len : c.qo_lengths) qo_indptr.push_back(qo_indptr.back() + len);
    Activations q = random_activations(rng, c.q_dtype, tokens() * static_cast<std::size_t>(heads() * c.head_dim));
    q_bits = std::move(q.bits);
    q_values = std::move(q.values);
    for (std::size_t b = 0; b < c.kv_lengths.size(); ++b) {
      for (int h = 0; h < c.num_kv_heads; ++h) v_max.push_back(max_abs_value(c.kv_lengths[b], c.head_dim, value(b, h, true)));
    }
  }
  int heads() const { return c.num_kv_heads * c.group; }
  std::size_t tokens() const { return static_cast<std::size_t>(qo_indptr.back()); }
  PagedAttentionProblem problem() const {
    PagedAttentionProblem p;
    p.batch_size = static_cast<std::int32_t>(c.kv_lengths.size());
    p.num_qo_heads = heads();
    p.num_kv_heads = c.num_kv_heads;
    p.head_dim = c.head_dim;
    p.page_size = c.page_size;
    p.kv_dtype = KvDtype::nvfp4;
    p.q_dtype = c.q_dtype;
    p.causal = true;
    return p;
  }
  Reference reference() const {
    Reference ref;
    const auto d_size = static_cast<std::size_t>(c.head_dim);
    ref.o.assign(tokens() * static_cast<std::size_t>(heads()) * d_size, 0.0);
    ref.lse.assign(tokens() * static_cast<std::size_t>(heads()), -INFINITY);
    for (std::size_t b = 0; b < c.kv_lengths.size(); ++b) {
      for (std::int32_t i = 0; i < c.qo_lengths[b]; ++i) {
        const std::int64_t position = c.kv_lengths[b] - c.qo_lengths[b] + i;
        const auto token = static_cast<std::size_t>(qo_indptr[b] + i);
        for (int h = 0; h < heads(); ++h) {
          const std::size_t row = token * static_cast<std::size_t>(heads()) + static_cast<std::size_t>(h);
          RowOptions opt;
          opt.sm_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
          ref.lse[row] = attend_row(q_values.data() + row * d_size, c.head_dim, 0, position + 1, opt,
                                    value(b, h / c.group, false), value(b, h / c.group, true),
                                    ref.o.data() + row * d_size);
        }
      }
    }
    return ref;
  }
};

struct RunConfig {
  bool allow_split = false;
  std::int32_t num_sms = 132;
  bool warpgroup_mma = false;
  float k_scale_override = 0.0f;  // != 0: the device-held K tensor scale
  bool combined = false;          // one K/V allocation, page p's K then its V (vLLM's blocks)
};

struct Output {
  Status status;
  std::vector<float> o, lse;
  PagedAttentionPlan plan;
  bool ran_wgmma = false;
};

/// The combined image of a cache: page p's K page at 2 p pages, its V page one page later.
std::vector<unsigned char> interleave_pages(const Nvfp4HostCache& c) {
  const std::size_t page = c.k.size() / static_cast<std::size_t>(c.num_pages);
  std::vector<unsigned char> kv;
  for (std::size_t p = 0; p < static_cast<std::size_t>(c.num_pages); ++p) {
    kv.insert(kv.end(), c.k.begin() + static_cast<std::ptrdiff_t>(p * page), c.k.begin() + static_cast<std::ptrdiff_t>((p + 1) * page));
    kv.insert(kv.end(), c.v.begin() + static_cast<std::ptrdiff_t>(p * page), c.v.begin() + static_cast<std::ptrdiff_t>((p + 1) * page));
  }
  return kv;
}

Output run(const Fixture& f, const RunConfig& rc = {}) {
  const std::size_t page_bytes = f.cache.k.size() / static_cast<std::size_t>(f.cache.num_pages);
  auto k_pages = upload(rc.combined ? interleave_pages(f.cache) : f.cache.k);
  auto v_pages = upload(f.cache.v);
  auto scales = upload(std::vector<float>{rc.k_scale_override != 0.0f ? rc.k_scale_override : f.cache.k_scale,
                                          f.cache.v_scale});
  auto indptr = upload(f.table.indptr);
  auto indices = upload(f.table.indices);
  auto last = upload(f.table.last_page_len);
  auto qo_indptr = upload(f.qo_indptr);
  auto q = upload(f.q_bits);
  const std::size_t heads = static_cast<std::size_t>(f.heads());
  auto o = rt::DeviceBuffer<std::uint16_t>::create(std::max<std::size_t>(f.q_bits.size(), 1));
  auto lse = rt::DeviceBuffer<float>::create(std::max<std::size_t>(f.tokens() * heads, 1));
  REQUIRE(o.ok());
  REQUIRE(lse.ok());
  REQUIRE(o->fill_bytes(0xFF).ok());  // poison: every element must be written
  REQUIRE(lse->fill_bytes(0xFF).ok());

  PagedAttentionPlanArguments plan_args{f.problem(), f.qo_indptr, f.table.indptr, f.table.last_page_len};
  plan_args.allow_split = rc.allow_split;
  plan_args.num_sms = rc.num_sms;
  plan_args.ctas_per_sm = 1;
  plan_args.min_chunk_tokens = 128;
  plan_args.warpgroup_mma = rc.warpgroup_mma;
  auto bytes = paged_attention_workspace_size(plan_args);
  INFO((bytes.ok() ? std::string() : bytes.status().to_string()));
  REQUIRE(bytes.ok());
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*bytes);
  REQUIRE(workspace.ok());
  REQUIRE(workspace->fill_bytes(0xFF).ok());
  auto plan = plan_paged_attention(plan_args, workspace->data(), *bytes, nullptr);
  INFO((plan.ok() ? std::string() : plan.status().to_string()));
  REQUIRE(plan.ok());

  PagedAttentionArguments args;
  args.cache.k_pages = k_pages.data();
  args.cache.v_pages = rc.combined ? k_pages.data() + page_bytes : v_pages.data();
  if (rc.combined) args.cache.page_stride = static_cast<std::int64_t>(2 * page_bytes);  // bytes (NVFP4)
  args.cache.k_scale = scales.data();
  args.cache.v_scale = scales.data() + 1;
  args.cache.num_pages = f.cache.num_pages;
  args.cache.page_size = f.c.page_size;
  args.cache.num_kv_heads = f.c.num_kv_heads;
  args.cache.head_dim = f.c.head_dim;
  args.cache.dtype = KvDtype::nvfp4;
  args.cache.layout = f.c.layout;
  args.cache.scale_mode = KvScaleMode::per_tensor;
  const auto batch = static_cast<std::int32_t>(f.c.kv_lengths.size());
  args.table = kv::PageTableView{indptr.data(), indices.data(), last.data(), nullptr, batch, f.c.page_size};
  args.qo_indptr = qo_indptr.data();
  args.q = q.data();
  args.o = o->data();
  args.lse = lse->data();
  Output out;
  out.status = run_paged_attention(args, *plan, workspace->data(), *bytes, nullptr);
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  out.plan = *plan;
  out.ran_wgmma = runs_warpgroup_mma(args, *plan);
  for (auto bits : download(*o, f.q_bits.size())) out.o.push_back(from_activation(f.c.q_dtype, bits));
  out.lse = download(*lse, f.tokens() * heads);
  return out;
}

void check(const Fixture& f, const Output& out, const Reference& ref) {
  INFO(out.status.to_string());
  REQUIRE(out.status.ok());
  const std::size_t heads = static_cast<std::size_t>(f.heads());
  std::vector<std::size_t> request;
  for (std::size_t b = 0; b + 1 < f.qo_indptr.size(); ++b) {
    request.insert(request.end(), static_cast<std::size_t>(f.qo_indptr[b + 1] - f.qo_indptr[b]) * heads, b);
  }
  const RowComparison r = compare_rows(
      out.o, out.lse, ref, f.tokens() * heads, f.c.head_dim,
      [&](std::size_t row, double want) {
        const std::size_t kv_head = row % heads / static_cast<std::size_t>(f.c.group);
        return tensor_core_tolerance(f.c.q_dtype, KvDtype::nvfp4, want,
                                     f.v_max[request[row] * static_cast<std::size_t>(f.c.num_kv_heads) + kv_head]);
      },
      [](std::size_t) { return false; },
      [&](std::size_t row) {
        return "request " + std::to_string(request[row]) + " token " + std::to_string(row / heads) + " head " +
               std::to_string(row % heads) + " (split " + std::to_string(out.plan.split_kv) + " rows " +
               std::to_string(out.plan.cta_rows) + ")";
      });
  CHECK(r.checked > 0);
  CHECK(r.mismatches == 0);
}

void check_split_and_unsplit(const Fixture& f) {
  const Reference ref = f.reference();
  const Output unsplit = run(f);
  CHECK_FALSE(unsplit.plan.split_kv);
  check(f, unsplit, ref);
  const Output split = run(f, RunConfig{true, 4096});  // a wide device: chunks of 128
  std::int64_t longest = 0;
  for (auto len : f.c.kv_lengths) longest = std::max(longest, len);
  CHECK(split.plan.split_kv == (longest > 128));
  check(f, split, ref);
}

const auto bf = ActivationDtype::bf16;
const auto fp = ActivationDtype::fp16;

}  // namespace

TEST_CASE("paged attention over NVFP4 pages: decode, GQA 8 and 4, head_dim 64/128/256", "[attention][paged][nvfp4]") {
  auto rng = slimserve_test::make_rng(2531);
  for (const Case& c : std::vector<Case>{
           {KvLayout::nhd, 128, 2, 8, 16, bf, {1, 15, 16, 17, 300}, {1, 1, 1, 1, 1}},
           {KvLayout::hnd, 64, 2, 4, 32, fp, {1, 31, 32, 33, 200}, {1, 1, 1, 1, 1}},
           {KvLayout::nhd, 256, 1, 8, 16, fp, {1, 17, 150}, {1, 1, 1}},
       }) {
    INFO("D " << c.head_dim << " group " << c.group);
    Fixture f(c, rng);
    check_split_and_unsplit(f);
  }
}

TEST_CASE("paged attention over NVFP4 pages: causal prefill chunks over cached prefixes", "[attention][paged][nvfp4]") {
  auto rng = slimserve_test::make_rng(2532);
  for (const Case& c : std::vector<Case>{
           // chunks of 1, page-1, page, page+1 and long, on prefixes that end mid-page
           {KvLayout::nhd, 128, 2, 2, 16, bf, {9, 40, 16, 17, 260}, {1, 15, 16, 17, 70}},
           {KvLayout::hnd, 192, 1, 4, 32, fp, {33, 140}, {31, 40}},
       }) {
    INFO("D " << c.head_dim << " group " << c.group);
    Fixture f(c, rng);
    check_split_and_unsplit(f);
  }
}

TEST_CASE("paged attention over NVFP4 pages: a combined K/V allocation (page stride in bytes)", "[attention][paged][nvfp4]") {
  auto rng = slimserve_test::make_rng(2535);
  for (const Case& c : std::vector<Case>{
           {KvLayout::nhd, 64, 3, 3, 32, bf, {1, 31, 32, 33, 100}, {1, 1, 32, 1, 7}},  // the vLLM plugin's geometry
           {KvLayout::hnd, 128, 2, 4, 16, fp, {17, 40}, {1, 16}},
       }) {
    INFO("D " << c.head_dim << " group " << c.group);
    Fixture f(c, rng);
    const Reference ref = f.reference();
    const Output packed = run(f);
    RunConfig rc;
    rc.combined = true;
    const Output combined = run(f, rc);
    check(f, combined, ref);
    // The same bytes through another page stride: the same results, bit for bit.
    REQUIRE(combined.o.size() == packed.o.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < packed.o.size(); ++i) differ += std::memcmp(&packed.o[i], &combined.o[i], sizeof(float)) != 0;
    CHECK(differ == 0);
  }
}

TEST_CASE("paged attention over NVFP4 pages: an invalid device-held tensor scale gives NaN", "[attention][paged][nvfp4]") {
  // The host cannot read the scale; the append makes such a cache's blocks NaN, and attention
  // over a cache whose scale went bad afterwards makes every output NaN too.
  auto rng = slimserve_test::make_rng(2533);
  const Fixture f(Case{KvLayout::nhd, 128, 1, 8, 16, bf, {5, 40}, {1, 3}}, rng);
  for (const float bad : {-1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                          nvfp4_above_domain_scale}) {
    INFO("k_scale " << bad);
    RunConfig rc;
    rc.k_scale_override = bad;
    const Output out = run(f, rc);
    REQUIRE(out.status.ok());
    std::size_t not_nan = 0;  // NaN, not merely non-finite: the documented rule
    for (float x : out.o) not_nan += !std::isnan(x);
    CHECK(not_nan == 0);
  }
}

TEST_CASE("paged attention over NVFP4 pages: a NaN block scale in a live token is NaN exactly where it is read",
          "[attention][paged][nvfp4]") {
  // The append stores a NaN input as its block's E4M3 NaN scale (0x7F), as FP8 keeps a NaN a
  // NaN. Position 0 of a request is seen by every query row of the requests listing its page.
  // A NaN K block there makes those rows of that KV head's query group NaN, and their lse NaN
  // (unsplit) or -inf (split: the merge marks a NaN partial), never an empty row (0, -inf);
  // a NaN V block makes NaN only the 16 output elements of that block. Everything else is
  // unchanged, bit for bit (same plan, same order of sums), split and unsplit.
  auto rng = slimserve_test::make_rng(2535);
  const Fixture clean(Case{KvLayout::nhd, 128, 2, 4, 16, bf, {33, 5, 300}, {3, 1, 2}}, rng);
  struct Poison { bool is_v; std::size_t request; int kv_head, block; };
  const Poison poisons[] = {{false, 1, 0, 2}, {true, 2, 1, 7}};
  Fixture poisoned = clean;
  const std::size_t heads = static_cast<std::size_t>(clean.heads());
  const auto d = static_cast<std::size_t>(clean.c.head_dim);
  std::vector<bool> nan_element(clean.tokens() * heads * d, false), nan_row(clean.tokens() * heads, false);
  for (const Poison& x : poisons) {
    const int page = clean.table.pages_of(x.request)[0];
    auto& image = x.is_v ? poisoned.cache.v : poisoned.cache.k;
    image[poisoned.cache.vector_at(page, 0, x.kv_head) + d / 2 + static_cast<std::size_t>(x.block)] = nvfp4_nan_scale_code;
    for (std::size_t b = 0; b < clean.c.kv_lengths.size(); ++b) {
      const auto pages = clean.table.pages_of(b);
      if (std::find(pages.begin(), pages.end(), page) == pages.end()) continue;  // slot 0 of a listed page is live
      for (auto t = static_cast<std::size_t>(clean.qo_indptr[b]); t < static_cast<std::size_t>(clean.qo_indptr[b + 1]); ++t) {
        for (int g = 0; g < clean.c.group; ++g) {
          const std::size_t row = t * heads + static_cast<std::size_t>(x.kv_head * clean.c.group + g);
          nan_row[row] = nan_row[row] || !x.is_v;
          const std::size_t first = x.is_v ? static_cast<std::size_t>(x.block) * 16 : 0, count = x.is_v ? 16 : d;
          for (std::size_t e = first; e < first + count; ++e) nan_element[row * d + e] = true;
        }
      }
    }
  }
  for (const bool split : {false, true}) {
    INFO((split ? "split" : "unsplit"));
    RunConfig rc;
    rc.allow_split = split;
    rc.num_sms = 4096;  // a wide device: chunks of 128, the 300-token request splits
    const Output base = run(clean, rc);
    const Output out = run(poisoned, rc);
    REQUIRE(out.status.ok());
    CHECK(out.plan.split_kv == split);
    std::size_t wrong_nan = 0, wrong_lse = 0, wrong_other = 0, nan_elements = 0;
    for (std::size_t e = 0; e < nan_element.size(); ++e) {
      nan_elements += nan_element[e];
      if (nan_element[e]) {
        wrong_nan += !std::isnan(out.o[e]);
      } else {
        wrong_other += std::memcmp(&out.o[e], &base.o[e], sizeof(float)) != 0;
      }
    }
    for (std::size_t row = 0; row < nan_row.size(); ++row) {
      if (nan_row[row]) {
        wrong_lse += split ? !(out.lse[row] == -INFINITY) : !std::isnan(out.lse[row]);
      } else {
        wrong_other += std::memcmp(&out.lse[row], &base.lse[row], sizeof(float)) != 0;
      }
    }
    CHECK(nan_elements >= 2 * 16 * static_cast<std::size_t>(clean.c.group));
    CHECK(wrong_nan == 0);
    CHECK(wrong_lse == 0);
    CHECK(wrong_other == 0);
  }
}

TEST_CASE("paged attention over NVFP4 pages: the wgmma kernels fall back", "[attention][paged][nvfp4]") {
  auto rng = slimserve_test::make_rng(2534);
  const Fixture f(Case{KvLayout::nhd, 128, 1, 2, 16, bf, {20, 90}, {20, 40}}, rng);
  // 4 x 1 rows at head_dim 128 would take the wgmma kernel for FP8: NVFP4 keeps the mma.sync one.
  RunConfig wgmma;
  wgmma.warpgroup_mma = true;
  const Output out = run(f, wgmma);
  CHECK(out.plan.cta_rows == 64);
  CHECK_FALSE(out.plan.warpgroup_mma);
  CHECK_FALSE(out.ran_wgmma);
  CHECK(out.plan.choice.reason.find("not the wgmma kernel") != std::string::npos);
  check(f, out, f.reference());
}

TEST_CASE("paged attention over NVFP4 pages: head_dim 96 is refused by name", "[attention][paged][nvfp4]") {
  PagedKVCacheView view;
  unsigned char byte = 0;
  const float scale = 1.0f;
  view.k_pages = &byte;
  view.v_pages = &byte;
  view.k_scale = &scale;
  view.v_scale = &scale;
  view.num_pages = 1;
  view.page_size = 16;
  view.num_kv_heads = 1;
  view.head_dim = 96;
  view.dtype = KvDtype::nvfp4;
  view.scale_mode = KvScaleMode::per_tensor;
  const Status s = validate_cache_view(view);
  CHECK(s.code() == StatusCode::unsupported);
  CHECK(s.to_string().find("nvfp4") != std::string::npos);
}
