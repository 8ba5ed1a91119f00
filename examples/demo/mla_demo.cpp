// MLA part of the slimserve demo: a Kimi K2-like latent cache. Prints the context capacity of
// the cache records (BF16 vs FP8 e4m3 with FlashMLA-style group scales) measured on real cache
// views, then appends a prompt into both caches and runs one absorbed MLA decode step
// (64 heads, as one tensor-parallel slice of Kimi K2), printing the FP8-vs-BF16 difference.
#include <fmt/core.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "slimserve/attention/mla.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/runtime/memory.hpp"

namespace {

using namespace slimserve;
using namespace slimserve::attention;

constexpr int batch = 2, heads = 64, page_size = 64, num_pages = 16;
constexpr int kimi_layers = 61;  // Kimi K2: 61 MLA layers, latent 512 + rope 64

template <class T>
rt::DeviceBuffer<T> device_copy(const std::vector<T>& host) {
  auto buffer = rt::DeviceBuffer<T>::create(host.size());
  if (!buffer.ok()) return {};
  (void)buffer->upload(std::span<const T>(host));
  return std::move(*buffer);
}

struct LatentCache {
  rt::DeviceBuffer<unsigned char> pages;
  rt::DeviceBuffer<float> scale;
  MlaCacheView view;
  LatentCache(KvDtype dtype, MlaScaleMode mode) {
    view.num_pages = num_pages;
    view.page_size = page_size;
    view.dtype = dtype;
    view.scale_mode = mode;
    pages = device_copy(std::vector<unsigned char>(static_cast<std::size_t>(view.bytes()), 0));
    scale = device_copy(std::vector<float>{0.05f});
    view.pages = pages.data();
    view.latent_scale = scale.data();
  }
};

}  // namespace

int demo_mla() {
  // Capacity: bytes per token come from the views the kernels use.
  const LatentCache bf16_cache(KvDtype::bf16, MlaScaleMode::none);
  const LatentCache fp8_cache(KvDtype::fp8_e4m3, MlaScaleMode::per_token_group);
  const LatentCache fp8_tensor_cache(KvDtype::fp8_e4m3, MlaScaleMode::per_tensor);
  // A KV budget that holds ~686K BF16 tokens across the model (the headline figure).
  const std::int64_t budget = std::int64_t{686} * 1000 * kimi_layers * bf16_cache.view.token_layout().token_bytes;
  fmt::print("Kimi K2-like MLA cache ({} layers, latent 512 + rope 64, page {}), KV budget {:.1f} GB:\n",
             kimi_layers, page_size, static_cast<double>(budget) / 1e9);
  for (const LatentCache* c : {&bf16_cache, &fp8_cache, &fp8_tensor_cache}) {
    const std::int64_t page_bytes = c->view.bytes() / c->view.num_pages;  // of the real view
    const std::int64_t pages = budget / (page_bytes * kimi_layers);
    fmt::print("  {:9} {:16} {:5} B/token/layer -> {:>9} tokens of context\n", to_string(c->view.dtype),
               to_string(c->view.scale_mode), page_bytes / page_size, pages * page_size);
  }
  fmt::print("  (FP8 is {:.2f}x BF16, not 2x: the 64 rope values stay BF16 and the group scales add 16 B)\n",
             static_cast<double>(bf16_cache.view.token_layout().token_bytes) / fp8_cache.view.token_layout().token_bytes);

  // One decode step: requests of 150 and 700 tokens (the last one is this step's token).
  std::mt19937_64 rng(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<std::int32_t> lengths{150, 700};
  std::vector<std::int32_t> indptr{0}, indices, last_page_len;
  std::int32_t next_page = num_pages - 1;  // pages handed out from the top, out of order
  for (const std::int32_t len : lengths) {
    const std::int32_t pages = (len + page_size - 1) / page_size;
    for (std::int32_t i = 0; i < pages; ++i) indices.push_back(next_page--);
    indptr.push_back(static_cast<std::int32_t>(indices.size()));
    last_page_len.push_back(len - (pages - 1) * page_size);
  }
  std::int32_t tokens = 0;
  std::vector<std::int32_t> append_indptr{0};
  for (const std::int32_t len : lengths) append_indptr.push_back(tokens += len);
  std::vector<std::uint16_t> latent(static_cast<std::size_t>(tokens) * mla_latent_dim), rope(static_cast<std::size_t>(tokens) * mla_rope_dim);
  for (std::size_t i = 0; i < latent.size(); ++i) latent[i] = from_float<bf16>(normal(rng) * (i % mla_latent_dim == 7 ? 12.0f : 1.0f)).bits;
  for (auto& r : rope) r = from_float<bf16>(normal(rng)).bits;
  std::vector<std::uint16_t> q(std::size_t{batch} * heads * mla_qk_dim);
  for (auto& x : q) x = from_float<bf16>(normal(rng)).bits;

  auto indptr_dev = device_copy(indptr);
  auto indices_dev = device_copy(indices);
  auto last_dev = device_copy(last_page_len);
  auto append_dev = device_copy(append_indptr);
  auto latent_dev = device_copy(latent);
  auto rope_dev = device_copy(rope);
  auto q_dev = device_copy(q);
  const kv::PageTableView table{indptr_dev.data(), indices_dev.data(), last_dev.data(), nullptr, batch, page_size};

  std::vector<std::vector<float>> outputs;
  for (const LatentCache* c : {&bf16_cache, &fp8_cache}) {
    MlaAppendArguments append;
    append.cache = c->view;
    append.table = table;
    append.latent_new = latent_dev.data();
    append.rope_new = rope_dev.data();
    append.num_tokens = tokens;
    append.append_indptr = append_dev.data();
    if (Status s = append_mla(append, nullptr); !s.ok()) {
      fmt::print("append failed: {}\n", s.message());
      return 1;
    }
    MlaDecodePlanArguments plan_args;
    plan_args.problem = {batch, heads, 1, page_size, c->view.dtype, c->view.scale_mode};
    plan_args.kv_indptr_host = indptr;
    plan_args.last_page_len_host = last_page_len;
    plan_args.num_sms = 8;  // the size query and the plan must agree on the device size
    auto bytes = mla_decode_workspace_size(plan_args);
    if (!bytes.ok()) {
      fmt::print("workspace size failed: {}\n", bytes.status().message());
      return 1;
    }
    auto workspace = rt::DeviceBuffer<unsigned char>::create(*bytes);
    if (!workspace.ok()) return 1;
    auto plan = plan_mla_decode(plan_args, workspace->data(), *bytes, nullptr);
    if (!plan.ok()) {
      fmt::print("plan failed: {}\n", plan.status().message());
      return 1;
    }
    auto o_dev = device_copy(std::vector<std::uint16_t>(std::size_t{batch} * heads * mla_latent_dim));
    MlaDecodeArguments args;
    args.cache = c->view;
    args.table = table;
    args.q = q_dev.data();
    args.o = o_dev.data();
    args.sm_scale = 1.0f / std::sqrt(192.0f);
    if (Status s = run_mla_decode(args, *plan, workspace->data(), *bytes, nullptr); !s.ok()) {
      fmt::print("decode failed: {}\n", s.message());
      return 1;
    }
    std::vector<std::uint16_t> o(std::size_t{batch} * heads * mla_latent_dim);
    (void)o_dev.download(std::span<std::uint16_t>(o));
    (void)rt::stream_synchronize(nullptr);
    std::vector<float> values;
    for (const std::uint16_t bits : o) values.push_back(to_float(bf16::from_bits(bits)));
    outputs.push_back(std::move(values));
    fmt::print("MLA decode step, {} latent ({}): {} requests x {} heads, {} CTAs{}\n", to_string(c->view.dtype),
               to_string(c->view.scale_mode), batch, heads, plan->num_work_items,
               plan->split_kv ? fmt::format(" (split-KV, chunks of {} tokens)", plan->chunk_tokens) : "");
  }
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < outputs[0].size(); ++i) {
    diff += (outputs[1][i] - outputs[0][i]) * static_cast<double>(outputs[1][i] - outputs[0][i]);
    norm += static_cast<double>(outputs[0][i]) * outputs[0][i];
  }
  const double rel = std::sqrt(diff / norm);
  fmt::print("FP8 vs BF16 latent: relative L2 difference of the output {:.2e}\n", rel);
  return std::isfinite(rel) && rel < 0.1 ? 0 : 1;
}
