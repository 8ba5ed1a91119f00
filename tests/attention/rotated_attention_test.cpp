// Paged attention over rotated caches (PagedAttentionArguments::rotation): the cache is written
// by append_kv with rotation keys / keys_and_values (BF16, FP8 e4m3 per tensor, NVFP4), and the
// tensor-core kernel rotates the queries itself (and the output back for keys_and_values).
// Reference in FP64: the unrotated queries attend to the stored (rotated, quantized) codes
// rotated back in FP64, every element and the LSE; ragged lengths (1, page-1, page, page+1,
// long), shuffled pages with holes, split and unsplit plans, decode and causal prefill,
// head_dim 64/128/256, poisoned outputs. The old two-step path (rotate_heads, attention,
// rotate_heads) agrees within the rounding of its rotated queries. Bad rotation values and
// head dims, and a rotated fused prefill, are refused by name with nothing written.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attention_test_support.hpp"
#include "slimserve/attention/append.hpp"
#include "slimserve/attention/paged_attention.hpp"
#include "slimserve/attention/rotate_heads.hpp"
#include "slimserve/attention/rotation.hpp"
#include "slimserve/formats/fp4.hpp"
#include "slimserve/formats/nvfp4.hpp"

using namespace attn_test;

namespace {

/// y = H x / sqrt(D) in FP64 (its own inverse).
void hadamard64(std::vector<double>& x) {
  const std::size_t n = x.size();
  for (std::size_t h = 1; h < n; h *= 2) {
    for (std::size_t i = 0; i < n; ++i) {
      if (i & h) continue;
      const double a = x[i], b = x[i + h];
      x[i] = a + b;
      x[i + h] = a - b;
    }
  }
  for (double& v : x) v /= std::sqrt(static_cast<double>(n));
}

struct Case {
  KvDtype dtype;
  KvScaleMode scale_mode;
  int head_dim, num_kv_heads, group, page_size;
  ActivationDtype q_dtype;
  KvRotation rotation;
  std::vector<std::int64_t> kv_lengths;
  std::vector<std::int32_t> qo_lengths;
};

struct Fixture {
  Case c;
  HostPageTable table;
  std::size_t vector_bytes = 0;
  std::vector<unsigned char> k_bytes, v_bytes;  // the cache after the rotated append
  float k_scale = 1.0f, v_scale = 1.0f;
  std::vector<std::int32_t> qo_indptr{0};
  std::vector<std::uint16_t> q_bits;
  std::vector<float> q_values;
  // Per request: [position][kv_head][d] stored values rotated back (K; V when rotated).
  std::vector<std::vector<double>> k_hat, v_hat;
  std::vector<double> v_max, k_norm_max;  // per request

  int heads() const { return c.num_kv_heads * c.group; }
  std::size_t tokens() const { return static_cast<std::size_t>(qo_indptr.back()); }
  std::size_t vector_at(int page, int slot, int head) const {
    return static_cast<std::size_t>(cache_offset(KvLayout::nhd, c.page_size, c.num_kv_heads, 1, page, slot, head, 0)) *
           vector_bytes;
  }
  /// The stored value of element d of a vector (dequantized, scaled), in FP64.
  double stored(bool is_v, int page, int slot, int head, int d) const {
    const unsigned char* vec = (is_v ? v_bytes : k_bytes).data() + vector_at(page, slot, head);
    const double tensor = c.scale_mode == KvScaleMode::none ? 1.0 : (is_v ? v_scale : k_scale);
    if (c.dtype == KvDtype::nvfp4) {
      const auto code = fp4_e2m1::from_bits(static_cast<std::uint8_t>(vec[d / 2] >> (4 * (d % 2)) & 0xF));
      const auto scale = fp8_e4m3::from_bits(vec[c.head_dim / 2 + d / nvfp4_block_elements]);
      return static_cast<double>(to_float(code)) * static_cast<double>(to_float(scale)) * tensor;
    }
    const int eb = element_bytes(c.dtype);
    std::uint16_t bits = 0;
    std::memcpy(&bits, vec + static_cast<std::size_t>(d * eb), static_cast<std::size_t>(eb));
    return static_cast<double>(dequantize(c.dtype, bits)) * tensor;
  }

  Fixture(const Case& cc, std::mt19937_64& rng)
      : c(cc), table(make_page_table(cc.kv_lengths, cc.page_size, rng, false)) {
    const int d_dim = c.head_dim, h_kv = c.num_kv_heads;
    vector_bytes = static_cast<std::size_t>(head_vector_bytes(c.dtype, d_dim));
    const std::size_t vectors = static_cast<std::size_t>(table.num_pages) * c.page_size * h_kv;
    k_bytes.assign(vectors * vector_bytes, 0xFF);  // poison: NaN codes / scales where unwritten
    v_bytes = k_bytes;
    // K/V rows of every position (the whole request appended as one chunk), with outliers.
    std::vector<std::int32_t> append_indptr{0};
    for (auto len : c.kv_lengths) append_indptr.push_back(append_indptr.back() + static_cast<std::int32_t>(len));
    const std::size_t count = static_cast<std::size_t>(append_indptr.back()) * h_kv * d_dim;
    std::vector<std::uint16_t> k_in(count), v_in(count);
    double k_amax = 0.0, v_amax = 0.0;
    std::vector<float> row(static_cast<std::size_t>(d_dim));
    std::vector<double> rot(static_cast<std::size_t>(d_dim));
    for (std::size_t r = 0; r < count / d_dim; ++r) {
      for (int is_v = 0; is_v < 2; ++is_v) {
        realistic_row(rng, d_dim, row.data(), is_v ? 0.5f : 1.0f);
        for (int d = 0; d < d_dim; ++d) {
          const std::uint16_t bits = to_activation(c.q_dtype, row[d]);
          (is_v ? v_in : k_in)[r * d_dim + d] = bits;
          rot[d] = from_activation(c.q_dtype, bits);
        }
        if (rotates_keys(c.rotation) && (!is_v || rotates_values(c.rotation))) hadamard64(rot);
        for (double x : rot) (is_v ? v_amax : k_amax) = std::max(is_v ? v_amax : k_amax, std::fabs(x));
      }
    }
    if (c.dtype == KvDtype::nvfp4) {
      k_scale = static_cast<float>(k_amax / 2688.0);
      v_scale = static_cast<float>(v_amax / 2688.0);
    } else if (c.scale_mode == KvScaleMode::per_tensor) {
      k_scale = static_cast<float>(k_amax / 448.0);
      v_scale = static_cast<float>(v_amax / 448.0);
    }
    auto k_dev = upload(k_bytes);
    auto v_dev = upload(v_bytes);
    auto scales = upload(std::vector<float>{k_scale, v_scale});
    auto indptr = upload(table.indptr);
    auto indices = upload(table.indices);
    auto last = upload(table.last_page_len);
    auto chunk = upload(append_indptr);
    auto k_new = upload(k_in);
    auto v_new = upload(v_in);
    AppendArguments a;
    a.cache = view(k_dev.data(), v_dev.data(), scales.data());
    a.input_dtype = c.q_dtype;
    a.num_tokens = append_indptr.back();
    a.k_new = k_new.data();
    a.v_new = v_new.data();
    a.rotation = c.rotation;
    a.table = kv::PageTableView{indptr.data(), indices.data(), last.data(), nullptr,
                                static_cast<std::int32_t>(c.kv_lengths.size()), c.page_size};
    a.append_indptr = chunk.data();
    const Status appended = append_kv(a, nullptr);
    INFO(appended.to_string());
    REQUIRE(appended.ok());
    k_bytes = download(k_dev, k_bytes.size());
    v_bytes = download(v_dev, v_bytes.size());

    for (std::size_t b = 0; b < c.kv_lengths.size(); ++b) {
      const auto pages = table.pages_of(b);
      std::vector<double> kh, vh;
      double vm = 0.0, kn = 0.0;
      for (std::int64_t p = 0; p < c.kv_lengths[b]; ++p) {
        const int page = pages[static_cast<std::size_t>(p / c.page_size)];
        const int slot = static_cast<int>(p % c.page_size);
        for (int h = 0; h < h_kv; ++h) {
          for (int is_v = 0; is_v < 2; ++is_v) {
            for (int d = 0; d < d_dim; ++d) rot[d] = stored(is_v != 0, page, slot, h, d);
            if (rotates_keys(c.rotation) && (!is_v || rotates_values(c.rotation))) hadamard64(rot);  // rotated back
            double norm = 0.0;
            for (double x : rot) {
              norm += x * x;
              if (is_v) vm = std::max(vm, std::fabs(x));
            }
            if (!is_v) kn = std::max(kn, std::sqrt(norm));
            (is_v ? vh : kh).insert((is_v ? vh : kh).end(), rot.begin(), rot.end());
          }
        }
      }
      k_hat.push_back(std::move(kh));
      v_hat.push_back(std::move(vh));
      v_max.push_back(vm);
      k_norm_max.push_back(kn);
    }
    for (auto len : c.qo_lengths) qo_indptr.push_back(qo_indptr.back() + len);
    Activations q = random_activations(rng, c.q_dtype, tokens() * static_cast<std::size_t>(heads() * d_dim));
    q_bits = std::move(q.bits);
    q_values = std::move(q.values);
  }

  PagedKVCacheView view(void* k, void* v, const float* scales) const {
    PagedKVCacheView w;
    w.k_pages = k;
    w.v_pages = v;
    w.k_scale = scales;
    w.v_scale = scales + 1;
    w.num_pages = table.num_pages;
    w.page_size = c.page_size;
    w.num_kv_heads = c.num_kv_heads;
    w.head_dim = c.head_dim;
    w.dtype = c.dtype;
    w.layout = KvLayout::nhd;
    w.scale_mode = c.dtype == KvDtype::nvfp4 ? KvScaleMode::per_tensor : c.scale_mode;
    return w;
  }
  PagedAttentionProblem problem() const {
    PagedAttentionProblem p;
    p.batch_size = static_cast<std::int32_t>(c.kv_lengths.size());
    p.num_qo_heads = heads();
    p.num_kv_heads = c.num_kv_heads;
    p.head_dim = c.head_dim;
    p.page_size = c.page_size;
    p.kv_dtype = c.dtype;
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
          const int kv_head = h / c.group;
          auto at = [&](const std::vector<double>& x) {
            return [&x, kv_head, this](std::int64_t p, int d) {
              return x[(static_cast<std::size_t>(p) * c.num_kv_heads + kv_head) * c.head_dim + d];
            };
          };
          RowOptions opt;
          opt.sm_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
          ref.lse[row] = attend_row(q_values.data() + row * d_size, c.head_dim, 0, position + 1, opt, at(k_hat[b]),
                                    at(v_hat[b]), ref.o.data() + row * d_size);
        }
      }
    }
    return ref;
  }
};

struct RunConfig {
  bool allow_split = false;
  std::int32_t num_sms = 132;
  KvRotation rotation = KvRotation::none;
  bool fused = false;
  const std::vector<std::uint16_t>* q = nullptr;  // other query bits (the two-step path)
};

struct Output {
  Status status;
  std::vector<std::uint16_t> o_bits;
  std::vector<float> o, lse;
  PagedAttentionPlan plan;
};

Output run(const Fixture& f, const RunConfig& rc) {
  auto k = upload(f.k_bytes);
  auto v = upload(f.v_bytes);
  auto scales = upload(std::vector<float>{f.k_scale, f.v_scale});
  auto indptr = upload(f.table.indptr);
  auto indices = upload(f.table.indices);
  auto last = upload(f.table.last_page_len);
  auto qo_indptr = upload(f.qo_indptr);
  auto q = upload(rc.q != nullptr ? *rc.q : f.q_bits);
  auto chunk = upload(std::vector<std::uint16_t>(f.q_bits.size() + 8, 0));
  const std::size_t rows = f.tokens() * static_cast<std::size_t>(f.heads());
  auto o = rt::DeviceBuffer<std::uint16_t>::create(std::max<std::size_t>(f.q_bits.size(), 1));
  auto lse = rt::DeviceBuffer<float>::create(std::max<std::size_t>(rows, 1));
  REQUIRE(o.ok());
  REQUIRE(lse.ok());
  REQUIRE(o->fill_bytes(0xFF).ok());  // poison: every element must be written
  REQUIRE(lse->fill_bytes(0xFF).ok());
  PagedAttentionPlanArguments plan_args{f.problem(), f.qo_indptr, f.table.indptr, f.table.last_page_len};
  plan_args.allow_split = rc.allow_split;
  plan_args.num_sms = rc.num_sms;
  plan_args.ctas_per_sm = 1;
  plan_args.min_chunk_tokens = 128;
  auto bytes = paged_attention_workspace_size(plan_args);
  REQUIRE(bytes.ok());
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*bytes);
  REQUIRE(workspace.ok());
  REQUIRE(workspace->fill_bytes(0xFF).ok());
  auto plan = plan_paged_attention(plan_args, workspace->data(), *bytes, nullptr);
  INFO((plan.ok() ? std::string() : plan.status().to_string()));
  REQUIRE(plan.ok());
  PagedAttentionArguments args;
  args.cache = f.view(k.data(), v.data(), scales.data());
  args.table = kv::PageTableView{indptr.data(), indices.data(), last.data(), nullptr,
                                 static_cast<std::int32_t>(f.c.kv_lengths.size()), f.c.page_size};
  args.qo_indptr = qo_indptr.data();
  args.q = q.data();
  args.o = o->data();
  args.lse = lse->data();
  args.rotation = rc.rotation;
  if (rc.fused) {
    args.chunk_kv.k = chunk.data();
    args.chunk_kv.v = chunk.data();
  }
  Output out;
  out.status = run_paged_attention(args, *plan, workspace->data(), *bytes, nullptr);
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  out.plan = *plan;
  out.o_bits = download(*o, f.q_bits.size());
  for (auto bits : out.o_bits) out.o.push_back(from_activation(f.c.q_dtype, bits));
  out.lse = download(*lse, rows);
  return out;
}

/// rotate_heads of [tokens, heads, D] activation bits.
std::vector<std::uint16_t> rotated(const Fixture& f, const std::vector<std::uint16_t>& bits) {
  auto in = upload(bits);
  RotateHeadsArguments a;
  a.input = in.data();
  a.output = in.data();
  a.dtype = f.c.q_dtype;
  a.num_tokens = static_cast<std::int32_t>(f.tokens());
  a.num_heads = f.heads();
  a.head_dim = f.c.head_dim;
  REQUIRE(rotate_heads(a, nullptr).ok());
  return download(in, bits.size());
}

/// Per element: the tensor-core bound (output and P rounding, against the rotated-back V's
/// spread: P's rounding scales a whole weight, the same in either basis) plus the rounding of
/// the rotated query to the mma type (`q_rel` of each element: every score moves by at most
/// q_rel sm_scale |q| |k|, each normalized weight by twice that), and FP32 rotation sums.
double tolerance(const Fixture& f, std::size_t request, std::size_t row, double want, double q_rel) {
  const auto d = static_cast<std::size_t>(f.c.head_dim);
  double q_norm = 0.0;
  for (std::size_t i = 0; i < d; ++i) q_norm += static_cast<double>(f.q_values[row * d + i]) * f.q_values[row * d + i];
  const double score_shift = (q_rel + 1e-6) * std::sqrt(q_norm) * f.k_norm_max[request] / std::sqrt(static_cast<double>(d));
  const double vm = f.v_max[request];
  return tensor_core_tolerance(f.c.q_dtype, f.c.dtype, want, vm) + 2.2 * score_shift * vm +
         1e-5 * std::sqrt(static_cast<double>(d)) * vm;
}

void check(const Fixture& f, const Output& out, const Reference& ref, double q_rel) {
  INFO(out.status.to_string());
  REQUIRE(out.status.ok());
  const std::size_t heads = static_cast<std::size_t>(f.heads());
  std::vector<std::size_t> request;
  for (std::size_t b = 0; b + 1 < f.qo_indptr.size(); ++b) {
    request.insert(request.end(), static_cast<std::size_t>(f.qo_indptr[b + 1] - f.qo_indptr[b]) * heads, b);
  }
  // The LSE moves with the scores by at most the query rounding's score shift (tolerance's):
  // checked here, then compare_rows checks the elements against the reference (its own fixed
  // LSE bound then sees the kernel's LSE where it is within this one).
  Reference shifted = ref;
  std::size_t lse_bad = 0;
  for (std::size_t row = 0; row < f.tokens() * heads; ++row) {
    const auto d = static_cast<std::size_t>(f.c.head_dim);
    double q_norm = 0.0;
    for (std::size_t i = 0; i < d; ++i) q_norm += static_cast<double>(f.q_values[row * d + i]) * f.q_values[row * d + i];
    const double shift = (q_rel + 1e-6) * std::sqrt(q_norm) * f.k_norm_max[request[row]] / std::sqrt(static_cast<double>(d));
    const double want = ref.lse[row];
    if (std::isinf(want)) continue;  // compare_rows: exactly
    const bool ok = std::fabs(out.lse[row] - want) <= 1e-3 + 1e-5 * std::fabs(want) + shift;
    lse_bad += !ok;
    if (ok) shifted.lse[row] = out.lse[row];
  }
  CHECK(lse_bad == 0);
  const RowComparison r = compare_rows(
      out.o, out.lse, shifted, f.tokens() * heads, f.c.head_dim,
      [&](std::size_t row, double want) { return tolerance(f, request[row], row, want, q_rel); },
      [](std::size_t) { return false; },
      [&](std::size_t row) {
        return "request " + std::to_string(request[row]) + " row " + std::to_string(row) + " (split " +
               std::to_string(out.plan.split_kv) + ")";
      });
  CHECK(r.checked == f.tokens() * heads * static_cast<std::size_t>(f.c.head_dim));
  CHECK(r.mismatches == 0);
}

/// Unit roundoff of the type a rotated query is rounded to before the mma (mma_input_t).
double mma_q_rel(const Case& c) { return c.dtype == KvDtype::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }
double activation_rel(ActivationDtype t) { return t == ActivationDtype::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

const auto bf = ActivationDtype::bf16;
const auto fp = ActivationDtype::fp16;
using R = KvRotation;

}  // namespace

TEST_CASE("paged attention over rotated caches: every element against the FP64 rotated-back reference",
          "[attention][paged][rotation]") {
  auto rng = slimserve_test::make_rng(2541);
  for (const Case& c : std::vector<Case>{
           // decode (GQA 8 / 4), ragged lengths
           {KvDtype::nvfp4, KvScaleMode::per_tensor, 128, 2, 8, 16, bf, R::keys, {1, 15, 16, 17, 300}, {1, 1, 1, 1, 1}},
           {KvDtype::nvfp4, KvScaleMode::per_tensor, 64, 2, 4, 32, fp, R::keys_and_values, {1, 31, 32, 33, 200}, {1, 1, 1, 1, 1}},
           {KvDtype::fp8_e4m3, KvScaleMode::per_tensor, 256, 1, 8, 16, bf, R::keys_and_values, {1, 17, 150}, {1, 1, 1}},
           {KvDtype::bf16, KvScaleMode::none, 128, 2, 4, 16, bf, R::keys_and_values, {1, 15, 16, 17, 260}, {1, 1, 1, 1, 1}},
           // causal prefill chunks (1, page-1, page, page+1, long) over cached prefixes
           {KvDtype::fp8_e4m3, KvScaleMode::per_tensor, 64, 2, 2, 16, fp, R::keys, {9, 40, 16, 17, 260}, {1, 15, 16, 17, 70}},
           {KvDtype::nvfp4, KvScaleMode::per_tensor, 256, 1, 2, 16, bf, R::keys_and_values, {33, 140}, {31, 40}},
           {KvDtype::bf16, KvScaleMode::none, 64, 1, 4, 32, bf, R::keys, {33, 140}, {31, 40}},
       }) {
    INFO(to_string(c.dtype) << " D " << c.head_dim << " group " << c.group << " rotation " << to_string(c.rotation));
    Fixture f(c, rng);
    const Reference ref = f.reference();
    const Output unsplit = run(f, RunConfig{false, 132, c.rotation});
    CHECK_FALSE(unsplit.plan.split_kv);
    check(f, unsplit, ref, mma_q_rel(c));
    const Output split = run(f, RunConfig{true, 4096, c.rotation});  // chunks of 128
    std::int64_t longest = 0;
    for (auto len : c.kv_lengths) longest = std::max(longest, len);
    CHECK(split.plan.split_kv == (longest > 128));
    check(f, split, ref, mma_q_rel(c));

    // The two-step path: rotate_heads(q), attention with no rotation, rotate_heads(o). Its
    // queries are rounded to q's type before the mma (and its output twice): the same bound
    // with that rounding; and the two outputs agree within the sum of both bounds.
    RunConfig two_step{true, 4096, R::none};
    const std::vector<std::uint16_t> q_rot = rotated(f, f.q_bits);
    two_step.q = &q_rot;
    Output old = run(f, two_step);
    REQUIRE(old.status.ok());
    if (rotates_values(c.rotation)) {
      old.o_bits = rotated(f, old.o_bits);
      old.o.clear();
      for (auto bits : old.o_bits) old.o.push_back(from_activation(c.q_dtype, bits));
    }
    const double old_rel = std::max(mma_q_rel(c), activation_rel(c.q_dtype)) + 2.0 * activation_rel(c.q_dtype);
    std::size_t differ = 0;
    const std::size_t heads = static_cast<std::size_t>(f.heads());
    std::size_t request = 0;
    for (std::size_t row = 0; row < f.tokens() * heads; ++row) {
      while (row >= static_cast<std::size_t>(f.qo_indptr[request + 1]) * heads) ++request;
      for (std::size_t d = 0; d < static_cast<std::size_t>(c.head_dim); ++d) {
        const std::size_t i = row * static_cast<std::size_t>(c.head_dim) + d;
        const double want = ref.o[i];
        const double tol = tolerance(f, request, row, want, mma_q_rel(c)) + tolerance(f, request, row, want, old_rel) +
                           2.0 * activation_rel(c.q_dtype) * std::fabs(want);
        differ += !(std::fabs(static_cast<double>(split.o[i]) - old.o[i]) <= tol);
      }
    }
    CHECK(differ == 0);
  }
}

TEST_CASE("paged attention over rotated caches: bad rotation, head_dim and fused prefill are refused, nothing written",
          "[attention][paged][rotation]") {
  auto rng = slimserve_test::make_rng(2542);
  const Fixture f(Case{KvDtype::fp8_e4m3, KvScaleMode::per_tensor, 128, 1, 2, 16, bf, R::keys, {20, 40}, {1, 3}}, rng);
  auto refused = [&](const Output& out, StatusCode code, const char* words) {
    CHECK(out.status.code() == code);
    CHECK(out.status.to_string().find(words) != std::string::npos);
    std::size_t written = 0;
    for (float x : out.o) written += !std::isnan(x);
    for (float x : out.lse) written += !std::isnan(x);
    CHECK(written == 0);
  };
  refused(run(f, RunConfig{false, 132, static_cast<KvRotation>(3)}), StatusCode::invalid_argument, "rotation");
  RunConfig fused{false, 132, R::keys};
  fused.fused = true;
  refused(run(f, fused), StatusCode::unsupported, "rotation keys has no fused prefill");
  // head_dim 96 and 192 have no rotation (the same rule as append_kv's).
  for (const int d_dim : {96, 192}) {
    INFO("D " << d_dim);
    Fixture g(Case{KvDtype::bf16, KvScaleMode::none, d_dim, 1, 2, 16, bf, R::none, {20, 40}, {1, 3}}, rng);
    g.c.rotation = R::keys_and_values;
    refused(run(g, RunConfig{false, 132, R::keys_and_values}), StatusCode::unsupported,
            "rotation keys_and_values needs head_dim 64, 128 or 256");
  }
}
