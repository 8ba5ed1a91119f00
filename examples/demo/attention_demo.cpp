// Attention part of the slimserve demo: a decode loop over FP8 pages on the CPU emulator.
// Three requests get their pages from the tagged page pool. Each step:
//   1. builds and uploads the page table;
//   2. runs the GPU tag check;
//   3. appends the step's K/V, quantized on the way in;
//   4. runs paged decode attention.
// Steps 3 and 4 run on an FP8 e4m3 cache (per-token scales) and, for comparison, on a BF16
// cache. Midway, request C's last page is freed and handed to another owner while a buggy
// scheduler keeps C in the batch. The tag check aborts C: nothing reads or writes its pages,
// and its output is marked NaN. The demo prints the FP8-vs-BF16 difference per step and the
// cache capacity per GiB.
#include <fmt/core.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "slimserve/attention/append.hpp"
#include "slimserve/attention/decode.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/tag_check.hpp"
#include "slimserve/runtime/memory.hpp"

namespace {

using namespace slimserve;
using namespace slimserve::attention;

constexpr int batch = 3, kv_heads = 2, group = 4, head_dim = 128, page_size = 16;
constexpr int prompt = 60, steps = 6, num_pages = 64, max_entries = 64;

template <class T>
rt::DeviceBuffer<T> allocate(std::size_t count) {
  auto buffer = rt::DeviceBuffer<T>::create(count);
  return buffer.ok() ? std::move(*buffer) : rt::DeviceBuffer<T>{};
}
template <class T>
rt::DeviceBuffer<T> device_copy(const std::vector<T>& host) {
  auto buffer = allocate<T>(host.size());
  (void)buffer.upload(std::span<const T>(host));
  return buffer;
}

/// One cache (pages + per-token scales) and its view.
struct Cache {
  rt::DeviceBuffer<unsigned char> k, v;
  rt::DeviceBuffer<float> k_scales, v_scales;
  PagedKVCacheView view;
  Cache(KvDtype dtype, KvScaleMode mode) {
    const std::size_t elements = std::size_t{num_pages} * page_size * kv_heads * head_dim;
    const std::size_t tokens = std::size_t{num_pages} * page_size * kv_heads;
    k = allocate<unsigned char>(elements * static_cast<std::size_t>(element_bytes(dtype)));
    v = allocate<unsigned char>(elements * static_cast<std::size_t>(element_bytes(dtype)));
    k_scales = allocate<float>(tokens);
    v_scales = allocate<float>(tokens);
    view = PagedKVCacheView{k.data(), v.data(), nullptr, nullptr, k_scales.data(), v_scales.data(),
                            num_pages, page_size, kv_heads, head_dim, dtype, KvLayout::hnd, mode};
  }
};

int fail(const Status& status) {
  fmt::print("attention demo: {}\n", status.to_string());
  return 1;
}

}  // namespace

int demo_attention() {
  fmt::print("\n== FP8 paged KV cache + decode attention (CPU emulator) ==\n");
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto activation = [&](float scale, int d) {
    const float outlier = d == 5 ? 12.0f : 1.0f;  // an outlier channel, as real K has
    return from_float<bf16>(normal(rng) * scale * outlier).bits;
  };

  auto pool = kv::PagePool::create({num_pages});
  auto tags = kv::DeviceTagArray::create(num_pages);
  if (!pool.ok()) return fail(pool.status());
  if (!tags.ok()) return fail(tags.status());
  Cache fp8(KvDtype::fp8_e4m3, KvScaleMode::per_token);
  Cache reference(KvDtype::bf16, KvScaleMode::none);
  auto d_indptr = allocate<std::int32_t>(batch + 1);
  auto d_ids = allocate<kv::PageId>(max_entries);
  auto d_last = allocate<std::int32_t>(batch);
  auto d_tags = allocate<kv::PageTag>(max_entries);
  auto d_status = allocate<kv::RequestStatus>(batch);
  rt::DeviceBuffer<unsigned char> workspace;

  std::vector<std::vector<kv::PageHandle>> pages(batch);
  std::vector<std::int64_t> lengths(batch, 0);
  std::vector<kv::PageHandle> new_owner;
  bool c_aborted = false;

  for (int step = 0; step <= steps; ++step) {
    const int new_tokens = step == 0 ? prompt : 1;  // a prefill chunk, then one token per step
    for (int b = 0; b < batch; ++b) {
      lengths[static_cast<std::size_t>(b)] += new_tokens;
      while (static_cast<std::int64_t>(pages[static_cast<std::size_t>(b)].size()) * page_size <
             lengths[static_cast<std::size_t>(b)]) {
        auto page = pool->allocate();
        if (!page.ok()) return fail(page.status());
        pages[static_cast<std::size_t>(b)].push_back(*page);
      }
    }
    if (step == 3) {
      // C's last page goes back to the pool and to a new owner (outside this batch), but the
      // scheduler still batches C with its old handle.
      if (Status s = pool->release(pages[2].back()); !s.ok()) return fail(s);
      auto page = pool->allocate();
      if (!page.ok()) return fail(page.status());
      new_owner.push_back(*page);
    }

    // 1-2. Page table and tag check.
    std::vector<kv::RequestPages> requests;
    for (int b = 0; b < batch; ++b) requests.push_back({pages[static_cast<std::size_t>(b)], lengths[static_cast<std::size_t>(b)]});
    std::vector<std::int32_t> indptr(batch + 1), last(batch);
    std::vector<kv::PageId> ids(max_entries);
    std::vector<kv::PageTag> expected(max_entries);
    auto host_table = kv::build_page_table(requests, {page_size, num_pages},
                                           {indptr.data(), ids.data(), last.data(), expected.data(), batch, max_entries});
    if (!host_table.ok()) return fail(host_table.status());
    if (Status s = tags->sync(*pool, nullptr); !s.ok()) return fail(s);
    auto table = kv::upload_page_table(*host_table, num_pages,
                                       {d_indptr.data(), d_ids.data(), d_last.data(), d_tags.data(), batch, max_entries},
                                       nullptr);
    if (!table.ok()) return fail(table.status());
    if (Status s = kv::check_page_tags({*table, &*tags, d_status.data(), nullptr}, nullptr); !s.ok()) return fail(s);

    // 3. New K/V (the last new_tokens positions of each request) and queries.
    std::vector<std::uint16_t> k_new, v_new, q;
    for (int i = 0; i < batch * new_tokens * kv_heads * head_dim; ++i) {
      k_new.push_back(activation(1.0f, i % head_dim));
      v_new.push_back(activation(0.5f, 0));
    }
    for (int i = 0; i < batch * kv_heads * group * head_dim; ++i) q.push_back(activation(1.0f, 0));
    std::vector<std::int32_t> append_indptr;
    for (int b = 0; b <= batch; ++b) append_indptr.push_back(b * new_tokens);
    auto k_d = device_copy(k_new);
    auto v_d = device_copy(v_new);
    auto q_d = device_copy(q);
    auto ai_d = device_copy(append_indptr);

    // 4. Append + attention on both caches.
    std::vector<std::uint16_t> outputs[2];
    Cache* caches[2] = {&fp8, &reference};
    for (int c = 0; c < 2; ++c) {
      AppendArguments append;
      append.cache = caches[c]->view;
      append.table = *table;
      append.request_status = d_status.data();
      append.k_new = k_d.data();
      append.v_new = v_d.data();
      append.num_tokens = batch * new_tokens;
      append.append_indptr = ai_d.data();
      if (Status s = append_kv(append, nullptr); !s.ok()) return fail(s);

      DecodePlanArguments plan_args{DecodeProblem{batch, kv_heads * group, kv_heads, head_dim, page_size, 1,
                                                  caches[c]->view.dtype},
                                    std::span<const std::int32_t>(indptr), std::span<const std::int32_t>(last)};
      auto bytes = decode_workspace_size(plan_args);
      if (!bytes.ok()) return fail(bytes.status());
      if (workspace.size() < *bytes) workspace = allocate<unsigned char>(*bytes);
      auto plan = plan_decode(plan_args, workspace.data(), workspace.size(), nullptr);
      if (!plan.ok()) return fail(plan.status());
      auto o = allocate<std::uint16_t>(q.size());
      DecodeArguments args;
      args.cache = caches[c]->view;
      args.table = *table;
      args.request_status = d_status.data();
      args.q = q_d.data();
      args.o = o.data();
      args.sm_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      if (Status s = run_decode(args, *plan, workspace.data(), workspace.size(), nullptr); !s.ok()) return fail(s);
      outputs[c].resize(q.size());
      if (Status s = o.download(outputs[c]); !s.ok()) return fail(s);
    }
    if (Status s = rt::stream_synchronize(nullptr); !s.ok()) return fail(s);

    // FP8 vs BF16 on the live requests; aborted ones must be marked NaN.
    const std::size_t per_request = q.size() / batch;
    double err2 = 0, ref2 = 0;
    for (int b = 0; b < batch; ++b) {
      bool all_nan = true;
      for (std::size_t i = static_cast<std::size_t>(b) * per_request; i < (static_cast<std::size_t>(b) + 1) * per_request; ++i) {
        const double x = to_float(bf16::from_bits(outputs[0][i])), y = to_float(bf16::from_bits(outputs[1][i]));
        all_nan = all_nan && std::isnan(x) && std::isnan(y);
        if (!std::isnan(y)) {
          err2 += (x - y) * (x - y);
          ref2 += y * y;
        }
      }
      if (all_nan && !c_aborted && b == 2) {
        c_aborted = true;
        fmt::print("step {}: tag check aborted request C (stale last page): no page of it read or "
                   "written, its output rows are NaN\n", step);
      }
    }
    fmt::print("step {} (A has {} tokens): FP8 e4m3 vs BF16 cache, attention output rel. L2 diff {:.3e}\n",
               step, lengths[0], std::sqrt(err2 / ref2));
  }
  fmt::print("capacity per GiB of one layer (8 KV heads x 128, page 16):\n");
  const std::pair<KvDtype, KvScaleMode> modes[] = {{KvDtype::bf16, KvScaleMode::none},
                                                   {KvDtype::fp8_e4m3, KvScaleMode::per_tensor},
                                                   {KvDtype::fp8_e4m3, KvScaleMode::per_token}};
  for (auto [dtype, mode] : modes) {
    fmt::print("  {:9} {:10} {:>8} tokens ({} B/token)\n", to_string(dtype), to_string(mode),
               tokens_per_gib(dtype, mode, 8, 128, 16), cache_bytes_per_token(dtype, mode, 8, 128));
  }
  return c_aborted ? 0 : 1;
}
