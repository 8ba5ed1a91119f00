// Attention part of the slimserve demo: a decode loop over FP8 pages on the CPU emulator.
// Two requests get a prompt appended in one chunk, then decode steps each append one token
// (quantized on the way in), check the requests' verdicts and run paged decode attention, on
// an FP8 e4m3 cache (per-token scales) and, for comparison, on a BF16 cache. Prints the
// FP8-vs-BF16 output difference per step and the cache capacity per GiB.
#include <fmt/core.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "slimserve/attention/append.hpp"
#include "slimserve/attention/decode.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/runtime/memory.hpp"

namespace {

using namespace slimserve;
using namespace slimserve::attention;

constexpr int batch = 2, kv_heads = 2, group = 4, head_dim = 128, page_size = 16;
constexpr int prompt = 100, steps = 6, max_pages_per_request = 8;

template <class T>
rt::DeviceBuffer<T> allocate(std::size_t count) {
  auto buffer = rt::DeviceBuffer<T>::create(count);
  return buffer.ok() ? std::move(*buffer) : rt::DeviceBuffer<T>{};
}

template <class T>
rt::DeviceBuffer<T> device_copy(const std::vector<T>& host) {
  auto buffer = rt::DeviceBuffer<T>::create(host.size());
  if (!buffer.ok()) return {};
  (void)buffer->upload(std::span<const T>(host));
  return std::move(*buffer);
}

/// One cache (pages + scales) and its view.
struct Cache {
  rt::DeviceBuffer<unsigned char> k, v;
  rt::DeviceBuffer<float> k_scales, v_scales;
  PagedKVCacheView view;
  Cache(KvDtype dtype, KvScaleMode mode, int num_pages) {
    const std::size_t elements = static_cast<std::size_t>(num_pages) * page_size * kv_heads * head_dim;
    const std::size_t tokens = static_cast<std::size_t>(num_pages) * page_size * kv_heads;
    k = allocate<unsigned char>(elements * static_cast<std::size_t>(element_bytes(dtype)));
    v = allocate<unsigned char>(elements * static_cast<std::size_t>(element_bytes(dtype)));
    k_scales = allocate<float>(tokens);
    v_scales = allocate<float>(tokens);
    view = PagedKVCacheView{k.data(), v.data(), nullptr, nullptr, k_scales.data(), v_scales.data(),
                            num_pages, page_size, kv_heads, head_dim, dtype, KvLayout::hnd, mode};
  }
};

}  // namespace

int demo_attention() {
  fmt::print("\n== FP8 paged KV cache + decode attention (CPU emulator) ==\n");
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto activation = [&](float scale, int d) {
    const float outlier = d == 5 ? 12.0f : 1.0f;  // an outlier channel, as real K has
    return from_float<bf16>(normal(rng) * scale * outlier).bits;
  };

  // Pages: request b owns pages [b * max_pages_per_request, ...), shuffled order within.
  const int num_pages = batch * max_pages_per_request;
  std::vector<std::int32_t> indices;
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < max_pages_per_request; ++i) indices.push_back(b * max_pages_per_request + (i * 3) % max_pages_per_request);
  auto indices_d = device_copy(indices);
  Cache fp8(KvDtype::fp8_e4m3, KvScaleMode::per_token, num_pages);
  Cache ref(KvDtype::bf16, KvScaleMode::none, num_pages);
  // The tag check's verdicts (written by the allocator's GPU check in an engine): all ok here.
  auto status = device_copy(std::vector<kv::RequestStatus>(batch, kv::RequestStatus{kv::RequestState::ok, -1}));

  std::vector<std::int64_t> lengths(batch, 0);
  auto run_step = [&](int new_tokens, int step) -> bool {
    // Host page table after this step's tokens.
    std::vector<std::int32_t> indptr{0}, last;
    for (int b = 0; b < batch; ++b) {
      lengths[static_cast<std::size_t>(b)] += new_tokens;
      const auto pages = static_cast<std::int32_t>((lengths[static_cast<std::size_t>(b)] + page_size - 1) / page_size);
      indptr.push_back(b * max_pages_per_request + pages);
      last.push_back(static_cast<std::int32_t>(lengths[static_cast<std::size_t>(b)] - (pages - 1) * page_size));
    }
    // CSR with each request's pages starting at b * max_pages_per_request.
    std::vector<std::int32_t> compact_indptr{0}, compact_indices;
    for (int b = 0; b < batch; ++b) {
      const int pages = indptr[static_cast<std::size_t>(b) + 1] - b * max_pages_per_request;
      for (int i = 0; i < pages; ++i) compact_indices.push_back(indices[static_cast<std::size_t>(b * max_pages_per_request + i)]);
      compact_indptr.push_back(static_cast<std::int32_t>(compact_indices.size()));
    }
    auto indptr_d = device_copy(compact_indptr);
    auto pages_d = device_copy(compact_indices);
    auto last_d = device_copy(last);
    const kv::PageTableView table{indptr_d.data(), pages_d.data(), last_d.data(), nullptr, batch, page_size};

    // New K/V for every request's new tokens; append (quantize) into both caches.
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

    std::vector<std::uint16_t> outputs[2];
    Cache* caches[2] = {&fp8, &ref};
    for (int c = 0; c < 2; ++c) {
      AppendArguments append;
      append.cache = caches[c]->view;
      append.table = table;
      append.request_status = status.data();
      append.k_new = k_d.data();
      append.v_new = v_d.data();
      append.num_tokens = batch * new_tokens;
      append.append_indptr = ai_d.data();
      if (Status s = append_kv(append, nullptr); !s.ok()) {
        fmt::print("append failed: {}\n", s.to_string());
        return false;
      }
      DecodePlanArguments plan_args{DecodeProblem{batch, kv_heads * group, kv_heads, head_dim, page_size, 1,
                                                  caches[c]->view.dtype},
                                    compact_indptr, last};
      auto bytes = decode_workspace_size(plan_args);
      auto workspace = rt::DeviceBuffer<unsigned char>::create(bytes.ok() ? *bytes : 0);
      auto plan = plan_decode(plan_args, workspace->data(), *bytes, nullptr);
      auto o = rt::DeviceBuffer<std::uint16_t>::create(q.size());
      DecodeArguments args;
      args.cache = caches[c]->view;
      args.table = table;
      args.request_status = status.data();
      args.q = q_d.data();
      args.o = o->data();
      args.sm_scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      if (!plan.ok() || !run_decode(args, *plan, workspace->data(), *bytes, nullptr).ok()) {
        fmt::print("decode failed\n");
        return false;
      }
      outputs[c].resize(q.size());
      (void)o->download(outputs[c]);
    }
    double err2 = 0, ref2 = 0;
    for (std::size_t i = 0; i < q.size(); ++i) {
      const double a = to_float(bf16::from_bits(outputs[0][i])), b = to_float(bf16::from_bits(outputs[1][i]));
      err2 += (a - b) * (a - b);
      ref2 += b * b;
    }
    fmt::print("step {} ({} tokens per request): FP8 e4m3 vs BF16 cache, attention output rel. L2 diff {:.3e}\n",
               step, lengths[0], std::sqrt(err2 / ref2));
    return true;
  };

  if (!run_step(prompt, 0)) return 1;  // prefill chunk
  for (int step = 1; step <= steps; ++step) {
    if (!run_step(1, step)) return 1;
  }
  fmt::print("capacity per GiB of one layer (8 KV heads x 128, page 16):\n");
  const std::pair<KvDtype, KvScaleMode> modes[] = {{KvDtype::bf16, KvScaleMode::none},
                                                   {KvDtype::fp8_e4m3, KvScaleMode::per_tensor},
                                                   {KvDtype::fp8_e4m3, KvScaleMode::per_token}};
  for (auto [dtype, mode] : modes) {
    fmt::print("  {:9} {:10} {:>8} tokens ({} B/token)\n", to_string(dtype), to_string(mode),
               tokens_per_gib(dtype, mode, 8, 128, 16), cache_bytes_per_token(dtype, mode, 8, 128));
  }
  return 0;
}
