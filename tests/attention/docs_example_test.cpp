// The usage example of docs/attention.md, compiled and run (keep the two in sync).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "attention_test_support.hpp"
#include "slimserve/attention/append.hpp"
#include "slimserve/attention/decode.hpp"
#include "slimserve/attention/paged_attention.hpp"
#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_pool.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/tag_check.hpp"

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

// [paged-decode-block-table]
// One decode step over a 2-D block table (vLLM's layout) with the tensor-core paged attention:
// the tag check, then attention that also writes this step's K/V into the pages (fused mode,
// chunk_kv: append_kv takes only the CSR form, the fused run takes either). table comes
// from kv::upload_block_table (kv::BlockTableStorage), tags was synced this step, and
// seq_lens_host already counts the new token.
Status paged_decode_step(const PagedKVCacheView& cache, const kv::BlockTableView& table,
                         std::span<const std::int32_t> seq_lens_host, const kv::DeviceTagArray& tags,
                         const kv::WriterId* writers,          // device [B]: each request's identity
                         const std::int32_t* qo_indptr,        // device: 0, 1, ..., B
                         std::span<const std::int32_t> qo_indptr_host, kv::RequestStatus* verdicts,
                         const void* k_new, const void* v_new,  // [B, num_kv_heads, head_dim]
                         const void* q, void* o, std::int32_t num_qo_heads,
                         rt::DeviceBuffer<unsigned char>& workspace, cudaStream_t stream) {
  // Pages the new tokens land in are checked for writing by their request, the rest for reading.
  kv::BlockTagCheckArguments check{table, &tags, verdicts};
  check.writers = writers;
  check.append_indptr = qo_indptr;
  SLIMSERVE_RETURN_IF_ERROR(kv::check_page_tags(check, stream));

  // PLAN (host): the block-table form gives seq_lens_host, not kv_indptr / last_page_len.
  PagedAttentionPlanArguments plan_args;
  plan_args.problem = {table.batch_size, num_qo_heads, cache.num_kv_heads, cache.head_dim,
                       cache.page_size, cache.dtype};
  plan_args.qo_indptr_host = qo_indptr_host;
  plan_args.seq_lens_host = seq_lens_host;
  Result<std::size_t> bytes = paged_attention_workspace_size(plan_args);  // num_sms 0: this device
  if (!bytes.ok()) return bytes.status();
  if (workspace.size() < *bytes) {
    auto bigger = rt::DeviceBuffer<unsigned char>::create(*bytes);
    if (!bigger.ok()) return bigger.status();
    workspace = std::move(*bigger);
  }
  Result<PagedAttentionPlan> plan =
      plan_paged_attention(plan_args, workspace.data(), workspace.size(), stream);
  if (!plan.ok()) return plan.status();

  // RUN (launches only: capturable). Aborted requests read and write nothing; their rows are NaN.
  PagedAttentionArguments args;
  args.cache = cache;
  args.block_table = table;  // leave args.table empty: exactly one form per call
  args.request_status = verdicts;
  args.qo_indptr = qo_indptr;
  args.q = q;
  args.o = o;                            // sm_scale unset: 1 / sqrt(head_dim)
  args.chunk_kv = {k_new, v_new, 0, 0};  // packed [B, num_kv_heads, head_dim], q's dtype
  return run_paged_attention(args, *plan, workspace.data(), workspace.size(), stream);
}
// [paged-decode-block-table]
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

TEST_CASE("docs example: a block-table decode step with the tag check and fused append",
          "[attention][docs]") {
  using namespace attn_test;
  auto rng = slimserve_test::make_rng(433);
  constexpr std::int32_t page_size = 16, head_dim = 64, qo_heads = 2, width = 4;
  const std::vector<std::int64_t> lengths{1, 17, 40};  // after this step's token
  const auto batch = static_cast<std::int32_t>(lengths.size());
  auto pool = kv::PagePool::create({24});
  REQUIRE(pool.ok());
  const std::int32_t num_pages = 24;
  std::vector<std::vector<kv::PageHandle>> pages(lengths.size());
  std::vector<kv::WriterId> writers;
  std::vector<kv::RequestPages> requests;
  HostPageTable csr;  // the same pages as a CSR table, for the reference
  csr.num_pages = num_pages;
  csr.lengths = lengths;
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    writers.push_back(pool->new_writer());
    pages[b].resize(static_cast<std::size_t>((lengths[b] + page_size - 1) / page_size));
    REQUIRE(pool->allocate(pages[b], writers.back()).ok());
    requests.push_back({pages[b], lengths[b]});
    for (const auto& page : pages[b]) csr.indices.push_back(page.id);
    csr.indptr.push_back(static_cast<std::int32_t>(csr.indices.size()));
    csr.last_page_len.push_back(static_cast<std::int32_t>(lengths[b] - (std::ssize(pages[b]) - 1) * page_size));
  }
  HostCache host(CacheShape{KvDtype::bf16, KvLayout::nhd, KvScaleMode::none, num_pages, page_size, 1, head_dim});
  std::vector<float> row(head_dim);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    for (std::int64_t p = 0; p + 1 < lengths[b]; ++p)
      for (int which = 0; which < 2; ++which) {
        realistic_row(rng, head_dim, row.data());
        host.store(which == 1, pages[b][static_cast<std::size_t>(p / page_size)].id, static_cast<int>(p % page_size), 0, row.data());
      }
  }
  DeviceCache cache(host);
  auto tags = kv::DeviceTagArray::create(num_pages);
  auto storage = kv::BlockTableStorage::create(batch, width);
  REQUIRE(tags.ok());
  REQUIRE(storage.ok());
  auto host_table = kv::build_block_table(requests, {page_size, num_pages}, storage->host());
  REQUIRE(host_table.ok());
  auto table = kv::upload_block_table(*host_table, num_pages, storage->device(), nullptr);
  REQUIRE(table.ok());
  const std::vector<std::int32_t> seq_lens(host_table->seq_lens, host_table->seq_lens + batch);
  // Request 1's last page changes owner after its table was built: a stale user.
  REQUIRE(pool->release(pages[1].back()).ok());
  auto reused = pool->allocate();
  REQUIRE(reused.ok());
  REQUIRE(tags->sync(*pool, nullptr).ok());

  std::vector<std::uint16_t> k_new, v_new, q;
  std::vector<float> q_values;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < batch * head_dim; ++i) {
    k_new.push_back(to_activation(ActivationDtype::bf16, normal(rng)));
    v_new.push_back(to_activation(ActivationDtype::bf16, normal(rng)));
  }
  for (int i = 0; i < batch * qo_heads * head_dim; ++i) {
    q.push_back(to_activation(ActivationDtype::bf16, normal(rng)));
    q_values.push_back(from_activation(ActivationDtype::bf16, q.back()));
  }
  const std::vector<std::int32_t> qo_indptr{0, 1, 2, 3};
  auto qo_d = upload(qo_indptr);
  auto writers_d = upload(writers);
  auto verdicts = upload(std::vector<kv::RequestStatus>(lengths.size(), kv::RequestStatus{kv::RequestState::ok, -1}));
  auto k_d = upload(k_new);
  auto v_d = upload(v_new);
  auto q_d = upload(q);
  auto o = upload(std::vector<std::uint16_t>(q.size(), 0x1234));  // poison
  rt::DeviceBuffer<unsigned char> workspace;
  REQUIRE(docs_example::paged_decode_step(cache.view, *table, seq_lens, *tags, writers_d.data(), qo_d.data(),
                                          qo_indptr, verdicts.data(), k_d.data(), v_d.data(), q_d.data(),
                                          o.data(), qo_heads, workspace, nullptr)
              .ok());
  const auto statuses = download(verdicts, lengths.size());
  CHECK(kv::request_ok(statuses[0]));
  CHECK_FALSE(kv::request_ok(statuses[1]));
  CHECK(statuses[1].failed_slot == 1);
  CHECK(kv::request_ok(statuses[2]));
  // Reference: the host image plus the appended tokens of the admitted requests, in FP64.
  for (std::size_t b : {std::size_t{0}, std::size_t{2}}) {
    const std::int64_t p = lengths[b] - 1;
    std::vector<float> kr(head_dim), vr(head_dim);
    for (std::size_t d = 0; d < static_cast<std::size_t>(head_dim); ++d) {
      kr[d] = from_activation(ActivationDtype::bf16, k_new[b * head_dim + d]);
      vr[d] = from_activation(ActivationDtype::bf16, v_new[b * head_dim + d]);
    }
    host.store(false, pages[b][static_cast<std::size_t>(p / page_size)].id, static_cast<int>(p % page_size), 0, kr.data());
    host.store(true, pages[b][static_cast<std::size_t>(p / page_size)].id, static_cast<int>(p % page_size), 0, vr.data());
  }
  const Reference ref = reference_decode(host, csr, q_values, qo_heads, 1, 1.0 / 8.0);
  const auto out = download(o, q.size());
  const std::size_t row_elems = static_cast<std::size_t>(qo_heads * head_dim);
  // The tolerance scales with the V values a row attends over (the softmax weights are rounded
  // to BF16 before P·V), not with |o|, which cancellation can make small.
  std::vector<double> v_max;
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    v_max.push_back(max_abs_value(lengths[b], head_dim, stored_values(host, csr, b, 0, true)));
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    const float value = from_activation(ActivationDtype::bf16, out[i]);
    const std::size_t b = i / row_elems;
    if (b == 1) {
      CHECK(std::isnan(value));  // the aborted request
    } else {
      CHECK(std::fabs(value - ref.o[i]) <=
            tensor_core_tolerance(ActivationDtype::bf16, KvDtype::bf16, ref.o[i], v_max[b]));
    }
  }
}
