// The usage example of docs/attention.md, compiled and run (keep the two in sync).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "attention_test_support.hpp"
#include "slimserve/attention/append.hpp"
#include "slimserve/attention/decode.hpp"

namespace docs_example {
using namespace slimserve;
using namespace slimserve::attention;

// [decode-step]
// One decode step of one layer: append this step's K/V (one token per request), then attend.
// `cache` and `table` are device views; host_indptr/host_last are host copies of the table.
Status decode_step(const PagedKVCacheView& cache, const kv::PageTableView& table,
                   std::span<const std::int32_t> host_indptr, std::span<const std::int32_t> host_last,
                   const kv::RequestStatus* verdicts,  // from the tag check, device
                   const std::int32_t* append_indptr,  // device: 0, 1, ..., batch
                   const void* k_new, const void* v_new, const void* q, void* o, float* lse,
                   std::int32_t num_qo_heads, rt::DeviceBuffer<unsigned char>& workspace,
                   cudaStream_t stream) {
  AppendArguments append;
  append.cache = cache;
  append.table = table;
  append.request_status = verdicts;
  append.k_new = k_new;
  append.v_new = v_new;
  append.num_tokens = table.batch_size;
  append.append_indptr = append_indptr;
  SLIMSERVE_RETURN_IF_ERROR(append_kv(append, stream));

  // PLAN (host; re-run when the batch changes): size, (re)allocate, upload the schedule.
  DecodePlanArguments plan_args{
      DecodeProblem{table.batch_size, num_qo_heads, cache.num_kv_heads, cache.head_dim,
                    cache.page_size, /*query_tokens=*/1, cache.dtype},
      host_indptr, host_last};
  Result<std::size_t> bytes = decode_workspace_size(plan_args);
  if (!bytes.ok()) return bytes.status();
  if (workspace.size() < *bytes) {
    auto bigger = rt::DeviceBuffer<unsigned char>::create(*bytes);
    if (!bigger.ok()) return bigger.status();
    workspace = std::move(*bigger);
  }
  Result<DecodePlan> plan = plan_decode(plan_args, workspace.data(), workspace.size(), stream);
  if (!plan.ok()) return plan.status();

  // RUN (launches only: this is the part to capture in a CUDA graph).
  DecodeArguments args;
  args.cache = cache;
  args.table = table;
  args.request_status = verdicts;
  args.q = q;
  args.o = o;
  args.lse = lse;
  args.sm_scale = 1.0f / std::sqrt(static_cast<float>(cache.head_dim));
  return run_decode(args, *plan, workspace.data(), workspace.size(), stream);
}
// [decode-step]
}  // namespace docs_example

TEST_CASE("docs example: one decode step runs and matches the reference", "[attention][docs]") {
  using namespace attn_test;
  auto rng = slimserve_test::make_rng(431);
  const std::vector<std::int64_t> lengths{9, 40};
  const HostPageTable table = make_page_table(lengths, 16, rng, false);
  HostCache host(CacheShape{KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, table.num_pages, 16, 1, 64});
  // Fill all but the last token of each request on the host; the example appends the last one.
  std::vector<float> row(64);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    const auto pages = table.pages_of(b);
    for (std::int64_t p = 0; p + 1 < lengths[b]; ++p)
      for (int which = 0; which < 2; ++which) {
        realistic_row(rng, 64, row.data());
        host.store(which == 1, pages[static_cast<std::size_t>(p / 16)], static_cast<int>(p % 16), 0, row.data());
      }
  }
  DeviceCache cache(host);
  std::vector<std::uint16_t> k_new, v_new, q;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < 2 * 64; ++i) {
    k_new.push_back(to_activation(ActivationDtype::bf16, normal(rng)));
    v_new.push_back(to_activation(ActivationDtype::bf16, normal(rng)));
  }
  std::vector<float> q_values;
  for (int i = 0; i < 2 * 2 * 64; ++i) {
    q.push_back(to_activation(ActivationDtype::bf16, normal(rng)));
    q_values.push_back(from_activation(ActivationDtype::bf16, q.back()));
  }
  auto indptr = upload(table.indptr);
  auto indices = upload(table.indices);
  auto last = upload(table.last_page_len);
  auto ai = upload(std::vector<std::int32_t>{0, 1, 2});
  auto k_d = upload(k_new);
  auto v_d = upload(v_new);
  auto q_d = upload(q);
  auto o = rt::DeviceBuffer<std::uint16_t>::create(q.size());
  REQUIRE(o.ok());
  rt::DeviceBuffer<unsigned char> workspace;
  const kv::PageTableView view{indptr.data(), indices.data(), last.data(), nullptr, 2, 16};
  REQUIRE(docs_example::decode_step(cache.view, view, table.indptr, table.last_page_len, nullptr, ai.data(),
                                    k_d.data(), v_d.data(), q_d.data(), o->data(), nullptr, 2, workspace, nullptr)
              .ok());
  // Reference: the host image plus the appended tokens, attended in FP64.
  for (std::size_t b = 0; b < 2; ++b) {
    const auto pages = table.pages_of(b);
    const std::int64_t p = lengths[b] - 1;
    std::vector<float> kr(64), vr(64);
    for (int d = 0; d < 64; ++d) {
      kr[static_cast<std::size_t>(d)] = from_activation(ActivationDtype::bf16, k_new[b * 64 + static_cast<std::size_t>(d)]);
      vr[static_cast<std::size_t>(d)] = from_activation(ActivationDtype::bf16, v_new[b * 64 + static_cast<std::size_t>(d)]);
    }
    host.store(false, pages[static_cast<std::size_t>(p / 16)], static_cast<int>(p % 16), 0, kr.data());
    host.store(true, pages[static_cast<std::size_t>(p / 16)], static_cast<int>(p % 16), 0, vr.data());
  }
  const Reference ref = reference_decode(host, table, q_values, 2, 1, 1.0 / 8.0);
  const auto out = download(*o, q.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    // BF16 output rounding (2^-8 relative) + FP32 accumulation (values are O(1)): 2e-3 absolute.
    CHECK(std::fabs(from_activation(ActivationDtype::bf16, out[i]) - ref.o[i]) <= std::ldexp(std::fabs(ref.o[i]), -8) + 2e-3);
  }
}
