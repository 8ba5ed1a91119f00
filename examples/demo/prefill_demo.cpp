// Prefill part of the slimserve demo: one request goes through chunked prefill on an FP8 e4m3
// cache (per-token scales) and then decodes, all with the tensor-core paged attention kernel on
// the CPU emulator. Each step appends the new tokens' K/V (quantized on the way in) and runs
// `run_paged_attention` with qo_indptr marking the new tokens: chunk 1 attends to itself,
// later chunks to the cached prefix pages plus themselves (causally), decode steps to
// everything. The same steps on a BF16 cache give the reference the demo compares against.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "slimserve/attention/append.hpp"
#include "slimserve/attention/paged_attention.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/runtime/memory.hpp"

namespace {

using namespace slimserve;
using namespace slimserve::attention;

constexpr int kv_heads = 2, group = 8, head_dim = 128, page_size = 16, num_pages = 24;
constexpr int prompt = 150, chunk = 64, decode_steps = 3;

template <class T>
rt::DeviceBuffer<T> device_copy(const std::vector<T>& host) {
  auto buffer = rt::DeviceBuffer<T>::create(std::max<std::size_t>(host.size(), 1));
  if (!buffer.ok()) return {};
  (void)buffer->upload(std::span<const T>(host));
  return std::move(*buffer);
}

struct Cache {
  rt::DeviceBuffer<unsigned char> k, v;
  rt::DeviceBuffer<float> k_scales, v_scales;
  PagedKVCacheView view;
  Cache(KvDtype dtype, KvScaleMode mode) {
    const std::size_t elements = std::size_t{num_pages} * page_size * kv_heads * head_dim;
    const std::size_t tokens = std::size_t{num_pages} * page_size * kv_heads;
    k = device_copy(std::vector<unsigned char>(elements * static_cast<std::size_t>(element_bytes(dtype))));
    v = device_copy(std::vector<unsigned char>(elements * static_cast<std::size_t>(element_bytes(dtype))));
    k_scales = device_copy(std::vector<float>(tokens, 1.0f));
    v_scales = device_copy(std::vector<float>(tokens, 1.0f));
    view = PagedKVCacheView{k.data(), v.data(), nullptr, nullptr, k_scales.data(), v_scales.data(),
                            num_pages, page_size, kv_heads, head_dim, dtype, KvLayout::nhd, mode};
  }
};

int fail(const Status& status) {
  fmt::print("prefill demo: {}\n", status.to_string());
  return 1;
}

}  // namespace

int demo_prefill() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<kv::PageId> page_ids(num_pages);
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);  // the request's pages are scattered

  Cache fp8(KvDtype::fp8_e4m3, KvScaleMode::per_token);
  Cache bf16_cache(KvDtype::bf16, KvScaleMode::none);
  rt::DeviceBuffer<unsigned char> workspace;
  std::int64_t length = 0;

  auto step = [&](int new_tokens, const char* what) -> int {
    length += new_tokens;
    const auto pages = static_cast<std::int32_t>((length + page_size - 1) / page_size);
    const std::vector<std::int32_t> indptr{0, pages};
    const std::vector<std::int32_t> last{static_cast<std::int32_t>(length - (pages - 1) * page_size)};
    const std::vector<std::int32_t> ids(page_ids.begin(), page_ids.begin() + pages);
    const std::vector<std::int32_t> qo_indptr{0, new_tokens};
    auto d_indptr = device_copy(indptr);
    auto d_ids = device_copy(ids);
    auto d_last = device_copy(last);
    auto d_qo = device_copy(qo_indptr);
    const kv::PageTableView table{d_indptr.data(), d_ids.data(), d_last.data(), nullptr, 1, page_size};

    std::vector<std::uint16_t> k_new, v_new, q;
    for (int i = 0; i < new_tokens * kv_heads * head_dim; ++i) {
      k_new.push_back(from_float<bf16>(normal(rng) * (i % head_dim == 5 ? 12.0f : 1.0f)).bits);
      v_new.push_back(from_float<bf16>(normal(rng) * 0.5f).bits);
    }
    for (int i = 0; i < new_tokens * kv_heads * group * head_dim; ++i) q.push_back(from_float<bf16>(normal(rng)).bits);
    auto d_k = device_copy(k_new);
    auto d_v = device_copy(v_new);
    auto d_q = device_copy(q);
    const std::vector<std::int32_t> append_indptr{0, new_tokens};
    auto d_append = device_copy(append_indptr);

    std::vector<std::uint16_t> out[2];
    PagedAttentionPlan plan;
    Cache* caches[2] = {&fp8, &bf16_cache};
    for (int c = 0; c < 2; ++c) {
      AppendArguments append;
      append.cache = caches[c]->view;
      append.table = table;
      append.k_new = d_k.data();
      append.v_new = d_v.data();
      append.num_tokens = new_tokens;
      append.append_indptr = d_append.data();
      if (Status s = append_kv(append, nullptr); !s.ok()) return fail(s);

      PagedAttentionPlanArguments plan_args{
          PagedAttentionProblem{1, kv_heads * group, kv_heads, head_dim, page_size, caches[c]->view.dtype},
          qo_indptr, indptr, last};
      plan_args.num_sms = 8;  // an engine passes its device's SM count (plan_paged_attention asks when 0)
      auto bytes = paged_attention_workspace_size(plan_args);
      if (!bytes.ok()) return fail(bytes.status());
      if (workspace.size() < *bytes) workspace = device_copy(std::vector<unsigned char>(*bytes));
      auto planned = plan_paged_attention(plan_args, workspace.data(), workspace.size(), nullptr);
      if (!planned.ok()) return fail(planned.status());
      plan = *planned;
      auto o = device_copy(std::vector<std::uint16_t>(q.size()));
      PagedAttentionArguments args;
      args.cache = caches[c]->view;
      args.table = table;
      args.qo_indptr = d_qo.data();
      args.q = d_q.data();
      args.o = o.data();  // sm_scale unset: 1/sqrt(head_dim)
      if (Status s = run_paged_attention(args, plan, workspace.data(), workspace.size(), nullptr); !s.ok()) return fail(s);
      out[c].resize(q.size());
      if (Status s = o.download(std::span<std::uint16_t>(out[c])); !s.ok()) return fail(s);
    }
    if (Status s = rt::stream_synchronize(nullptr); !s.ok()) return fail(s);
    double err2 = 0, ref2 = 0;
    for (std::size_t i = 0; i < out[0].size(); ++i) {
      const double x = to_float(bf16::from_bits(out[0][i])), y = to_float(bf16::from_bits(out[1][i]));
      err2 += (x - y) * (x - y);
      ref2 += y * y;
    }
    if (!std::isfinite(err2) || ref2 == 0) return fail(make_status(StatusCode::internal, "non-finite output"));
    fmt::print("{:9} {:3} new tokens, {:3} cached: FP8 vs BF16 cache rel. L2 diff {:.3e} "
               "({} rows per CTA{})\n",
               what, new_tokens, length - new_tokens, std::sqrt(err2 / ref2), plan.cta_rows,
               plan.split_kv ? ", split KV" : "");
    return 0;
  };

  for (int done = 0; done < prompt; done += chunk) {
    if (int rc = step(std::min(chunk, prompt - done), "prefill"); rc != 0) return rc;
  }
  for (int i = 0; i < decode_steps; ++i) {
    if (int rc = step(1, "decode"); rc != 0) return rc;
  }
  PagedAttentionProblem decode_problem{1, kv_heads * group, kv_heads, head_dim, page_size, KvDtype::fp8_e4m3};
  fmt::print("kernel choice for this decode: {}\n", choose_attention_kernel(decode_problem, 1).reason);
  return 0;
}
