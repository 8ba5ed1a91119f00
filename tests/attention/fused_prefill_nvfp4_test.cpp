// Fused prefill over NVFP4 pages: the chunk attends to its own K/V straight from the BF16/FP16
// inputs (staged in the NVFP4 fragment order) and quantizes them into its slots in the same
// launch.
//   - The cache bytes (codes and E4M3 block scales, every page, holes included) equal those of
//     the separate mode (append_kv with append_indptr = qo_indptr) byte for byte, and the host
//     codec's (formats/nvfp4.hpp); bytes outside the chunk's head vectors stay as they were
//     (the 0xFF poison of holes and unwritten slots, the stored prefix).
//   - Every output element and LSE against an FP64 reference built from the stored codes for
//     the prefix and from exactly the input values for the chunk; the separate mode, which
//     attends to the chunk's codes, misses it (so the comparison can fail).
// head_dim 64/128/192/256, GQA 8/4/1, NHD and HND, chunks of 1, page-1, page, page+1 and long
// on prefixes that end mid-page (and none), shuffled pages with holes, poisoned outputs, split
// and unsplit plans; an invalid device-held tensor scale gives NaN and the append's NaN
// blocks; a NaN chunk input stays NaN in exactly its readers' outputs; bad arguments are
// refused before launch, naming the argument, nothing written.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_test_support.hpp"
#include "nvfp4_test_cache.hpp"
#include "support/build_flavour.hpp"
#include "slimserve/attention/append.hpp"
#include "slimserve/attention/paged_attention.hpp"

using namespace attn_test;

namespace {

struct Nvfp4FusedCase {
  KvLayout layout;
  int head_dim, num_kv_heads, group, page_size;
  ActivationDtype q_dtype;
  std::vector<std::int64_t> prefix;  // cached tokens before the chunk
  std::vector<std::int32_t> chunk;   // the chunk (query tokens and new K/V)
};

struct Fixture {
  Nvfp4FusedCase c;
  HostPageTable table;
  Nvfp4HostCache cache;     // the prefix stored, everything else 0xFF
  Nvfp4HostCache expected;  // and the chunk stored by the host codec
  std::vector<std::int32_t> qo_indptr{0};
  std::vector<std::uint16_t> q_bits, k_bits, v_bits;  // q [T, H_qo, D]; k/v [T, H_kv, D]
  std::vector<float> q_values, k_values, v_values;
  std::vector<double> v_max;  // per request and KV head

  static std::vector<std::int64_t> lengths(const Nvfp4FusedCase& c) {
    std::vector<std::int64_t> out;
    for (std::size_t b = 0; b < c.prefix.size(); ++b) out.push_back(c.prefix[b] + c.chunk[b]);
    return out;
  }
  int page_of(std::size_t b, std::int64_t position) const {
    return table.indices[static_cast<std::size_t>(table.indptr[b] + position / c.page_size)];
  }

  Fixture(const Nvfp4FusedCase& fc, std::mt19937_64& rng)
      : c(fc), table(make_page_table(lengths(fc), fc.page_size, rng, false)),
        cache(fc.layout, table.num_pages, fc.page_size, fc.num_kv_heads, fc.head_dim), expected(cache) {
    const auto d_size = static_cast<std::size_t>(c.head_dim);
    for (auto len : c.chunk) qo_indptr.push_back(qo_indptr.back() + len);
    // The chunk's K/V in the activation type (what the kernel reads and the reference uses).
    std::vector<float> row(d_size);
    float k_amax = 0.0f, v_amax = 0.0f;
    for (std::size_t t = 0; t < tokens(); ++t) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        for (int is_v = 0; is_v < 2; ++is_v) {
          realistic_row(rng, c.head_dim, row.data(), is_v ? 0.5f : 1.0f);
          for (float x : row) {
            (is_v ? v_bits : k_bits).push_back(to_activation(c.q_dtype, x));
            const float value = from_activation(c.q_dtype, (is_v ? v_bits : k_bits).back());
            (is_v ? v_values : k_values).push_back(value);
            float& amax = is_v ? v_amax : k_amax;
            amax = std::max(amax, std::fabs(value));
          }
        }
      }
    }
    // The prefix rows; tensor scales from the amax of prefix and chunk (the same cache holds both).
    struct Row { int page, slot, head; std::vector<float> k, v; };
    std::vector<Row> rows;
    for (std::size_t b = 0; b < c.prefix.size(); ++b) {
      for (std::int64_t p = 0; p < c.prefix[b]; ++p) {
        for (int h = 0; h < c.num_kv_heads; ++h) {
          Row r{page_of(b, p), static_cast<int>(p % c.page_size), h, std::vector<float>(d_size), std::vector<float>(d_size)};
          realistic_row(rng, c.head_dim, r.k.data(), 1.0f);
          realistic_row(rng, c.head_dim, r.v.data(), 0.5f);
          for (std::size_t d = 0; d < d_size; ++d) {
            k_amax = std::max(k_amax, std::fabs(r.k[d]));
            v_amax = std::max(v_amax, std::fabs(r.v[d]));
          }
          rows.push_back(std::move(r));
        }
      }
    }
    cache.k_scale = expected.k_scale = k_amax / 2688.0f;
    cache.v_scale = expected.v_scale = v_amax / 2688.0f;
    for (const Row& r : rows) {
      cache.store(false, r.page, r.slot, r.head, r.k.data());
      cache.store(true, r.page, r.slot, r.head, r.v.data());
    }
    expected.k = cache.k;
    expected.v = cache.v;
    for (std::size_t b = 0; b < c.prefix.size(); ++b) {
      for (std::int32_t i = 0; i < c.chunk[b]; ++i) {
        const std::int64_t position = c.prefix[b] + i;
        for (int h = 0; h < c.num_kv_heads; ++h) {
          const std::size_t at = input_at(static_cast<std::size_t>(qo_indptr[b] + i), h, 0);
          expected.store(false, page_of(b, position), static_cast<int>(position % c.page_size), h, k_values.data() + at);
          expected.store(true, page_of(b, position), static_cast<int>(position % c.page_size), h, v_values.data() + at);
        }
      }
    }
    Activations q = random_activations(rng, c.q_dtype, tokens() * static_cast<std::size_t>(heads() * c.head_dim));
    q_bits = std::move(q.bits);
    q_values = std::move(q.values);
    for (std::size_t b = 0; b < c.prefix.size(); ++b) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        v_max.push_back(max_abs_value(c.prefix[b] + c.chunk[b], c.head_dim,
                                      [&](std::int64_t p, int d) { return value(true, b, p, h, d); }));
      }
    }
  }
  int heads() const { return c.num_kv_heads * c.group; }
  std::size_t tokens() const { return static_cast<std::size_t>(qo_indptr.back()); }
  std::size_t input_at(std::size_t token, int head, int d) const {
    return (token * static_cast<std::size_t>(c.num_kv_heads) + static_cast<std::size_t>(head)) *
               static_cast<std::size_t>(c.head_dim) + static_cast<std::size_t>(d);
  }
  /// What attention uses at `position` of request b: the stored prefix, or the chunk's input.
  double value(bool is_v, std::size_t b, std::int64_t position, int head, int d) const {
    if (position < c.prefix[b]) {
      return cache.real(is_v, page_of(b, position), static_cast<int>(position % c.page_size), head, d);
    }
    const std::size_t at = input_at(static_cast<std::size_t>(qo_indptr[b] + (position - c.prefix[b])), head, d);
    return static_cast<double>(is_v ? v_values[at] : k_values[at]);
  }
  PagedAttentionProblem problem() const {
    PagedAttentionProblem p;
    p.batch_size = static_cast<std::int32_t>(c.prefix.size());
    p.num_qo_heads = heads();
    p.num_kv_heads = c.num_kv_heads;
    p.head_dim = c.head_dim;
    p.page_size = c.page_size;
    p.kv_dtype = KvDtype::nvfp4;
    p.q_dtype = c.q_dtype;
    p.causal = true;
    return p;
  }
  /// FP64 causal attention: the prefix from the stored codes, the chunk from its inputs.
  Reference reference() const {
    const auto d_size = static_cast<std::size_t>(c.head_dim);
    Reference ref;
    ref.o.assign(tokens() * static_cast<std::size_t>(heads()) * d_size, 0.0);
    ref.lse.assign(tokens() * static_cast<std::size_t>(heads()), -INFINITY);
    const RowOptions opt{1.0 / std::sqrt(static_cast<double>(c.head_dim))};
    for (std::size_t b = 0; b < c.prefix.size(); ++b) {
      for (std::int32_t i = 0; i < c.chunk[b]; ++i) {
        const std::int64_t position = c.prefix[b] + i;
        const auto token = static_cast<std::size_t>(qo_indptr[b] + i);
        for (int h = 0; h < heads(); ++h) {
          const std::size_t row = token * static_cast<std::size_t>(heads()) + static_cast<std::size_t>(h);
          const int kv_head = h / c.group;
          ref.lse[row] = attend_row(
              q_values.data() + row * d_size, c.head_dim, 0, position + 1, opt,
              [&](std::int64_t p, int d) { return value(false, b, p, kv_head, d); },
              [&](std::int64_t p, int d) { return value(true, b, p, kv_head, d); }, ref.o.data() + row * d_size);
        }
      }
    }
    return ref;
  }
};

struct RunConfig {
  bool fused = true;
  bool allow_split = false;
  float k_scale_override = 0.0f;  // != 0: the device-held tensor scales
  float v_scale_override = 0.0f;
};

struct Output {
  Status status;
  std::vector<float> o, lse;
  std::vector<unsigned char> k, v;  // the cache after the run
  PagedAttentionPlan plan;
};

/// Fused: one run_paged_attention with chunk_kv. Separate: append_kv (chunk form), then
/// run_paged_attention over the pages. `mutate` may break the arguments (preflight tests).
template <class Mutate>
Output run(const Fixture& f, const RunConfig& rc, Mutate&& mutate) {
  auto k_pages = upload(f.cache.k);
  auto v_pages = upload(f.cache.v);
  auto scales = upload(std::vector<float>{rc.k_scale_override != 0.0f ? rc.k_scale_override : f.cache.k_scale,
                                          rc.v_scale_override != 0.0f ? rc.v_scale_override : f.cache.v_scale});
  auto indptr = upload(f.table.indptr);
  auto indices = upload(f.table.indices);
  auto last = upload(f.table.last_page_len);
  auto qo_indptr = upload(f.qo_indptr);
  auto q = upload(f.q_bits);
  auto k_new = upload(f.k_bits.empty() ? std::vector<std::uint16_t>(8, 0) : f.k_bits);
  auto v_new = upload(f.v_bits.empty() ? std::vector<std::uint16_t>(8, 0) : f.v_bits);
  const std::size_t heads = static_cast<std::size_t>(f.heads());
  auto o = rt::DeviceBuffer<std::uint16_t>::create(std::max<std::size_t>(f.q_bits.size(), 1));
  auto lse = rt::DeviceBuffer<float>::create(std::max<std::size_t>(f.tokens() * heads, 1));
  REQUIRE(o.ok());
  REQUIRE(lse.ok());
  REQUIRE(o->fill_bytes(0xFF).ok());  // poison: every element must be written
  REQUIRE(lse->fill_bytes(0xFF).ok());

  PagedAttentionPlanArguments plan_args{f.problem(), f.qo_indptr, f.table.indptr, f.table.last_page_len};
  plan_args.allow_split = rc.allow_split;
  plan_args.num_sms = rc.allow_split ? 4096 : 132;
  plan_args.ctas_per_sm = 1;
  plan_args.min_chunk_tokens = 128;
  auto bytes = paged_attention_workspace_size(plan_args);
  REQUIRE(bytes.ok());
  auto workspace = rt::DeviceBuffer<unsigned char>::create(*bytes);
  REQUIRE(workspace.ok());
  REQUIRE(workspace->fill_bytes(0xFF).ok());
  auto plan = plan_paged_attention(plan_args, workspace->data(), *bytes, nullptr);
  REQUIRE(plan.ok());

  PagedAttentionArguments args;
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
  const auto batch = static_cast<std::int32_t>(f.c.prefix.size());
  args.table = kv::PageTableView{indptr.data(), indices.data(), last.data(), nullptr, batch, f.c.page_size};
  args.qo_indptr = qo_indptr.data();
  args.q = q.data();
  args.o = o->data();
  args.lse = lse->data();
  if (rc.fused) {
    args.chunk_kv = PagedAttentionChunkKv{k_new.data(), v_new.data(), 0, 0};
  } else {
    AppendArguments append;
    append.cache = args.cache;
    append.table = args.table;
    append.k_new = k_new.data();
    append.v_new = v_new.data();
    append.input_dtype = f.c.q_dtype;
    append.num_tokens = static_cast<std::int32_t>(f.tokens());
    append.append_indptr = qo_indptr.data();
    const Status s = append_kv(append, nullptr);
    INFO(s.to_string());
    REQUIRE(s.ok());
  }
  mutate(args);
  Output out;
  static_cast<void>(out.status = run_paged_attention(args, *plan, workspace->data(), *bytes, nullptr));
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  out.plan = *plan;
  for (auto bits : download(*o, f.q_bits.size())) out.o.push_back(from_activation(f.c.q_dtype, bits));
  out.lse = download(*lse, f.tokens() * heads);
  out.k = download(k_pages, f.cache.k.size());
  out.v = download(v_pages, f.cache.v.size());
  return out;
}
Output run(const Fixture& f, const RunConfig& rc) {
  return run(f, rc, [](PagedAttentionArguments&) {});
}

std::size_t count_mismatches(const Fixture& f, const Output& out, const Reference& ref, bool print) {
  const std::size_t heads = static_cast<std::size_t>(f.heads());
  std::vector<std::size_t> request;
  for (std::size_t b = 0; b < f.c.prefix.size(); ++b) {
    request.insert(request.end(), static_cast<std::size_t>(f.c.chunk[b]) * heads, b);
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
      },
      print);
  CHECK(r.checked > 0);
  return r.mismatches;
}

/// Bytes of the chunk's head vectors (K and V pages share the geometry).
std::vector<bool> chunk_vector_bytes(const Fixture& f) {
  std::vector<bool> mask(f.cache.k.size(), false);
  for (std::size_t b = 0; b < f.c.prefix.size(); ++b) {
    for (std::int32_t i = 0; i < f.c.chunk[b]; ++i) {
      const std::int64_t position = f.c.prefix[b] + i;
      for (int h = 0; h < f.c.num_kv_heads; ++h) {
        const std::size_t at = f.cache.vector_at(f.page_of(b, position), static_cast<int>(position % f.c.page_size), h);
        std::fill_n(mask.begin() + static_cast<std::ptrdiff_t>(at), f.cache.vector_bytes(), true);
      }
    }
  }
  return mask;
}

void check_fused(const Fixture& f) {
  const Reference ref = f.reference();
  const Output separate = run(f, RunConfig{false});
  REQUIRE(separate.status.ok());
  const std::vector<bool> chunk_bytes = chunk_vector_bytes(f);
  for (bool split : {false, true}) {
    const Output fused = run(f, RunConfig{true, split});
    INFO(fused.status.to_string());
    REQUIRE(fused.status.ok());
    CHECK(fused.k == separate.k);  // append_kv's bytes, every page
    CHECK(fused.v == separate.v);
    CHECK(fused.k == f.expected.k);  // the host codec's
    CHECK(fused.v == f.expected.v);
    std::size_t outside_changed = 0, inside_changed = 0;
    for (std::size_t i = 0; i < chunk_bytes.size(); ++i) {
      const bool changed = fused.k[i] != f.cache.k[i] || fused.v[i] != f.cache.v[i];
      (chunk_bytes[i] ? inside_changed : outside_changed) += changed;
    }
    CHECK(outside_changed == 0);
    CHECK(inside_changed > 0);
    CHECK(count_mismatches(f, fused, ref, true) == 0);
  }
  // The separate mode attends to the chunk's codes: the reference tells the two apart.
  CHECK(count_mismatches(f, separate, ref, false) > 0);
}

const auto bf = ActivationDtype::bf16;
const auto fp = ActivationDtype::fp16;

}  // namespace

TEST_CASE("fused prefill over NVFP4 pages: head_dim 64/128/192/256, GQA 8/4/1, ragged chunks on mid-page prefixes",
          "[attention][fused][nvfp4]") {
  auto rng = slimserve_test::make_rng(1111);
  for (Nvfp4FusedCase c : std::vector<Nvfp4FusedCase>{
           {KvLayout::nhd, 128, 2, 4, 16, bf, {5, 21, 3, 0, 37}, {1, 15, 16, 17, 150}},
           {KvLayout::hnd, 64, 1, 8, 16, fp, {9, 0, 30, 16}, {17, 16, 1, 70}},
           {KvLayout::nhd, 256, 2, 1, 16, bf, {13, 0, 2}, {17, 40, 15}},
           {KvLayout::hnd, 192, 1, 4, 32, fp, {33, 3, 0}, {31, 40, 33}},
           {KvLayout::nhd, 64, 3, 1, 32, bf, {3, 33, 0, 40}, {31, 32, 33, 1}},
           {KvLayout::hnd, 128, 1, 8, 16, fp, {0, 17}, {130, 16}},
       }) {
    if (slimserve_test::sanitizer_build) {
      for (std::int32_t& n : c.chunk) n = std::min(n, 3 * c.page_size + 5);
    }
    INFO("D " << c.head_dim << " group " << c.group << " layout " << static_cast<int>(c.layout));
    Fixture f(c, rng);
    check_fused(f);
  }
}

TEST_CASE("fused prefill over NVFP4 pages: an invalid device-held tensor scale gives NaN and the append's NaN blocks",
          "[attention][fused][nvfp4]") {
  auto rng = slimserve_test::make_rng(1112);
  const Fixture f({KvLayout::nhd, 128, 1, 4, 16, bf, {5, 20}, {17, 3}}, rng);
  for (const float bad : {-1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                          nvfp4_above_domain_scale}) {
    for (bool on_v : {false, true}) {
      INFO("scale " << bad << (on_v ? " (V)" : " (K)"));
      RunConfig fused_rc, separate_rc;
      separate_rc.fused = false;
      (on_v ? fused_rc.v_scale_override : fused_rc.k_scale_override) = bad;
      (on_v ? separate_rc.v_scale_override : separate_rc.k_scale_override) = bad;
      const Output separate = run(f, separate_rc);
      const Output fused = run(f, fused_rc);
      REQUIRE(fused.status.ok());
      CHECK(fused.k == separate.k);
      CHECK(fused.v == separate.v);
      std::size_t not_nan = 0;  // NaN, not merely non-finite: the documented rule
      for (float x : fused.o) not_nan += !std::isnan(x);
      CHECK(not_nan == 0);
      // The chunk's blocks of the bad tensor: NaN scales (0x7F), signed-zero codes.
      const std::vector<bool> chunk_bytes = chunk_vector_bytes(f);
      const std::vector<unsigned char>& written = on_v ? fused.v : fused.k;
      const std::size_t vector = f.cache.vector_bytes();
      std::size_t wrong = 0, seen = 0;
      for (std::size_t at = 0; at < written.size(); at += vector) {
        if (!chunk_bytes[at]) continue;
        ++seen;
        for (std::size_t i = 0; i < vector; ++i) {
          const bool code = i < static_cast<std::size_t>(f.c.head_dim / 2);  // signed zeros: 0x0 or 0x8
          wrong += code ? (written[at + i] & 0x77) != 0 : written[at + i] != nvfp4_nan_scale_code;
        }
      }
      CHECK(seen == static_cast<std::size_t>(17 + 3));
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("fused prefill over NVFP4 pages: a NaN in the chunk's K or V input stays NaN in exactly its readers' outputs",
          "[attention][fused][nvfp4]") {
  // The chunk attends to its own inputs, staged as fp16 operands: the staging saturates to the
  // fp16 range but keeps NaN (docs/attention.md "NaN in the cache"). Request 1 has no prefix;
  // its first chunk token's input for KV head 0, element 37, is a BF16 NaN, so every row of that
  // head's query group in request 1 reads it (causal: each row sees token 0).
  //   - In K: those rows are NaN in every element, lse NaN unsplit and -inf split.
  //   - In V: only their column 37 is NaN; their other elements and lse are the clean run's.
  // Every other row is bit for bit the clean run's.
  auto rng = slimserve_test::make_rng(1114);
  const Fixture clean({KvLayout::nhd, 128, 2, 4, 16, bf, {40, 0}, {17, 130}}, rng);
  const std::size_t d = static_cast<std::size_t>(clean.c.head_dim);
  const std::size_t heads = static_cast<std::size_t>(clean.heads());
  const auto first_token = static_cast<std::size_t>(clean.qo_indptr[1]);
  constexpr std::size_t nan_element = 37;
  std::vector<bool> reader(clean.tokens() * heads, false);
  for (std::size_t t = first_token; t < clean.tokens(); ++t) {
    for (int g = 0; g < clean.c.group; ++g) reader[t * heads + static_cast<std::size_t>(g)] = true;  // KV head 0
  }
  const auto differs = [](float a, float b) { return std::memcmp(&a, &b, sizeof(float)) != 0; };
  for (const bool in_v : {false, true}) {
    Fixture poisoned = clean;
    (in_v ? poisoned.v_bits : poisoned.k_bits)[clean.input_at(first_token, 0, 0) + nan_element] = 0x7FC0;
    for (const bool split : {false, true}) {
      INFO((in_v ? "V" : "K") << (split ? ", split" : ", unsplit"));
      const Output base = run(clean, RunConfig{true, split});
      const Output out = run(poisoned, RunConfig{true, split});
      REQUIRE(base.status.ok());
      REQUIRE(out.status.ok());
      CHECK(out.plan.split_kv == split);
      if (!in_v) {
        const auto [wrong_nan, wrong_lse, wrong_other, nan_rows] =
            tally_nan_rows(reader, d, split, out.o, out.lse, base.o, base.lse);
        CHECK(nan_rows == static_cast<std::size_t>(130 * clean.c.group));
        CHECK(nan_rows < reader.size());
        CHECK(wrong_nan == 0);
        CHECK(wrong_lse == 0);
        CHECK(wrong_other == 0);
        continue;
      }
      std::size_t wrong_nan = 0, wrong_other = 0;
      for (std::size_t row = 0; row < reader.size(); ++row) {
        for (std::size_t e = 0; e < d; ++e) {
          const std::size_t at = row * d + e;
          if (reader[row] && e == nan_element) {
            wrong_nan += !std::isnan(out.o[at]);
          } else {
            wrong_other += differs(out.o[at], base.o[at]);
          }
        }
        wrong_other += differs(out.lse[row], base.lse[row]);
      }
      CHECK(wrong_nan == 0);
      CHECK(wrong_other == 0);
    }
  }
}

TEST_CASE("fused prefill over NVFP4 pages: bad arguments are refused before launch, naming them, nothing written",
          "[attention][fused][nvfp4]") {
  auto rng = slimserve_test::make_rng(1113);
  const Fixture f({KvLayout::nhd, 64, 1, 2, 16, bf, {3}, {20}}, rng);
  const auto refused = [&](auto mutate, const char* what, std::vector<const char*> names) {
    INFO(what);
    const Output out = run(f, RunConfig{}, mutate);
    CHECK_FALSE(out.status.ok());
    for (const char* name : names) CHECK(out.status.to_string().find(name) != std::string::npos);
    CHECK(out.k == f.cache.k);  // no slot written
    CHECK(out.v == f.cache.v);
    for (float x : out.lse) CHECK(std::isnan(x));  // the 0xFF poison is still there
    std::printf("  refused (%s): %s\n", what, out.status.to_string().c_str());
  };
  refused([](PagedAttentionArguments& a) { a.chunk_kv.v = nullptr; }, "no V", {"chunk_kv.v"});
  refused([](PagedAttentionArguments& a) { a.chunk_kv.k = static_cast<const char*>(a.chunk_kv.k) + 2; },
          "misaligned K", {"chunk_kv.k"});
  refused([](PagedAttentionArguments& a) { a.chunk_kv.token_stride = 12; }, "token stride", {"chunk_kv"});
  // A combined K/V allocation (page stride of two pages, in bytes): fine for paged attention,
  // not for the fused append, whose page store assumes packed pages; the refusal names the
  // page stride (not the format, which is taken).
  const auto page_bytes = static_cast<std::int64_t>(f.cache.k.size()) / f.cache.num_pages;
  refused([&](PagedAttentionArguments& a) { a.cache.page_stride = 2 * page_bytes; }, "strided pages",
          {"fused prefill", "packed pages", "page_stride"});
  // The chunk arguments are checked before the cache's geometry.
  refused(
      [&](PagedAttentionArguments& a) {
        a.cache.page_stride = 2 * page_bytes;
        a.chunk_kv.k = nullptr;
      },
      "strided pages and no K", {"chunk_kv.k"});
}
