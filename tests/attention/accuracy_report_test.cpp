// Accuracy report: attention output of FP8 (e4m3, e5m2; per-tensor and per-token scales) and
// BF16 caches against FP64 attention over the unquantized K/V, on realistic data (outlier
// channels in K and V, a few loud tokens). Runs the whole device path: append (quantize) then
// decode. Prints the table quoted in docs/attention.md and bounds each error loosely.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "attention_test_support.hpp"
#include "slimserve/attention/append.hpp"
#include "slimserve/attention/decode.hpp"

using namespace attn_test;

TEST_CASE("accuracy report: FP8 vs BF16 cache on realistic K/V", "[attention][accuracy]") {
  auto rng = slimserve_test::make_rng(421);
  constexpr int batch = 4, length = 160, kv_heads = 2, group = 8, head_dim = 128, page_size = 16;
  constexpr int qo_heads = kv_heads * group;
  const int tokens = batch * length;

  // Real K/V: N(0,1) (K) and N(0,0.5) (V) with outlier channels; every 37th token is 4x louder.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> k_bits, v_bits;
  std::vector<float> k_real, v_real;
  for (int t = 0; t < tokens; ++t) {
    const float loud = t % 37 == 0 ? 4.0f : 1.0f;
    for (int h = 0; h < kv_heads; ++h)
      for (int d = 0; d < head_dim; ++d) {
        const float k_channel = d == 3 ? 15.0f : d == 70 ? 25.0f : 1.0f;
        const float v_channel = d == 11 ? 6.0f : 0.5f;
        k_bits.push_back(to_activation(ActivationDtype::bf16, normal(rng) * k_channel * loud));
        v_bits.push_back(to_activation(ActivationDtype::bf16, normal(rng) * v_channel * loud));
        k_real.push_back(from_activation(ActivationDtype::bf16, k_bits.back()));
        v_real.push_back(from_activation(ActivationDtype::bf16, v_bits.back()));
      }
  }
  float k_amax = 0.0f, v_amax = 0.0f;
  for (float x : k_real) k_amax = std::max(k_amax, std::fabs(x));
  for (float x : v_real) v_amax = std::max(v_amax, std::fabs(x));
  std::vector<std::uint16_t> q_bits;
  std::vector<float> q_real;
  for (int i = 0; i < batch * qo_heads * head_dim; ++i) {
    q_bits.push_back(to_activation(ActivationDtype::bf16, normal(rng)));
    q_real.push_back(from_activation(ActivationDtype::bf16, q_bits.back()));
  }

  // FP64 attention over the unquantized K/V (token t of request b is row b * length + t).
  const double sm_scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  std::vector<double> truth(static_cast<std::size_t>(batch * qo_heads * head_dim), 0.0);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < qo_heads; ++h) {
      const int kvh = h / group;
      std::vector<double> s(length);
      double m = -INFINITY;
      for (int t = 0; t < length; ++t) {
        double dot = 0;
        for (int d = 0; d < head_dim; ++d)
          dot += static_cast<double>(q_real[static_cast<std::size_t>((b * qo_heads + h) * head_dim + d)]) *
                 k_real[static_cast<std::size_t>(((b * length + t) * kv_heads + kvh) * head_dim + d)];
        s[static_cast<std::size_t>(t)] = dot * sm_scale;
        m = std::max(m, s[static_cast<std::size_t>(t)]);
      }
      double sum = 0;
      for (int t = 0; t < length; ++t) {
        const double w = std::exp(s[static_cast<std::size_t>(t)] - m);
        sum += w;
        for (int d = 0; d < head_dim; ++d)
          truth[static_cast<std::size_t>((b * qo_heads + h) * head_dim + d)] +=
              w * v_real[static_cast<std::size_t>(((b * length + t) * kv_heads + kvh) * head_dim + d)];
      }
      for (int d = 0; d < head_dim; ++d) truth[static_cast<std::size_t>((b * qo_heads + h) * head_dim + d)] /= sum;
    }

  // One page table for all caches: contiguous-by-request, shuffled pages.
  const HostPageTable table = make_page_table(std::vector<std::int64_t>(batch, length), page_size, rng, false);
  auto indptr = upload(table.indptr);
  auto indices = upload(table.indices);
  auto last = upload(table.last_page_len);
  auto k_new = upload(k_bits);
  auto v_new = upload(v_bits);
  auto q = upload(q_bits);
  std::vector<std::int32_t> append_rows;
  for (int b = 0; b <= batch; ++b) append_rows.push_back(b * length);
  auto append_indptr = upload(append_rows);
  const kv::PageTableView view{indptr.data(), indices.data(), last.data(), nullptr, batch, page_size};

  struct Row {
    KvDtype dtype;
    KvScaleMode mode;
    // Loose ceiling on the relative L2 error: outlier channels make the FP8 error swing with the
    // seed (e4m3 per-tensor: median 0.056, one seed reached 0.124), so the bounds sit at about
    // 2x the worst seen: not flaky, yet a lost scale or a non-saturating cast (errors of order
    // 1) still fails.
    double bound;
  };
  const Row rows[] = {{KvDtype::bf16, KvScaleMode::none, 0.01},
                      {KvDtype::fp8_e4m3, KvScaleMode::per_tensor, 0.25},
                      {KvDtype::fp8_e4m3, KvScaleMode::per_token, 0.25},
                      {KvDtype::fp8_e5m2, KvScaleMode::per_tensor, 0.45},
                      {KvDtype::fp8_e5m2, KvScaleMode::per_token, 0.45}};
  std::printf("\nattention output error vs FP64 on unquantized K/V (%d requests x %d tokens, D %d, GQA %d)\n",
              batch, length, head_dim, group);
  std::printf("| cache | scales | rel. L2 error | max abs error / max |o| |\n|---|---|---|---|\n");
  for (const Row& r : rows) {
    HostCache host(CacheShape{r.dtype, KvLayout::hnd, r.mode, table.num_pages, page_size, kv_heads, head_dim});
    host.k_scale = r.mode == KvScaleMode::per_tensor ? k_amax / format_max(r.dtype) : 1.0f;
    host.v_scale = r.mode == KvScaleMode::per_tensor ? v_amax / format_max(r.dtype) : 1.0f;
    DeviceCache cache(host);
    AppendArguments append;
    append.cache = cache.view;
    append.table = view;
    append.k_new = k_new.data();
    append.v_new = v_new.data();
    append.num_tokens = tokens;
    append.append_indptr = append_indptr.data();
    REQUIRE(append_kv(append, nullptr).ok());

    DecodeProblem problem{batch, qo_heads, kv_heads, head_dim, page_size, 1, r.dtype};
    DecodePlanArguments plan_args{problem, table.indptr, table.last_page_len};
    auto bytes = decode_workspace_size(plan_args);
    REQUIRE(bytes.ok());
    auto workspace = rt::DeviceBuffer<unsigned char>::create(*bytes);
    REQUIRE(workspace.ok());
    auto plan = plan_decode(plan_args, workspace->data(), *bytes, nullptr);
    REQUIRE(plan.ok());
    auto o = rt::DeviceBuffer<std::uint16_t>::create(truth.size());
    REQUIRE(o.ok());
    DecodeArguments args;
    args.cache = cache.view;
    args.table = view;
    args.q = q.data();
    args.o = o->data();
    args.sm_scale = static_cast<float>(sm_scale);
    REQUIRE(run_decode(args, *plan, workspace->data(), *bytes, nullptr).ok());
    const auto out = download(*o, truth.size());
    double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0;
    for (std::size_t i = 0; i < truth.size(); ++i) {
      const double e = from_activation(ActivationDtype::bf16, out[i]) - truth[i];
      err2 += e * e;
      ref2 += truth[i] * truth[i];
      max_err = std::max(max_err, std::fabs(e));
      max_ref = std::max(max_ref, std::fabs(truth[i]));
    }
    const double rel = std::sqrt(err2 / ref2);
    std::printf("| %s | %s | %.2e | %.2e |\n", std::string(to_string(r.dtype)).c_str(),
                std::string(to_string(r.mode)).c_str(), rel, max_err / max_ref);
    CHECK(rel < r.bound);
  }
}
