// Paged decode attention against an FP64 reference computed from the stored (already
// quantized) cache: dtype x layout x head_dim x GQA grid, ragged lengths, shuffled pages with
// holes and shared pages, split vs unsplit, aborted requests, merge on its own, preflight;
// NVFP4 pages (FP64 reference decoded from the stored codes, invalid tensor scales).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "attention_test_support.hpp"
#include "nvfp4_test_cache.hpp"
#include "slimserve/attention/decode.hpp"

using namespace attn_test;

namespace {

struct DecodeCase {
  KvDtype dtype;
  KvLayout layout;
  KvScaleMode scale_mode;
  int head_dim;
  int num_kv_heads;
  int group;  // query heads per KV head
  int page_size;
  ActivationDtype q_dtype;
  int query_tokens;
  std::vector<std::int64_t> lengths;
  float scale_factor = 1.0f;  // < 1 pushes the largest values into FP8 saturation
};

/// Everything a decode run needs, built on the host and uploaded.
struct DecodeFixture {
  DecodeCase c;
  HostPageTable table;
  HostCache cache;
  std::vector<float> q_values;             // activation values (as the kernel reads them)
  std::vector<std::uint16_t> q_bits;
  std::vector<double> v_max_per_row;       // max |v| a row attends over (tolerance scale)

  DecodeFixture(const DecodeCase& dc, std::mt19937_64& rng)
      : c(dc), table(make_page_table(dc.lengths, dc.page_size, rng, dc.lengths.size() > 1)),
        cache(CacheShape{dc.dtype, dc.layout, dc.scale_mode, table.num_pages, dc.page_size,
                         dc.num_kv_heads, dc.head_dim}) {
    // Real K/V rows for every owned (page, slot, head); shared pages are written once.
    // Per-tensor scales calibrated from amax (different for K and V, never 1); scale_factor
    // < 1 saturates.
    fill_cache(cache, table, c.lengths, rng, c.scale_factor);
    if (c.scale_mode == KvScaleMode::per_tensor) {
      REQUIRE(validate_static_scales(cache.k_scale, cache.v_scale).ok());
    }
    Activations q = random_activations(rng, c.q_dtype, out_rows() * static_cast<std::size_t>(c.head_dim));
    q_bits = std::move(q.bits);
    q_values = std::move(q.values);
    // Per output row: the largest |v| over the tokens it can see.
    for (std::size_t b = 0; b < c.lengths.size(); ++b) {
      for (int t = 0; t < c.query_tokens; ++t) {
        for (int h = 0; h < num_qo_heads(); ++h) {
          v_max_per_row.push_back(
              max_abs_value(c.lengths[b], c.head_dim, stored_values(cache, table, b, h / c.group, true)));
        }
      }
    }
  }
  int num_qo_heads() const { return c.num_kv_heads * c.group; }
  std::size_t out_rows() const { return c.lengths.size() * static_cast<std::size_t>(c.query_tokens * num_qo_heads()); }
  DecodeProblem problem() const {
    DecodeProblem p;
    p.batch_size = static_cast<std::int32_t>(c.lengths.size());
    p.num_qo_heads = num_qo_heads();
    p.num_kv_heads = c.num_kv_heads;
    p.head_dim = c.head_dim;
    p.page_size = c.page_size;
    p.query_tokens = c.query_tokens;
    p.kv_dtype = c.dtype;
    return p;
  }
};

struct DecodeOutput {
  std::vector<float> o;
  std::vector<float> lse;
  bool split = false;
};

/// Plans and runs on the device copy; outputs are poisoned (0xFF) before the run.
DecodeOutput run(const DecodeFixture& f, bool allow_split, const std::vector<kv::RequestStatus>* status,
                 const HostCache* cache_override = nullptr, const HostPageTable* plan_table = nullptr) {
  DeviceCache cache(cache_override ? *cache_override : f.cache);
  auto indptr = upload(f.table.indptr);
  auto indices = upload(f.table.indices);
  auto last = upload(f.table.last_page_len);
  auto q = upload(f.q_bits);
  auto o = rt::DeviceBuffer<std::uint16_t>::create(f.q_bits.size());
  auto lse = rt::DeviceBuffer<float>::create(f.out_rows());
  REQUIRE(o.ok());
  REQUIRE(lse.ok());
  REQUIRE(o->fill_bytes(0xFF).ok());
  REQUIRE(lse->fill_bytes(0xFF).ok());
  rt::DeviceBuffer<kv::RequestStatus> status_device;
  if (status != nullptr) status_device = upload(*status);

  // The plan may be made from other (stale, upper-bound) lengths than the device table's.
  const HostPageTable& planned = plan_table != nullptr ? *plan_table : f.table;
  DecodePlanArguments plan_args{f.problem(), planned.indptr, planned.last_page_len};
  plan_args.allow_split = allow_split;
  plan_args.max_ctas = 64;           // a small "device": long requests split
  plan_args.min_chunk_tokens = 64;
  auto bytes = decode_workspace_size(plan_args);
  REQUIRE(bytes.ok());
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*bytes);
  REQUIRE(workspace.ok());
  REQUIRE(workspace->fill_bytes(0xFF).ok());
  auto plan = plan_decode(plan_args, workspace->data(), *bytes, nullptr);
  REQUIRE(plan.ok());

  DecodeArguments args;
  args.cache = cache.view;
  args.table = kv::PageTableView{indptr.data(), indices.data(), last.data(), nullptr,
                                 static_cast<std::int32_t>(f.c.lengths.size()), f.c.page_size};
  args.request_status = status != nullptr ? status_device.data() : nullptr;
  args.q = q.data();
  args.o = o->data();
  args.lse = lse->data();
  args.q_dtype = f.c.q_dtype;
  args.sm_scale = 1.0f / std::sqrt(static_cast<float>(f.c.head_dim));
  const Status s = run_decode(args, *plan, workspace->data(), *bytes, nullptr);
  INFO(s.to_string());
  REQUIRE(s.ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());

  DecodeOutput out;
  out.split = plan->split_kv;
  const auto o_bits = download(*o, f.q_bits.size());
  for (auto b : o_bits) out.o.push_back(from_activation(f.c.q_dtype, b));
  out.lse = download(*lse, f.out_rows());
  return out;
}

/// Tolerance per element, from the error sources the reference does not share:
///  - the output rounding to BF16/FP16: half an ulp, <= 2^-8 (BF16) or 2^-11 (FP16) of |ref|,
///    and one more such step when the kernel's pre-rounding value sits on the other side of a
///    rounding boundary (covered by using a full 2^-8 / 2^-11 below);
///  - FP32 accumulation of q.k over head_dim terms and of sum(p v) over the tokens, plus exp2f:
///    relative errors ~1e-5 in the weights; 5e-4 of the largest |v| attended over covers them.
double tolerance(ActivationDtype t, double ref, double v_max) {
  const double rel = t == ActivationDtype::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  return rel * std::fabs(ref) + 5e-4 * v_max + 1e-6;
}

void check_against_reference(const DecodeFixture& f, const DecodeOutput& out, const Reference& ref,
                             const std::vector<bool>* aborted_request = nullptr) {
  const std::size_t rows_per_request = static_cast<std::size_t>(f.c.query_tokens * f.num_qo_heads());
  const RowComparison r = compare_rows(
      out.o, out.lse, ref, f.out_rows(), f.c.head_dim,
      [&](std::size_t row, double want) { return tolerance(f.c.q_dtype, want, f.v_max_per_row[row]); },
      [&](std::size_t row) { return aborted_request != nullptr && (*aborted_request)[row / rows_per_request]; },
      [&](std::size_t row) {
        return "row " + std::to_string(row) + " (request " + std::to_string(row / rows_per_request) + ", split " +
               std::to_string(out.split) + ")";
      });
  CHECK(r.mismatches == 0);
}

std::vector<DecodeCase> ci_grid() {
  using enum KvDtype;
  const auto nhd = KvLayout::nhd;
  const auto hnd = KvLayout::hnd;
  const auto bf = ActivationDtype::bf16;
  const auto fp = ActivationDtype::fp16;
  return {
      // dtype     layout scales                   D  Hkv G  ps   q  qt lengths (1, ps-1, ps, ps+1, long)
      {fp8_e4m3, hnd, KvScaleMode::per_tensor, 128, 2, 4, 16, bf, 1, {1, 15, 16, 17, 700}},
      {fp8_e5m2, nhd, KvScaleMode::per_token, 64, 1, 8, 32, fp, 1, {1, 31, 32, 33, 700}},
      {bf16, nhd, KvScaleMode::none, 256, 2, 1, 64, bf, 1, {1, 63, 64, 65, 300}},
      {fp16, hnd, KvScaleMode::per_tensor, 128, 1, 2, 128, fp, 3, {3, 127, 128, 129, 500}},
      {fp8_e4m3, nhd, KvScaleMode::per_token, 256, 1, 2, 16, bf, 1, {1, 15, 17, 400}},
      {fp8_e4m3, nhd, KvScaleMode::per_tensor, 64, 1, 4, 16, fp, 2, {2, 16, 2100}, 0.5f},  // MQA; saturating
      {fp8_e5m2, hnd, KvScaleMode::per_tensor, 128, 2, 3, 32, bf, 1, {1, 33, 200}},  // GQA 3
  };
}

}  // namespace

TEST_CASE("decode: grid of dtypes x layouts x head dims x GQA against FP64", "[attention][decode]") {
  auto rng = slimserve_test::make_rng(401);
  for (const DecodeCase& c : ci_grid()) {
    INFO("dtype " << to_string(c.dtype) << " layout " << to_string(c.layout) << " scales "
                  << to_string(c.scale_mode) << " D " << c.head_dim << " Hkv " << c.num_kv_heads
                  << " group " << c.group << " ps " << c.page_size << " query tokens " << c.query_tokens);
    DecodeFixture f(c, rng);
    CHECK(f.table.shared_pages >= 1);  // the last request shares a prefix page
    const Reference ref = reference_decode(f.cache, f.table, f.q_values, f.num_qo_heads(),
                                           c.query_tokens, 1.0 / std::sqrt(static_cast<double>(c.head_dim)));
    const DecodeOutput unsplit = run(f, false, nullptr);
    CHECK_FALSE(unsplit.split);
    check_against_reference(f, unsplit, ref);
    const DecodeOutput split = run(f, true, nullptr);
    CHECK(split.split);
    check_against_reference(f, split, ref);
    // Split and unsplit agree with each other within two output roundings.
    std::size_t disagree = 0;
    for (std::size_t i = 0; i < split.o.size(); ++i) {
      const double a = split.o[i], b = unsplit.o[i];
      disagree += !(std::fabs(a - b) <= 2 * tolerance(c.q_dtype, b, f.v_max_per_row[i / static_cast<std::size_t>(c.head_dim)]));
    }
    CHECK(disagree == 0);
  }
}

TEST_CASE("decode: aborted requests read no page and are marked", "[attention][decode]") {
  auto rng = slimserve_test::make_rng(402);
  DecodeCase c{KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, 128, 2, 2, 16,
               ActivationDtype::bf16, 1, {20, 700, 33, 5}};
  DecodeFixture f(c, rng);
  // Request 1 (long, so it is split) and 3 fail the tag check. Every page of theirs that no
  // live request also uses is poisoned with NaN (data and scales): reading it would show.
  std::vector<kv::RequestStatus> status(4, kv::RequestStatus{kv::RequestState::ok, -1});
  status[1] = {kv::RequestState::stale_tag, 3};
  status[3] = {kv::RequestState::page_out_of_range, 0};
  std::vector<bool> aborted{false, true, false, true};
  std::set<int> live_pages;
  for (std::size_t b : {std::size_t{0}, std::size_t{2}}) {
    for (int page : f.table.pages_of(b)) live_pages.insert(page);
  }
  HostCache poisoned = f.cache;
  std::size_t poisoned_pages = 0;
  for (std::size_t b : {std::size_t{1}, std::size_t{3}}) {
    for (int page : f.table.pages_of(b)) {
      if (live_pages.count(page) != 0) continue;
      ++poisoned_pages;
      for (int slot = 0; slot < c.page_size; ++slot)
        for (int h = 0; h < c.num_kv_heads; ++h) {
          for (int d = 0; d < c.head_dim; ++d) {
            poisoned.set_bits(poisoned.k, poisoned.offset(page, slot, h, d), 0xFF);
            poisoned.set_bits(poisoned.v, poisoned.offset(page, slot, h, d), 0xFF);
          }
          poisoned.k_token_scale[poisoned.scale_offset(page, slot, h)] = std::numeric_limits<float>::quiet_NaN();
          poisoned.v_token_scale[poisoned.scale_offset(page, slot, h)] = std::numeric_limits<float>::quiet_NaN();
        }
    }
  }
  CHECK(poisoned_pages >= 44);  // request 1's 44 pages at least
  const Reference ref = reference_decode(f.cache, f.table, f.q_values, f.num_qo_heads(), 1,
                                         1.0 / std::sqrt(128.0));
  for (bool allow_split : {false, true}) {
    const DecodeOutput out = run(f, allow_split, &status, &poisoned);
    CHECK(out.split == allow_split);
    check_against_reference(f, out, ref, &aborted);
  }
}

TEST_CASE("decode: a NaN key in a live token makes exactly its readers' rows NaN", "[attention][decode]") {
  // The CUDA-core kernel's side of docs/attention.md "NaN in the cache": FP8 keeps a NaN input
  // a NaN (0x7F). Key element 37 of slot 0 of request 1's first page (KV head 1) and of request
  // 0's only page (KV head 0; request 0 has two tokens and two query tokens, so its first row
  // sees token 0 alone: every score NaN, the running max stays -inf) is NaN: the rows of that KV head's query group in every request
  // listing the page are NaN in every element, lse NaN unsplit and -inf split (the merge marks
  // a NaN partial), never an empty row (0, lse -inf). Every other row is unchanged, bit for bit.
  auto rng = slimserve_test::make_rng(407);
  const DecodeCase c{KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 128, 2, 4, 16,
                     ActivationDtype::bf16, 2, {2, 17, 700, 40}};
  const DecodeFixture f(c, rng);
  HostCache poisoned = f.cache;
  const std::size_t heads = static_cast<std::size_t>(f.num_qo_heads());
  const std::size_t rows_per_request = static_cast<std::size_t>(c.query_tokens) * heads;
  std::vector<bool> nan_row(f.out_rows(), false);
  struct Poison { std::size_t request; int kv_head; };
  for (const Poison x : {Poison{0, 0}, Poison{1, 1}}) {
    const int page = f.table.pages_of(x.request)[0];
    poisoned.set_bits(poisoned.k, poisoned.offset(page, 0, x.kv_head, 37), 0x7F);
    for (std::size_t b = 0; b < c.lengths.size(); ++b) {
      const auto pages = f.table.pages_of(b);
      if (std::find(pages.begin(), pages.end(), page) == pages.end()) continue;  // slot 0 of a listed page is live
      for (int t = 0; t < c.query_tokens; ++t) {
        for (int g = 0; g < c.group; ++g) {
          nan_row[b * rows_per_request + static_cast<std::size_t>(t) * heads + static_cast<std::size_t>(x.kv_head * c.group + g)] = true;
        }
      }
    }
  }
  const std::size_t d = static_cast<std::size_t>(c.head_dim);
  for (const bool allow_split : {false, true}) {
    INFO((allow_split ? "split" : "unsplit"));
    const DecodeOutput base = run(f, allow_split, nullptr);
    const DecodeOutput out = run(f, allow_split, nullptr, &poisoned);
    CHECK(out.split == allow_split);
    const auto [wrong_nan, wrong_lse, wrong_other, nan_rows] =
        tally_nan_rows(nan_row, d, allow_split, out.o, out.lse, base.o, base.lse);
    CHECK(nan_rows >= 2 * static_cast<std::size_t>(c.query_tokens * c.group));
    CHECK(nan_rows < nan_row.size());
    CHECK(wrong_nan == 0);
    CHECK(wrong_lse == 0);
    CHECK(wrong_other == 0);
  }
}

TEST_CASE("decode: a plan made for other lengths stays correct (graph replay)", "[attention][decode]") {
  auto rng = slimserve_test::make_rng(406);
  DecodeCase c{KvDtype::fp8_e4m3, KvLayout::hnd, KvScaleMode::per_tensor, 128, 1, 4, 16,
               ActivationDtype::bf16, 1, {700, 40, 1}};
  DecodeFixture f(c, rng);
  const Reference ref = reference_decode(f.cache, f.table, f.q_values, f.num_qo_heads(), 1,
                                         1.0 / std::sqrt(128.0));
  // Planned for shorter requests (the last split must run to the real end) and for longer ones
  // (trailing splits are empty and must weigh nothing in the merge).
  for (const std::vector<std::int64_t>& planned_lengths :
       {std::vector<std::int64_t>{300, 17, 1}, std::vector<std::int64_t>{1500, 200, 90}}) {
    const HostPageTable planned = make_page_table(planned_lengths, 16, rng, false);
    const DecodeOutput out = run(f, true, nullptr, nullptr, &planned);
    CHECK(out.split);
    check_against_reference(f, out, ref);
  }
}

TEST_CASE("decode: merge of partial states on its own", "[attention][merge]") {
  auto rng = slimserve_test::make_rng(403);
  constexpr int d_dim = 64, rows = 3;
  // Request 0: one partial; 1: four (one empty: lse -inf); 2: none; 3: two, one marked NaN.
  const std::vector<std::int32_t> split_indptr{0, 1, 5, 5, 7};
  const int partials = 7;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> po(static_cast<std::size_t>(partials * rows * d_dim)), pl(static_cast<std::size_t>(partials * rows));
  for (auto& x : po) x = normal(rng);
  for (auto& x : pl) x = normal(rng) * 4.0f;
  for (int r = 0; r < rows; ++r) {
    pl[static_cast<std::size_t>(2 * rows + r)] = -INFINITY;
    pl[static_cast<std::size_t>(6 * rows + r)] = std::numeric_limits<float>::quiet_NaN();
  }
  auto po_d = upload(po);
  auto pl_d = upload(pl);
  auto si_d = upload(split_indptr);
  auto o = rt::DeviceBuffer<std::uint16_t>::create(4 * rows * d_dim);
  auto lse = rt::DeviceBuffer<float>::create(4 * rows);
  REQUIRE(o.ok());
  REQUIRE(lse.ok());
  REQUIRE(o->fill_bytes(0xFF).ok());
  REQUIRE(lse->fill_bytes(0xFF).ok());
  MergeArguments args{po_d.data(), pl_d.data(), si_d.data(), 4, rows, d_dim, o->data(), lse->data(),
                      ActivationDtype::fp16};
  REQUIRE(merge_attention_states(args, nullptr).ok());
  const auto o_bits = download(*o, 4 * rows * d_dim);
  const auto lse_h = download(*lse, 4 * rows);
  for (int b = 0; b < 4; ++b) {
    for (int r = 0; r < rows; ++r) {
      const std::size_t out_row = static_cast<std::size_t>(b * rows + r);
      if (b == 3) {  // a marked partial marks the output
        CHECK(lse_h[out_row] == -INFINITY);
        for (int d = 0; d < d_dim; ++d) CHECK(std::isnan(from_activation(ActivationDtype::fp16, o_bits[out_row * d_dim + static_cast<std::size_t>(d)])));
        continue;
      }
      double m = -INFINITY;
      for (int i = split_indptr[static_cast<std::size_t>(b)]; i < split_indptr[static_cast<std::size_t>(b) + 1]; ++i) m = std::max(m, static_cast<double>(pl[static_cast<std::size_t>(i * rows + r)]));
      double sum = 0.0;
      std::vector<double> acc(d_dim, 0.0);
      if (m != -INFINITY) {
        for (int i = split_indptr[static_cast<std::size_t>(b)]; i < split_indptr[static_cast<std::size_t>(b) + 1]; ++i) {
          const double w = std::exp(pl[static_cast<std::size_t>(i * rows + r)] - m);
          sum += w;
          for (int d = 0; d < d_dim; ++d) acc[static_cast<std::size_t>(d)] += w * po[(static_cast<std::size_t>(i * rows + r)) * d_dim + static_cast<std::size_t>(d)];
        }
      }
      const double want_lse = m == -INFINITY ? -INFINITY : m + std::log(sum);
      if (std::isinf(want_lse)) {
        CHECK(lse_h[out_row] == -INFINITY);
      } else {
        CHECK(std::fabs(lse_h[out_row] - want_lse) <= 1e-5 * (1 + std::fabs(want_lse)));  // FP32 exp/log
      }
      for (int d = 0; d < d_dim; ++d) {
        const double want = m == -INFINITY ? 0.0 : acc[static_cast<std::size_t>(d)] / sum;
        const double got = from_activation(ActivationDtype::fp16, o_bits[out_row * d_dim + static_cast<std::size_t>(d)]);
        // FP16 output rounding (2^-11 relative) plus FP32 weighting (1e-5 of the inputs' scale).
        CHECK(std::fabs(got - want) <= std::ldexp(std::fabs(want), -10) + 1e-4);
      }
    }
  }
}

TEST_CASE("decode: preflight refuses before launching, outputs untouched", "[attention][decode]") {
  auto rng = slimserve_test::make_rng(404);
  DecodeCase c{KvDtype::fp8_e4m3, KvLayout::hnd, KvScaleMode::per_tensor, 64, 1, 2, 16,
               ActivationDtype::bf16, 1, {40, 3}};
  DecodeFixture f(c, rng);
  DeviceCache cache(f.cache);
  auto indptr = upload(f.table.indptr);
  auto indices = upload(f.table.indices);
  auto last = upload(f.table.last_page_len);
  auto q = upload(f.q_bits);
  auto o = rt::DeviceBuffer<std::uint16_t>::create(f.q_bits.size());
  REQUIRE(o.ok());
  REQUIRE(o->fill_bytes(0x7F).ok());
  DecodePlanArguments plan_args{f.problem(), f.table.indptr, f.table.last_page_len};
  auto bytes = decode_workspace_size(plan_args);
  REQUIRE(bytes.ok());
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*bytes);
  REQUIRE(workspace.ok());
  CHECK(plan_decode(plan_args, workspace->data(), *bytes - 1, nullptr).status().code() ==
        StatusCode::resource_exhausted);
  auto plan = plan_decode(plan_args, workspace->data(), *bytes, nullptr);
  REQUIRE(plan.ok());
  DecodeArguments args;
  args.cache = cache.view;
  args.table = kv::PageTableView{indptr.data(), indices.data(), last.data(), nullptr, 2, 16};
  args.q = q.data();
  args.o = o->data();
  args.q_dtype = ActivationDtype::bf16;
  args.sm_scale = 0.125f;

  SECTION("workspace too small") {
    CHECK(run_decode(args, *plan, workspace->data(), *bytes - 4, nullptr).code() == StatusCode::resource_exhausted);
  }
  SECTION("null workspace is an invalid argument, not a shortage") {
    CHECK(run_decode(args, *plan, nullptr, *bytes, nullptr).code() == StatusCode::invalid_argument);
  }
  SECTION("enum values out of range are refused at the boundary") {
    args.q_dtype = static_cast<ActivationDtype>(5);
    CHECK(can_implement(args, *plan).code() == StatusCode::invalid_argument);
    CHECK(run_decode(args, *plan, workspace->data(), *bytes, nullptr).code() == StatusCode::invalid_argument);
  }
  SECTION("plan made for another cache") {
    args.cache.dtype = KvDtype::fp8_e5m2;
    CHECK(run_decode(args, *plan, workspace->data(), *bytes, nullptr).code() == StatusCode::invalid_argument);
  }
  SECTION("page table of another batch") {
    args.table.batch_size = 3;
    CHECK(run_decode(args, *plan, workspace->data(), *bytes, nullptr).code() == StatusCode::invalid_argument);
  }
  SECTION("bad sm_scale") {
    args.sm_scale = std::numeric_limits<float>::quiet_NaN();
    CHECK(run_decode(args, *plan, workspace->data(), *bytes, nullptr).code() == StatusCode::invalid_argument);
  }
  SECTION("FP8 cache without scales") {
    args.cache.scale_mode = KvScaleMode::none;
    CHECK(run_decode(args, *plan, workspace->data(), *bytes, nullptr).code() == StatusCode::invalid_argument);
  }
  const auto after = download(*o, f.q_bits.size());
  for (auto bits : after) CHECK(bits == 0x7F7F);
}

TEST_CASE("decode: full grid (GPU only; the emulator runs the representative grid)", "[attention][decode][full]") {
  if (rt::device_count() == 0) {
    WARN("no GPU: the full dtype x layout x head_dim x GQA x page grid runs only on a device");
    return;
  }
  auto rng = slimserve_test::make_rng(405);
  int index = 0;
  for (KvDtype dtype : {KvDtype::bf16, KvDtype::fp16, KvDtype::fp8_e4m3, KvDtype::fp8_e5m2})
    for (KvLayout layout : {KvLayout::nhd, KvLayout::hnd})
      for (int head_dim : {64, 128, 256})
        for (int group : {1, 4, 8})
          for (int page_size : {16, 32, 64, 128}) {
            ++index;
            const KvScaleMode mode = is_fp8(dtype) ? (index % 2 ? KvScaleMode::per_tensor : KvScaleMode::per_token)
                                                   : (index % 2 ? KvScaleMode::none : KvScaleMode::per_tensor);
            const ActivationDtype q_dtype = index % 3 ? ActivationDtype::bf16 : ActivationDtype::fp16;
            const int query_tokens = index % 5 == 0 ? 2 : 1;
            const std::int64_t ps = page_size;
            DecodeCase c{dtype, layout, mode, head_dim, 2, group, page_size, q_dtype, query_tokens,
                         {std::max<std::int64_t>(query_tokens, 1), ps - 1, ps, ps + 1, 2500}};
            INFO("dtype " << to_string(dtype) << " layout " << to_string(layout) << " D " << head_dim
                          << " group " << group << " ps " << page_size << " scales " << to_string(mode));
            DecodeFixture f(c, rng);
            const Reference ref = reference_decode(f.cache, f.table, f.q_values, f.num_qo_heads(), query_tokens,
                                                   1.0 / std::sqrt(static_cast<double>(head_dim)));
            check_against_reference(f, run(f, false, nullptr), ref);
            check_against_reference(f, run(f, true, nullptr), ref);
          }
}

// ---- NVFP4 pages ----------------------------------------------------------------------------
// The CUDA-core decode over NVFP4 pages (one 16-element block per lane, decoded in FP32)
// against an FP64 reference decoded from the stored codes and block scales.
namespace {

struct Nvfp4DecodeCase {
  KvLayout layout;
  int head_dim, num_kv_heads, group, page_size;
  ActivationDtype q_dtype;
  int query_tokens;
  std::vector<std::int64_t> lengths;
};

struct Nvfp4DecodeFixture {
  Nvfp4DecodeCase c;
  HostPageTable table;
  Nvfp4HostCache cache;
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

  Nvfp4DecodeFixture(const Nvfp4DecodeCase& dc, std::mt19937_64& rng)
      : c(dc), table(make_page_table(dc.lengths, dc.page_size, rng, dc.lengths.size() > 1)),
        cache(dc.layout, table.num_pages, dc.page_size, dc.num_kv_heads, dc.head_dim) {
    cache.fill(table, c.lengths, rng);
    Activations q = random_activations(rng, c.q_dtype, out_rows() * static_cast<std::size_t>(c.head_dim));
    q_bits = std::move(q.bits);
    q_values = std::move(q.values);
    for (std::size_t b = 0; b < c.lengths.size(); ++b) {
      for (int h = 0; h < c.num_kv_heads; ++h) v_max.push_back(max_abs_value(c.lengths[b], c.head_dim, value(b, h, true)));
    }
  }
  int num_qo_heads() const { return c.num_kv_heads * c.group; }
  std::size_t rows_per_request() const { return static_cast<std::size_t>(c.query_tokens * num_qo_heads()); }
  std::size_t out_rows() const { return c.lengths.size() * rows_per_request(); }
  double sm_scale() const { return 1.0 / std::sqrt(static_cast<double>(c.head_dim)); }
  Reference reference() const {
    Reference ref;
    const auto d_size = static_cast<std::size_t>(c.head_dim);
    ref.o.assign(out_rows() * d_size, 0.0);
    ref.lse.assign(out_rows(), -INFINITY);
    for (std::size_t b = 0; b < c.lengths.size(); ++b) {
      for (int t = 0; t < c.query_tokens; ++t) {
        const std::int64_t visible = std::max<std::int64_t>(0, c.lengths[b] - c.query_tokens + t + 1);
        for (int h = 0; h < num_qo_heads(); ++h) {
          const std::size_t row = b * rows_per_request() + static_cast<std::size_t>(t * num_qo_heads() + h);
          ref.lse[row] = attend_row(q_values.data() + row * d_size, c.head_dim, 0, visible, RowOptions{sm_scale()},
                                    value(b, h / c.group, false), value(b, h / c.group, true),
                                    ref.o.data() + row * d_size);
        }
      }
    }
    return ref;
  }
};

/// Plans and runs; outputs and workspace poisoned first. k_scale_override != 0 replaces the
/// device-held K tensor scale (v_scale_override the V one).
DecodeOutput run_nvfp4(const Nvfp4DecodeFixture& f, bool allow_split, float k_scale_override = 0.0f,
                       float v_scale_override = 0.0f) {
  auto k_pages = upload(f.cache.k);
  auto v_pages = upload(f.cache.v);
  auto scales = upload(std::vector<float>{k_scale_override != 0.0f ? k_scale_override : f.cache.k_scale,
                                          v_scale_override != 0.0f ? v_scale_override : f.cache.v_scale});
  auto indptr = upload(f.table.indptr);
  auto indices = upload(f.table.indices);
  auto last = upload(f.table.last_page_len);
  auto q = upload(f.q_bits);
  auto o = rt::DeviceBuffer<std::uint16_t>::create(f.q_bits.size());
  auto lse = rt::DeviceBuffer<float>::create(f.out_rows());
  REQUIRE(o.ok());
  REQUIRE(lse.ok());
  REQUIRE(o->fill_bytes(0xFF).ok());
  REQUIRE(lse->fill_bytes(0xFF).ok());

  DecodeProblem problem;
  problem.batch_size = static_cast<std::int32_t>(f.c.lengths.size());
  problem.num_qo_heads = f.num_qo_heads();
  problem.num_kv_heads = f.c.num_kv_heads;
  problem.head_dim = f.c.head_dim;
  problem.page_size = f.c.page_size;
  problem.query_tokens = f.c.query_tokens;
  problem.kv_dtype = KvDtype::nvfp4;
  DecodePlanArguments plan_args{problem, f.table.indptr, f.table.last_page_len};
  plan_args.allow_split = allow_split;
  plan_args.max_ctas = 64;
  plan_args.min_chunk_tokens = 64;
  auto bytes = decode_workspace_size(plan_args);
  REQUIRE(bytes.ok());
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*bytes);
  REQUIRE(workspace.ok());
  REQUIRE(workspace->fill_bytes(0xFF).ok());
  auto plan = plan_decode(plan_args, workspace->data(), *bytes, nullptr);
  INFO(plan.status().to_string());
  REQUIRE(plan.ok());

  DecodeArguments args;
  args.cache.k_pages = k_pages.data();
  args.cache.v_pages = v_pages.data();
  args.cache.k_scale = scales.data();
  args.cache.v_scale = scales.data() + 1;
  args.cache.num_pages = f.cache.num_pages;
  args.cache.page_size = f.c.page_size;
  args.cache.num_kv_heads = f.c.num_kv_heads;
  args.cache.head_dim = f.c.head_dim;
  args.cache.dtype = KvDtype::nvfp4;
  args.cache.layout = f.c.layout;
  args.cache.scale_mode = KvScaleMode::per_tensor;
  args.table = kv::PageTableView{indptr.data(), indices.data(), last.data(), nullptr,
                                 static_cast<std::int32_t>(f.c.lengths.size()), f.c.page_size};
  args.q = q.data();
  args.o = o->data();
  args.lse = lse->data();
  args.q_dtype = f.c.q_dtype;
  args.sm_scale = static_cast<float>(f.sm_scale());
  const Status s = run_decode(args, *plan, workspace->data(), *bytes, nullptr);
  INFO(s.to_string());
  REQUIRE(s.ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  DecodeOutput out;
  out.split = plan->split_kv;
  for (auto b : download(*o, f.q_bits.size())) out.o.push_back(from_activation(f.c.q_dtype, b));
  out.lse = download(*lse, f.out_rows());
  return out;
}

std::size_t nvfp4_mismatches(const Nvfp4DecodeFixture& f, const DecodeOutput& out, const Reference& ref) {
  const RowComparison r = compare_rows(
      out.o, out.lse, ref, f.out_rows(), f.c.head_dim,
      [&](std::size_t row, double want) {
        const std::size_t b = row / f.rows_per_request();
        const int kv_head = static_cast<int>(row % static_cast<std::size_t>(f.num_qo_heads())) / f.c.group;
        return tolerance(f.c.q_dtype, want, f.v_max[b * static_cast<std::size_t>(f.c.num_kv_heads) + kv_head]);
      },
      [](std::size_t) { return false; },
      [&](std::size_t row) { return "row " + std::to_string(row) + " (split " + std::to_string(out.split) + ")"; });
  CHECK(r.checked == f.out_rows() * static_cast<std::size_t>(f.c.head_dim));
  return r.mismatches;
}

}  // namespace

TEST_CASE("decode: NVFP4 pages against FP64 decoded from the stored codes", "[attention][decode][nvfp4]") {
  auto rng = slimserve_test::make_rng(425);
  const auto nhd = KvLayout::nhd;
  const auto hnd = KvLayout::hnd;
  const auto bf = ActivationDtype::bf16;
  const auto fp = ActivationDtype::fp16;
  const std::vector<Nvfp4DecodeCase> cases = {
      // layout D  Hkv G  ps  q  qt lengths (1, ps-1, ps, ps+1, long)
      {nhd, 128, 2, 4, 16, bf, 1, {1, 15, 16, 17, 700}},
      {hnd, 64, 1, 8, 32, fp, 1, {1, 31, 32, 33, 700}},
      {nhd, 256, 2, 1, 16, fp, 1, {1, 15, 16, 17, 300}},
      {hnd, 128, 1, 4, 16, bf, 3, {3, 15, 16, 17, 500}},  // speculative rows
      {hnd, 256, 1, 8, 16, bf, 2, {2, 16, 400}},
      {nhd, 64, 2, 1, 16, fp, 1, {1, 17, 600}},
  };
  for (const Nvfp4DecodeCase& c : cases) {
    INFO("layout " << to_string(c.layout) << " D " << c.head_dim << " Hkv " << c.num_kv_heads << " group "
                   << c.group << " ps " << c.page_size << " query tokens " << c.query_tokens);
    Nvfp4DecodeFixture f(c, rng);
    const Reference ref = f.reference();
    const DecodeOutput unsplit = run_nvfp4(f, false);
    CHECK_FALSE(unsplit.split);
    CHECK(nvfp4_mismatches(f, unsplit, ref) == 0);
    const DecodeOutput split = run_nvfp4(f, true);
    CHECK(split.split);
    CHECK(nvfp4_mismatches(f, split, ref) == 0);
  }
}

TEST_CASE("decode: an invalid NVFP4 tensor scale gives NaN rows", "[attention][decode][nvfp4]") {
  auto rng = slimserve_test::make_rng(426);
  Nvfp4DecodeFixture f({KvLayout::nhd, 128, 2, 4, 16, ActivationDtype::bf16, 1, {1, 17, 300}}, rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const bool allow_split : {false, true}) {
    for (const float bad : {nan, inf, -1.0f, nvfp4_above_domain_scale}) {
      for (const bool bad_k : {true, false}) {
        INFO("split " << allow_split << " bad scale " << bad << " on " << (bad_k ? "K" : "V"));
        const DecodeOutput out = run_nvfp4(f, allow_split, bad_k ? bad : 0.0f, bad_k ? 0.0f : bad);
        std::size_t finite = 0;
        for (float x : out.o) finite += !std::isnan(x);
        CHECK(finite == 0);
        if (bad_k) {
          for (float l : out.lse) CHECK_FALSE(std::isfinite(l));
        }
      }
    }
  }
}
