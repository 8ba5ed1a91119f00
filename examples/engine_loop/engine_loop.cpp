// The engine loop over the C++ API, as a C++ engine wires slimserve into its scheduler:
//
//   admit A (no prefix hit) -> append its prompt -> decode -> append one token -> finish
//   (index its full pages, release) -> admit B with A's prompt (prefix hit on 2 pages, A's
//   freed last page reused under a new tag) -> append the rest -> decode B together with a
//   "zombie" that still holds A's old handles: the GPU tag check aborts the zombie (its rows
//   come back NaN) and B's output equals A's, bit for bit.
//
// Built against slimserve::emulated it runs on the CPU (CI, laptops); the same source built
// by nvcc against slimserve::slimserve runs on a GPU. docs/testing-without-gpu.md shows it.
// Exit status 0 when every check passed. The same loop exists over the C ABI (engine_loop.c)
// and in Python (python/examples/engine_loop.py).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <span>
#include <vector>

#include "slimserve/attention/append.hpp"
#include "slimserve/attention/decode.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/prefix_cache.hpp"
#include "slimserve/kv/tag_check.hpp"
#include "slimserve/runtime/memory.hpp"

namespace {

using namespace slimserve;
namespace attn = slimserve::attention;

int failures = 0;
#define EXPECT(condition)                                                        \
  do {                                                                           \
    if (!(condition)) {                                                          \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition); \
      ++failures;                                                                \
    }                                                                            \
  } while (0)

// value() is checked: an error here throws BadResultAccess naming the status.
template <class T>
T must(Result<T> result) {
  return std::move(result).value();
}
void must(const Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "engine_loop: %s\n", status.to_string().c_str());
    std::exit(1);
  }
}

constexpr std::int32_t page_size = 16, num_pages = 64, kv_heads = 2, qo_heads = 4, head_dim = 64;
constexpr std::int32_t prompt = 40;
std::uint64_t seed = 0;

// A stand-in model: K (which 0), V (1) and queries (2) as a pure function of (token, position).
float model_value(std::int32_t token, std::int32_t position, std::int32_t head, std::int32_t d, int which) {
  std::uint64_t x = seed ^ (std::uint64_t(std::uint32_t(token)) << 40) ^
                    (std::uint64_t(std::uint32_t(position)) << 20) ^
                    (std::uint64_t(std::uint32_t(head)) << 10) ^ std::uint64_t(std::uint32_t(d)) ^
                    (std::uint64_t(which) << 62);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
std::uint16_t bf16_bits(float value) { return from_float<bf16>(value).bits; }
float from_bits(std::uint16_t bits) { return to_float(bf16::from_bits(bits)); }

template <class T>
rt::DeviceBuffer<T> upload(const std::vector<T>& host) {
  auto buffer = must(rt::DeviceBuffer<T>::create(host.size()));
  must(buffer.upload(host));
  return buffer;
}

struct Sequence {
  std::vector<kv::TokenId> tokens;
  std::vector<kv::PageHandle> pages;  // what the scheduler owns: (page id, tag) pairs
  std::int32_t stored_tokens = 0;     // tokens whose K/V are in the pages
};

struct Engine {
  kv::PagePool pool = must(kv::PagePool::create({num_pages}));
  std::unique_ptr<kv::PrefixCache> cache = must(kv::PrefixCache::create(pool, {page_size, 0x5eed}));
  kv::DeviceTagArray device_tags = must(kv::DeviceTagArray::create(num_pages));
  kv::PageTableStorage table_storage = must(kv::PageTableStorage::create(4, 64));
  rt::DeviceBuffer<kv::RequestStatus> statuses = must(rt::DeviceBuffer<kv::RequestStatus>::create(4));
  rt::DeviceBuffer<std::uint16_t> k_pages, v_pages;
  attn::PagedKVCacheView kv_cache;
  const kv::CacheKeyExtras tenant{/*cache_salt=*/42, /*adapter_id=*/0};

  Engine() {
    const std::size_t elements = std::size_t{num_pages} * page_size * kv_heads * head_dim;
    k_pages = must(rt::DeviceBuffer<std::uint16_t>::create(elements));
    v_pages = must(rt::DeviceBuffer<std::uint16_t>::create(elements));
    kv_cache.k_pages = k_pages.data();
    kv_cache.v_pages = v_pages.data();
    kv_cache.num_pages = num_pages;
    kv_cache.page_size = page_size;
    kv_cache.num_kv_heads = kv_heads;
    kv_cache.head_dim = head_dim;
    kv_cache.dtype = attn::KvDtype::bf16;
  }

  // Admission: cached prefix pages (never the last token: it must be computed), then fresh
  // pages, all or nothing. Returns the number of prefix hits.
  std::int32_t admit(Sequence& s) {
    s.pages.assign((s.tokens.size() + page_size - 1) / page_size, kv::PageHandle{});
    const std::int32_t hits = must(cache->match_prefix(
        std::span<const kv::TokenId>(s.tokens.data(), s.tokens.size() - 1), tenant, s.pages));
    must(pool.allocate(std::span(s.pages).subspan(static_cast<std::size_t>(hits))));
    s.stored_tokens = hits * page_size;
    return hits;
  }

  // Build + upload the batch's table, sync tags, run the tag check. Returns the device view.
  kv::PageTableView schedule(std::span<Sequence* const> batch, kv::PageTableView& host_table) {
    std::vector<kv::RequestPages> requests;
    for (const Sequence* s : batch) requests.push_back({s->pages, std::int64_t(s->tokens.size())});
    host_table = must(kv::build_page_table(requests, {page_size, num_pages}, table_storage.host()));
    must(device_tags.sync(pool, nullptr));
    const kv::PageTableView table =
        must(kv::upload_page_table(host_table, num_pages, table_storage.device(), nullptr));
    must(kv::check_page_tags({table, &device_tags, statuses.data(), nullptr}, nullptr));
    return table;
  }

  // Append the tokens not yet stored (explicit form: request 0 at their positions).
  void append_pending(Sequence& s) {
    std::vector<std::uint16_t> k, v;
    std::vector<std::int32_t> request, position;
    for (std::int32_t pos = s.stored_tokens; pos < std::int32_t(s.tokens.size()); ++pos) {
      request.push_back(0);
      position.push_back(pos);
      for (std::int32_t h = 0; h < kv_heads; ++h) {
        for (std::int32_t d = 0; d < head_dim; ++d) {
          k.push_back(bf16_bits(model_value(s.tokens[std::size_t(pos)], pos, h, d, 0)));
          v.push_back(bf16_bits(model_value(s.tokens[std::size_t(pos)], pos, h, d, 1)));
        }
      }
    }
    Sequence* batch[] = {&s};
    kv::PageTableView host_table;
    const kv::PageTableView table = schedule(batch, host_table);
    auto k_new = upload(k), v_new = upload(v);
    auto d_request = upload(request), d_position = upload(position);
    attn::AppendArguments args;
    args.cache = kv_cache;
    args.table = table;
    args.request_status = statuses.data();
    args.k_new = k_new.data();
    args.v_new = v_new.data();
    args.num_tokens = std::int32_t(request.size());
    args.token_request = d_request.data();
    args.token_position = d_position.data();
    must(attn::append_kv(args, nullptr));
    must(rt::stream_synchronize(nullptr));
    s.stored_tokens = std::int32_t(s.tokens.size());
  }

  // One decode step: plan (host) + run (device). Returns o [batch, qo_heads, head_dim] BF16.
  std::vector<std::uint16_t> decode(std::span<Sequence* const> batch, std::vector<kv::RequestStatus>& verdicts) {
    std::vector<std::uint16_t> q;
    for (const Sequence* s : batch) {
      const auto last = std::int32_t(s->tokens.size()) - 1;
      for (std::int32_t h = 0; h < qo_heads; ++h)
        for (std::int32_t d = 0; d < head_dim; ++d)
          q.push_back(bf16_bits(model_value(s->tokens[std::size_t(last)], last, h, d, 2)));
    }
    kv::PageTableView host_table;
    const kv::PageTableView table = schedule(batch, host_table);
    const auto batch_size = std::int32_t(batch.size());
    const attn::DecodePlanArguments plan_args{
        {batch_size, qo_heads, kv_heads, head_dim, page_size, 1, attn::KvDtype::bf16},
        std::span<const std::int32_t>(host_table.indptr, batch.size() + 1),
        std::span<const std::int32_t>(host_table.last_page_len, batch.size())};
    const std::size_t bytes = must(attn::decode_workspace_size(plan_args));
    auto workspace = must(rt::DeviceBuffer<unsigned char>::create(bytes));
    const attn::DecodePlan plan = must(attn::plan_decode(plan_args, workspace.data(), bytes, nullptr));
    auto d_q = upload(q);
    auto d_o = must(rt::DeviceBuffer<std::uint16_t>::create(q.size()));
    attn::DecodeArguments args;
    args.cache = kv_cache;
    args.table = table;
    args.request_status = statuses.data();
    args.q = d_q.data();
    args.o = d_o.data();
    args.sm_scale = 1.0f / std::sqrt(float(head_dim));
    must(attn::run_decode(args, plan, workspace.data(), bytes, nullptr));
    std::vector<std::uint16_t> o(q.size());
    must(d_o.download(o));
    verdicts.resize(batch.size());
    must(kv::copy_statuses_to_host(statuses.data(), verdicts, nullptr));
    must(rt::stream_synchronize(nullptr));
    return o;
  }

  // Completion: index the full pages for reuse, then drop this sequence's references.
  void finish(Sequence& s) {
    (void)must(cache->insert(s.tokens, tenant, s.pages));
    must(pool.release(std::span<const kv::PageHandle>(s.pages)));
  }
};

// FP64 reference of one request's decode from the BF16 values the cache holds.
double max_reference_error(const Sequence& s, std::span<const std::uint16_t> o) {
  const auto length = std::int32_t(s.tokens.size());
  const std::int32_t last = length - 1, group = qo_heads / kv_heads;
  auto value = [&](std::int32_t t, std::int32_t h, std::int32_t d, int which) {
    return double(from_bits(bf16_bits(model_value(s.tokens[std::size_t(t)], t, h, d, which))));
  };
  double worst = 0.0;
  for (std::int32_t h = 0; h < qo_heads; ++h) {
    std::vector<double> scores(static_cast<std::size_t>(length));
    double top = -INFINITY, total = 0.0;
    for (std::int32_t t = 0; t < length; ++t) {
      double dot = 0.0;
      for (std::int32_t d = 0; d < head_dim; ++d) dot += value(last, h, d, 2) * value(t, h / group, d, 0);
      scores[std::size_t(t)] = dot / std::sqrt(double(head_dim));
      top = std::max(top, scores[std::size_t(t)]);
    }
    for (double score : scores) total += std::exp(score - top);
    for (std::int32_t d = 0; d < head_dim; ++d) {
      double out = 0.0;
      for (std::int32_t t = 0; t < length; ++t)
        out += std::exp(scores[std::size_t(t)] - top) / total * value(t, h / group, d, 1);
      const double got = from_bits(o[std::size_t(h * head_dim + d)]);
      const double error = std::fabs(got - out) / (1.0 + std::fabs(out));
      if (!(error <= worst)) worst = error;  // NaN propagates
    }
  }
  return worst;
}

}  // namespace

int main() {
  const char* seed_text = std::getenv("SLIMSERVE_TEST_SEED");
  seed = seed_text != nullptr ? std::strtoull(seed_text, nullptr, 10) : std::uint64_t(std::time(nullptr));
  std::printf("engine_loop (C++ API, %s): seed %llu\n", rt::device_count() > 0 ? "GPU" : "CPU emulator",
              static_cast<unsigned long long>(seed));
  Engine engine;
  std::vector<kv::RequestStatus> verdicts;

  // A: admit (no hit), append the prompt, decode.
  Sequence a;
  for (std::int32_t i = 0; i < prompt; ++i) a.tokens.push_back(1000 + 7 * i);
  EXPECT(engine.admit(a) == 0);
  engine.append_pending(a);
  Sequence* batch_a[] = {&a};
  const std::vector<std::uint16_t> o_a = engine.decode(batch_a, verdicts);
  EXPECT(kv::request_ok(verdicts[0]));
  EXPECT(max_reference_error(a, o_a) < 1.0 / 64);

  // A generates one token: its last page has room and is not shared, so no copy.
  const kv::AppendTarget target = must(engine.pool.prepare_append(a.pages.back()));
  EXPECT(!target.needs_copy && target.page == a.pages.back());
  a.tokens.push_back(5);
  engine.append_pending(a);

  // Finish A: its two full pages stay cached; its last page goes back to the free list.
  const Sequence zombie = a;  // an engine bug: a stale copy of A's handles
  engine.finish(a);

  // B: A's prompt again. Prefix hit on A's full pages; A's freed page comes back re-tagged.
  Sequence b;
  b.tokens.assign(a.tokens.begin(), a.tokens.begin() + prompt);
  EXPECT(engine.admit(b) == 2);
  EXPECT(b.pages[0] == a.pages[0] && b.pages[1] == a.pages[1]);
  EXPECT(b.pages[2].id == a.pages[2].id && b.pages[2].tag != a.pages[2].tag);
  EXPECT(engine.pool.validate(zombie.pages[2]).code() == StatusCode::stale_handle);
  EXPECT(b.stored_tokens == 2 * page_size);
  engine.append_pending(b);  // positions 32..39 only

  // Decode B with the zombie in the batch: the tag check aborts only the zombie.
  Sequence zombie_copy = zombie;
  Sequence* batch_b[] = {&b, &zombie_copy};
  const std::vector<std::uint16_t> o_b = engine.decode(batch_b, verdicts);
  EXPECT(kv::request_ok(verdicts[0]));
  EXPECT(verdicts[1].state == kv::RequestState::stale_tag && verdicts[1].failed_slot == 2);
  EXPECT(std::equal(o_a.begin(), o_a.end(), o_b.begin()));  // reused pages: same attention, bit for bit
  for (std::size_t i = o_a.size(); i < o_b.size(); ++i) EXPECT(std::isnan(from_bits(o_b[i])));

  engine.finish(b);
  if (failures != 0) {
    std::fprintf(stderr, "engine_loop: %d check(s) failed (seed %llu)\n", failures,
                 static_cast<unsigned long long>(seed));
    return 1;
  }
  std::printf("engine_loop: admit, prefix hit, append, decode, finish, reuse and the stale page: ok\n");
  return 0;
}
