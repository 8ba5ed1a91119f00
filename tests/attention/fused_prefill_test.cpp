// Fused (mixed-dtype) prefill: the chunk attends to its own K/V straight from the BF16/FP16
// inputs and writes them into the FP8/BF16/FP16 pages in the same launch.
//   - The cache bytes (codes and per-token scales, every page, holes included) equal those of
//     the separate mode (append_kv with append_indptr = qo_indptr), byte for byte.
//   - Every output element and LSE against an FP64 reference built from the quantized cache
//     for the prefix and from exactly the input values for the chunk.
// Chunks of 1, page-1, page, page+1 and long on prefixes that end mid-page (and none);
// shuffled pages with holes; FP8 e4m3/e5m2 x per-tensor/per-token, BF16, FP16; strided K/V
// inputs; split and unsplit; aborted requests write and read nothing; bad inputs are refused
// before launch with nothing written.
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
#include "support/build_flavour.hpp"
#include "slimserve/attention/append.hpp"
#include "slimserve/attention/paged_attention.hpp"

using namespace attn_test;

namespace {

struct FusedCase {
  KvDtype dtype;
  KvLayout layout;
  KvScaleMode scale_mode;
  int head_dim;
  int num_kv_heads;
  int group;
  int page_size;
  ActivationDtype q_dtype;
  std::vector<std::int64_t> prefix;  // cached tokens before the chunk
  std::vector<std::int32_t> chunk;   // the chunk (query tokens and new K/V)
};

struct Fixture {
  FusedCase c;
  HostPageTable table;
  HostCache cache;  // the prefix stored, the chunk's slots poison
  std::vector<std::int32_t> qo_indptr{0};
  std::vector<std::uint16_t> q_bits, k_bits, v_bits;  // q [T, H_qo, D]; k/v [T, H_kv, D]
  std::vector<float> q_values, k_values, v_values;
  std::vector<double> v_max;  // per request and KV head

  static std::vector<std::int64_t> lengths(const FusedCase& c) {
    std::vector<std::int64_t> out;
    for (std::size_t b = 0; b < c.prefix.size(); ++b) out.push_back(c.prefix[b] + c.chunk[b]);
    return out;
  }

  Fixture(const FusedCase& fc, std::mt19937_64& rng)
      : c(fc), table(make_page_table(lengths(fc), fc.page_size, rng, false)),
        cache(CacheShape{fc.dtype, fc.layout, fc.scale_mode, table.num_pages, fc.page_size,
                         fc.num_kv_heads, fc.head_dim}) {
    const int d_dim = c.head_dim;
    for (auto len : c.chunk) qo_indptr.push_back(qo_indptr.back() + len);
    // The chunk's K/V in the activation type (what the kernel reads and the reference uses).
    std::vector<float> row(static_cast<std::size_t>(d_dim));
    AlsoHeld chunk_amax;
    for (std::size_t t = 0; t < tokens(); ++t) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        for (int is_v = 0; is_v < 2; ++is_v) {
          realistic_row(rng, d_dim, row.data(), is_v ? 0.5f : 1.0f);
          for (float x : row) {
            auto& bits = is_v ? v_bits : k_bits;
            auto& values = is_v ? v_values : k_values;
            bits.push_back(to_activation(c.q_dtype, x));
            values.push_back(from_activation(c.q_dtype, bits.back()));
            float& amax = is_v ? chunk_amax.v_amax : chunk_amax.k_amax;
            amax = std::max(amax, std::fabs(values.back()));
          }
        }
      }
    }
    // The prefix, quantized into its slots (the chunk's slots keep the poison); per-tensor
    // scales also cover the chunk, which the same cache stores.
    fill_cache(cache, table, c.prefix, rng, 1.0f, chunk_amax);
    Activations q = random_activations(rng, c.q_dtype, tokens() * static_cast<std::size_t>(num_qo_heads() * d_dim));
    q_bits = std::move(q.bits);
    q_values = std::move(q.values);
    for (std::size_t b = 0; b < c.prefix.size(); ++b) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        v_max.push_back(max_abs_value(c.prefix[b] + c.chunk[b], d_dim,
                                      [&](std::int64_t p, int d) { return value(true, b, p, h, d); }));
      }
    }
  }
  int num_qo_heads() const { return c.num_kv_heads * c.group; }
  std::size_t tokens() const { return static_cast<std::size_t>(qo_indptr.back()); }
  /// What attention uses at `position` of request b: the stored prefix, or the chunk's input.
  double value(bool is_v, std::size_t b, std::int64_t position, int head, int d) const {
    if (position < c.prefix[b]) {
      const auto page = table.indices[static_cast<std::size_t>(table.indptr[b] + position / c.page_size)];
      return cache.real(is_v, page, static_cast<int>(position % c.page_size), head, d);
    }
    const std::size_t token = static_cast<std::size_t>(qo_indptr[b] + (position - c.prefix[b]));
    const std::size_t i = (token * static_cast<std::size_t>(c.num_kv_heads) + static_cast<std::size_t>(head)) *
                              static_cast<std::size_t>(c.head_dim) + static_cast<std::size_t>(d);
    return static_cast<double>(is_v ? v_values[i] : k_values[i]);
  }
  PagedAttentionProblem problem() const {
    PagedAttentionProblem p;
    p.batch_size = static_cast<std::int32_t>(c.prefix.size());
    p.num_qo_heads = num_qo_heads();
    p.num_kv_heads = c.num_kv_heads;
    p.head_dim = c.head_dim;
    p.page_size = c.page_size;
    p.kv_dtype = c.dtype;
    p.q_dtype = c.q_dtype;
    return p;
  }
};

/// FP64 causal attention: the prefix from the stored cache, the chunk from its inputs.
Reference reference(const Fixture& f) {
  const int d_dim = f.c.head_dim;
  const int heads = f.num_qo_heads();
  const std::size_t d_size = static_cast<std::size_t>(d_dim);
  Reference ref;
  ref.o.assign(f.tokens() * static_cast<std::size_t>(heads * d_dim), 0.0);
  ref.lse.assign(f.tokens() * static_cast<std::size_t>(heads), -INFINITY);
  const RowOptions opt{1.0 / std::sqrt(static_cast<double>(d_dim))};
  for (std::size_t b = 0; b < f.c.prefix.size(); ++b) {
    for (std::int32_t i = 0; i < f.c.chunk[b]; ++i) {
      const std::int64_t position = f.c.prefix[b] + i;
      const std::size_t token = static_cast<std::size_t>(f.qo_indptr[b] + i);
      for (int h = 0; h < heads; ++h) {
        const std::size_t row = token * static_cast<std::size_t>(heads) + static_cast<std::size_t>(h);
        const int kv_head = h / f.c.group;
        ref.lse[row] = attend_row(
            f.q_values.data() + row * d_size, d_dim, 0, position + 1, opt,
            [&](std::int64_t p, int d) { return f.value(false, b, p, kv_head, d); },
            [&](std::int64_t p, int d) { return f.value(true, b, p, kv_head, d); }, ref.o.data() + row * d_size);
      }
    }
  }
  return ref;
}

struct RunConfig {
  bool fused = true;
  bool allow_split = false;
  const std::vector<kv::RequestStatus>* status = nullptr;
  std::int64_t kv_token_stride = 0, kv_head_stride = 0;  // elements; 0 = packed
};

struct Output {
  std::vector<float> o, lse;
  std::vector<unsigned char> k, v;  // the cache after the run
  std::vector<float> k_token_scale, v_token_scale;
  PagedAttentionPlan plan;
  Status status;
};

struct Inputs {
  rt::DeviceBuffer<std::uint16_t> k, v;
};

/// The chunk's K/V on the device, packed or strided (padding poison).
Inputs upload_chunk(const Fixture& f, std::int64_t token_stride, std::int64_t head_stride) {
  const std::size_t d_dim = static_cast<std::size_t>(f.c.head_dim);
  const std::size_t kv_heads = static_cast<std::size_t>(f.c.num_kv_heads);
  const std::size_t hs = head_stride ? static_cast<std::size_t>(head_stride) : d_dim;
  const std::size_t ts = token_stride ? static_cast<std::size_t>(token_stride) : kv_heads * d_dim;
  std::vector<std::uint16_t> k(std::max<std::size_t>(f.tokens(), 1) * ts, 0x7FC1), v = k;
  for (std::size_t t = 0; t < f.tokens(); ++t) {
    for (std::size_t h = 0; h < kv_heads; ++h) {
      for (std::size_t d = 0; d < d_dim; ++d) {
        k[t * ts + h * hs + d] = f.k_bits[(t * kv_heads + h) * d_dim + d];
        v[t * ts + h * hs + d] = f.v_bits[(t * kv_heads + h) * d_dim + d];
      }
    }
  }
  return {upload(k), upload(v)};
}

/// Fused: one run_paged_attention with chunk_kv. Separate: append_kv (chunk form), then
/// run_paged_attention over the pages. `mutate` may break the arguments (preflight tests).
template <class Mutate>
Output run(const Fixture& f, const RunConfig& rc, Mutate&& mutate) {
  DeviceCache cache(f.cache);
  auto indptr = upload(f.table.indptr);
  auto indices = upload(f.table.indices);
  auto last = upload(f.table.last_page_len);
  auto qo_indptr = upload(f.qo_indptr);
  auto q = upload(f.q_bits);
  Inputs chunk = upload_chunk(f, rc.kv_token_stride, rc.kv_head_stride);
  const std::size_t heads = static_cast<std::size_t>(f.num_qo_heads());
  auto o = rt::DeviceBuffer<std::uint16_t>::create(std::max<std::size_t>(f.q_bits.size(), 1));
  auto lse = rt::DeviceBuffer<float>::create(std::max<std::size_t>(f.tokens() * heads, 1));
  REQUIRE(o.ok());
  REQUIRE(lse.ok());
  REQUIRE(o->fill_bytes(0xFF).ok());
  REQUIRE(lse->fill_bytes(0xFF).ok());
  rt::DeviceBuffer<kv::RequestStatus> status_device;
  if (rc.status != nullptr) status_device = upload(*rc.status);
  const kv::PageTableView table{indptr.data(), indices.data(), last.data(), nullptr,
                                static_cast<std::int32_t>(f.c.prefix.size()), f.c.page_size};

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
  args.cache = cache.view;
  args.table = table;
  args.request_status = rc.status != nullptr ? status_device.data() : nullptr;
  args.qo_indptr = qo_indptr.data();
  args.q = q.data();
  args.o = o->data();
  args.lse = lse->data();
  Output out;
  if (rc.fused) {
    args.chunk_kv = PagedAttentionChunkKv{chunk.k.data(), chunk.v.data(), rc.kv_token_stride, rc.kv_head_stride};
  } else {
    REQUIRE(rc.kv_token_stride == 0);
    AppendArguments append;
    append.cache = cache.view;
    append.table = table;
    append.request_status = args.request_status;
    append.k_new = chunk.k.data();
    append.v_new = chunk.v.data();
    append.input_dtype = f.c.q_dtype;
    append.num_tokens = static_cast<std::int32_t>(f.tokens());
    append.append_indptr = qo_indptr.data();
    const Status s = append_kv(append, nullptr);
    INFO(s.to_string());
    REQUIRE(s.ok());
  }
  mutate(args);
  // The cast: nvcc warns that the Status& an assignment returns is a [[nodiscard]] type dropped.
  static_cast<void>(out.status = run_paged_attention(args, *plan, workspace->data(), *bytes, nullptr));
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  out.plan = *plan;
  for (auto bits : download(*o, f.q_bits.size())) out.o.push_back(from_activation(f.c.q_dtype, bits));
  out.lse = download(*lse, f.tokens() * heads);
  out.k = download(cache.k, f.cache.k.size());
  out.v = download(cache.v, f.cache.v.size());
  out.k_token_scale = download(cache.k_token_scale, f.cache.k_token_scale.size());
  out.v_token_scale = download(cache.v_token_scale, f.cache.v_token_scale.size());
  return out;
}
Output run(const Fixture& f, const RunConfig& rc) {
  return run(f, rc, [](PagedAttentionArguments&) {});
}

/// Byte equality of two float arrays (NaN poison compares by its bits).
bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_cache_equal(const Output& fused, const Output& separate) {
  CHECK(fused.k == separate.k);
  CHECK(fused.v == separate.v);
  CHECK(same_bytes(fused.k_token_scale, separate.k_token_scale));
  CHECK(same_bytes(fused.v_token_scale, separate.v_token_scale));
}

/// Output rows against the reference (attention_test_support.hpp's comparison and the
/// tensor-core tolerance); aborted requests' rows must be marked.
std::size_t count_mismatches(const Fixture& f, const Output& out, const Reference& ref,
                             const std::vector<bool>* aborted, bool print) {
  const std::size_t heads = static_cast<std::size_t>(f.num_qo_heads());
  std::vector<std::size_t> request;
  for (std::size_t b = 0; b < f.c.prefix.size(); ++b) {
    request.insert(request.end(), static_cast<std::size_t>(f.c.chunk[b]) * heads, b);
  }
  const RowComparison r = compare_rows(
      out.o, out.lse, ref, f.tokens() * heads, f.c.head_dim,
      [&](std::size_t row, double want) {
        const std::size_t kv_head = row % heads / static_cast<std::size_t>(f.c.group);
        return tensor_core_tolerance(f.c.q_dtype, f.c.dtype, want,
                                     f.v_max[request[row] * static_cast<std::size_t>(f.c.num_kv_heads) + kv_head]);
      },
      [&](std::size_t row) { return aborted != nullptr && (*aborted)[request[row]]; },
      [&](std::size_t row) {
        return "request " + std::to_string(request[row]) + " token " + std::to_string(row / heads) + " head " +
               std::to_string(row % heads) + " (split " + std::to_string(out.plan.split_kv) + ")";
      },
      print);
  CHECK(r.checked > 0);
  return r.mismatches;
}

void check_outputs(const Fixture& f, const Output& out, const Reference& ref,
                   const std::vector<bool>* aborted = nullptr) {
  CHECK(count_mismatches(f, out, ref, aborted, true) == 0);
}

/// Fused against separate (cache bytes) and against the reference (outputs), split and unsplit.
void check_fused(const Fixture& f) {
  const Reference ref = reference(f);
  const Output separate = run(f, RunConfig{false});
  REQUIRE(separate.status.ok());
  for (bool split : {false, true}) {
    const Output fused = run(f, RunConfig{true, split});
    INFO(fused.status.to_string());
    REQUIRE(fused.status.ok());
    check_cache_equal(fused, separate);
    check_outputs(f, fused, ref);
  }
  // The written slots really changed (the poison is gone), so the byte check can fail; and on
  // FP8 the separate mode, which attends to the stored codes, misses the input-based reference:
  // the comparison tells the two apart.
  CHECK(separate.k != f.cache.k);
  if (is_fp8(f.c.dtype)) CHECK(count_mismatches(f, separate, ref, nullptr, false) > 0);
}

const auto bf = ActivationDtype::bf16;
const auto fp = ActivationDtype::fp16;

}  // namespace

TEST_CASE("fused prefill: chunk lengths 1, page-1, page, page+1, long on mid-page prefixes",
          "[attention][fused]") {
  auto rng = slimserve_test::make_rng(1101);
  using enum KvDtype;
  for (FusedCase c : std::vector<FusedCase>{
           {fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 128, 2, 4, 16, bf, {5, 21, 3, 0, 37}, {1, 15, 16, 17, 150}},
           {fp8_e4m3, KvLayout::hnd, KvScaleMode::per_token, 64, 1, 8, 16, bf, {9, 0, 30, 16}, {17, 16, 1, 70}},
           {fp8_e5m2, KvLayout::hnd, KvScaleMode::per_tensor, 64, 2, 2, 32, fp, {3, 33, 0}, {31, 32, 33}},
           {fp8_e5m2, KvLayout::nhd, KvScaleMode::per_token, 128, 1, 2, 16, fp, {7, 40}, {15, 130}},
           {bf16, KvLayout::nhd, KvScaleMode::none, 128, 2, 4, 16, bf, {5, 21, 3, 0}, {1, 15, 16, 140}},
           {bf16, KvLayout::hnd, KvScaleMode::per_tensor, 64, 1, 1, 16, bf, {11, 2}, {17, 60}},
           {fp16, KvLayout::nhd, KvScaleMode::per_tensor, 64, 2, 2, 16, fp, {6, 18}, {16, 33}},
           {fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 256, 1, 2, 16, fp, {13, 0}, {17, 40}},
           // head_dim 96 and 192 (12 and 24 active lanes of the page store's 16 and 32).
           {fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 96, 2, 4, 16, bf, {5, 21, 3, 0, 37}, {1, 15, 16, 17, 100}},
           {fp8_e4m3, KvLayout::hnd, KvScaleMode::per_token, 192, 1, 2, 16, fp, {9, 0, 30, 16, 3}, {17, 16, 1, 15, 70}},
           {fp8_e5m2, KvLayout::nhd, KvScaleMode::per_token, 96, 1, 8, 32, bf, {3, 33, 0, 40, 7}, {31, 32, 33, 1, 80}},
           {fp8_e5m2, KvLayout::hnd, KvScaleMode::per_tensor, 192, 2, 2, 16, fp, {6, 18, 0, 2, 11}, {1, 15, 16, 17, 64}},
           {bf16, KvLayout::hnd, KvScaleMode::none, 96, 1, 4, 16, bf, {11, 2, 0, 4, 5}, {17, 60, 1, 15, 16}},
           {fp16, KvLayout::nhd, KvScaleMode::per_tensor, 192, 2, 2, 16, fp, {6, 18, 0, 3, 1}, {16, 33, 1, 15, 17}},
       }) {
    if (slimserve_test::sanitizer_build) {
      // "Long" stays several pages and several query tiles long; the cost is quadratic in it.
      for (std::int32_t& n : c.chunk) n = std::min(n, 3 * c.page_size + 5);
    }
    INFO("dtype " << to_string(c.dtype) << " " << to_string(c.scale_mode) << " D " << c.head_dim << " G " << c.group);
    Fixture f(c, rng);
    check_fused(f);
  }
}

TEST_CASE("fused prefill: strided K/V inputs (a fused QKV projection's columns)", "[attention][fused]") {
  auto rng = slimserve_test::make_rng(1102);
  Fixture f({KvDtype::fp8_e4m3, KvLayout::hnd, KvScaleMode::per_token, 128, 2, 2, 16, bf, {19, 4}, {17, 33}}, rng);
  const Reference ref = reference(f);
  const Output separate = run(f, RunConfig{false});
  // Token stride of a [T, (H_qo + 2 H_kv) D] projection output, heads 136 elements apart.
  const std::int64_t head_stride = 136;
  const Output fused = run(f, RunConfig{true, false, nullptr, 3 * 2 * head_stride, head_stride});
  REQUIRE(fused.status.ok());
  check_cache_equal(fused, separate);
  check_outputs(f, fused, ref);
}

TEST_CASE("fused prefill: a NaN key, cached or in the chunk's inputs, makes exactly its readers' rows NaN",
          "[attention][fused]") {
  // docs/attention.md "NaN in the cache" on the fused kernel. Request 0's cached position 0
  // (KV head 1) holds an FP8 NaN code (0x7F); request 1 has no prefix and its first chunk
  // token's K input (KV head 0) is a BF16 NaN, so its first row sees that NaN key alone (every
  // score NaN: the running max stays -inf). Every row of those KV heads' query groups in those
  // requests is NaN in every element, lse NaN unsplit and -inf split; every other row is bit
  // for bit the clean run's.
  auto rng = slimserve_test::make_rng(1105);
  const Fixture clean({KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 128, 2, 4, 16, bf, {40, 0}, {17, 130}},
                      rng);
  Fixture poisoned = clean;
  const int page = clean.table.pages_of(0)[0];
  poisoned.cache.set_bits(poisoned.cache.k, poisoned.cache.offset(page, 0, 1, 37), 0x7F);
  const std::size_t d = static_cast<std::size_t>(clean.c.head_dim);
  const std::size_t kv_heads = static_cast<std::size_t>(clean.c.num_kv_heads);
  const auto first_token = static_cast<std::size_t>(clean.qo_indptr[1]);
  poisoned.k_bits[(first_token * kv_heads + 0) * d + 37] = 0x7FC0;  // BF16 quiet NaN
  const std::size_t heads = static_cast<std::size_t>(clean.num_qo_heads());
  std::vector<bool> nan_row(clean.tokens() * heads, false);
  for (std::size_t b = 0; b < 2; ++b) {
    const int kv_head = b == 0 ? 1 : 0;
    for (auto t = static_cast<std::size_t>(clean.qo_indptr[b]); t < static_cast<std::size_t>(clean.qo_indptr[b + 1]); ++t) {
      for (int g = 0; g < clean.c.group; ++g) nan_row[t * heads + static_cast<std::size_t>(kv_head * clean.c.group + g)] = true;
    }
  }
  for (const bool split : {false, true}) {
    INFO((split ? "split" : "unsplit"));
    const Output base = run(clean, RunConfig{true, split});
    const Output out = run(poisoned, RunConfig{true, split});
    REQUIRE(base.status.ok());
    REQUIRE(out.status.ok());
    CHECK(out.plan.split_kv == split);
    const auto [wrong_nan, wrong_lse, wrong_other, nan_rows] = tally_nan_rows(nan_row, d, split, out.o, out.lse, base.o, base.lse);
    CHECK(nan_rows > 0);
    CHECK(nan_rows < nan_row.size());
    CHECK(wrong_nan == 0);
    CHECK(wrong_lse == 0);
    CHECK(wrong_other == 0);
  }
}

TEST_CASE("fused prefill: aborted requests write nothing and read nothing", "[attention][fused]") {
  auto rng = slimserve_test::make_rng(1103);
  Fixture f({KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, 64, 2, 4, 16, bf, {5, 21, 3, 40}, {17, 15, 40, 1}}, rng);
  std::vector<kv::RequestStatus> status(4, kv::RequestStatus{kv::RequestState::ok, -1});
  status[1] = {kv::RequestState::stale_tag, 0};
  status[2] = {kv::RequestState::page_out_of_range, 1};
  const std::vector<bool> aborted{false, true, true, false};
  const Reference ref = reference(f);
  const Output separate = run(f, RunConfig{false, false, &status});
  for (bool split : {false, true}) {
    const Output fused = run(f, RunConfig{true, split, &status});
    REQUIRE(fused.status.ok());
    check_cache_equal(fused, separate);
    check_outputs(f, fused, ref, &aborted);
    // The aborted requests' chunk slots still hold the poison.
    for (std::size_t b : {std::size_t{1}, std::size_t{2}}) {
      for (std::int32_t i = 0; i < f.c.chunk[b]; ++i) {
        const std::int64_t position = f.c.prefix[b] + i;
        const int page = f.table.indices[static_cast<std::size_t>(f.table.indptr[b] + position / f.c.page_size)];
        for (int h = 0; h < f.c.num_kv_heads; ++h) {
          const std::size_t at = f.cache.offset(page, static_cast<int>(position % f.c.page_size), h, 0);
          CHECK(fused.k[at] == 0xFF);
          CHECK(fused.v[at] == 0xFF);
        }
      }
    }
  }
}

TEST_CASE("fused prefill: bad inputs are refused before launch, nothing written", "[attention][fused]") {
  auto rng = slimserve_test::make_rng(1104);
  Fixture f({KvDtype::fp8_e5m2, KvLayout::nhd, KvScaleMode::per_tensor, 64, 1, 2, 16, bf, {3}, {20}}, rng);
  const auto refused = [&](auto mutate, const char* what) {
    INFO(what);
    const Output out = run(f, RunConfig{}, mutate);
    CHECK_FALSE(out.status.ok());
    CHECK(out.k == f.cache.k);  // no slot written
    CHECK(out.v == f.cache.v);
    for (float x : out.lse) CHECK(std::isnan(x));  // the 0xFF poison is still there
    std::printf("  refused (%s): %s\n", what, out.status.to_string().c_str());
  };
  refused([](PagedAttentionArguments& a) { a.chunk_kv.v = nullptr; }, "no V");
  refused([](PagedAttentionArguments& a) { a.chunk_kv.k = nullptr; }, "no K");
  refused([](PagedAttentionArguments& a) { a.chunk_kv.k = static_cast<const char*>(a.chunk_kv.k) + 2; }, "misaligned K");
  refused([](PagedAttentionArguments& a) { a.chunk_kv.token_stride = 12; }, "token stride not a multiple of 8");
  refused([](PagedAttentionArguments& a) { a.chunk_kv.head_stride = -8; }, "negative head stride");
  refused([](PagedAttentionArguments& a) { a.cache.head_dim = 128; }, "cache unlike the plan");
  refused([](PagedAttentionArguments& a) { a.cache.head_dim = 80; }, "head_dim outside PagedHeadDims");
}

TEST_CASE("fused prefill: the block-table form reads and writes the same bytes as CSR", "[attention][fused][inputs]") {
  auto rng = slimserve_test::make_rng(1106);
  using enum KvDtype;
  for (const FusedCase& c : std::vector<FusedCase>{
           {fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, 64, 2, 4, 16, bf, {5, 21, 0}, {1, 15, 40}},
           {bf16, KvLayout::hnd, KvScaleMode::none, 128, 1, 2, 16, bf, {17, 3}, {16, 33}},
       }) {
    INFO("dtype " << to_string(c.dtype) << " D " << c.head_dim);
    Fixture f(c, rng);
    const Output csr = run(f, RunConfig{});
    REQUIRE(csr.status.ok());
    // Rows two entries wider than the longest request; the spare entries name other pages
    // and ids outside the cache, which must be neither read nor written.
    const std::size_t batch = f.c.prefix.size();
    std::int32_t width = 0;
    for (std::size_t b = 0; b < batch; ++b) width = std::max(width, f.table.indptr[b + 1] - f.table.indptr[b]);
    width += 2;
    std::vector<std::int32_t> ids, lens;
    for (std::size_t b = 0; b < batch; ++b) {
      const auto pages = f.table.pages_of(b);
      for (std::int32_t j = 0; j < width; ++j) {
        const auto at = static_cast<std::size_t>(j);
        ids.push_back(at < pages.size() ? pages[at] : (j % 2 == 0 ? f.table.num_pages - 1 : f.table.num_pages + j));
      }
      lens.push_back(pages.empty() ? 0
                                   : static_cast<std::int32_t>(pages.size() - 1) * f.c.page_size +
                                         f.table.last_page_len[b]);
    }
    auto d_ids = upload(ids);
    auto d_lens = upload(lens);
    const Output block = run(f, RunConfig{}, [&](PagedAttentionArguments& a) {
      a.table = {};
      a.block_table = kv::BlockTableView{d_ids.data(), nullptr, d_lens.data(), static_cast<std::int32_t>(batch),
                                         width, f.c.page_size};
    });
    INFO(block.status.to_string());
    REQUIRE(block.status.ok());
    check_cache_equal(block, csr);
    CHECK(same_bytes(block.o, csr.o));
    CHECK(same_bytes(block.lse, csr.lse));
  }
}
