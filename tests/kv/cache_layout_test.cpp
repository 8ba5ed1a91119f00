// Cache layout descriptors and transfer lists: every paged format (BF16, FP16, FP8 e4m3/e5m2 x
// NHD/HND x its scale modes, a combined K/V allocation) and every MLA format. Two host caches
// play the two engines: the list's entries are applied with memcpy and every slot of the
// destination is compared with the source slot it must hold (offsets from cache_offset, not
// from the code under test); slots the request does not own keep their poison. Ragged lengths
// (1, page - 1, page, page + 1, long), shuffled pages with holes, merged runs, every refusal.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "slimserve/kv/cache_layout.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::kv;
using attention::KvDtype;
using attention::KvLayout;
using attention::KvScaleMode;
using attention::MlaScaleMode;
using slimserve_test::make_rng;

namespace {

constexpr std::int32_t num_pages = 40;
constexpr std::int32_t page_size = 16;
constexpr std::int32_t heads = 2;
constexpr std::int32_t head_dim = 64;
constexpr unsigned char poison = 0xA5;

struct PagedConfig {
  KvDtype dtype;
  KvLayout layout;
  KvScaleMode scales;
  bool combined;  // K and V pages interleaved in one allocation (page_stride = 2 pages)
};

// One engine's paged cache in host memory (the descriptor only needs addresses).
struct PagedCache {
  PagedConfig config;
  std::vector<unsigned char> kv;  // combined: [num_pages, 2, page]; else K then V
  std::vector<float> k_scales, v_scales, scalars{1.0f, 1.0f};
  attention::PagedKVCacheView view;

  PagedCache(const PagedConfig& c, std::mt19937_64& rng, bool fill) : config(c) {
    const std::int64_t page = static_cast<std::int64_t>(page_size) * heads * head_dim * attention::element_bytes(c.dtype);
    kv.resize(static_cast<std::size_t>(2 * num_pages * page));
    if (fill) {
      for (std::size_t i = 0; i < kv.size(); i += 8) {  // 8 random bytes per draw (sizes are multiples of 8)
        const std::uint64_t word = rng();
        std::memcpy(kv.data() + i, &word, 8);
      }
    } else {
      std::fill(kv.begin(), kv.end(), poison);
    }
    view.num_pages = num_pages;
    view.page_size = page_size;
    view.num_kv_heads = heads;
    view.head_dim = head_dim;
    view.dtype = c.dtype;
    view.layout = c.layout;
    view.scale_mode = c.scales;
    view.k_pages = kv.data();
    if (c.combined) {
      view.v_pages = kv.data() + page;
      view.page_stride = 2 * attention::packed_page_elements(view);
    } else {
      view.v_pages = kv.data() + num_pages * page;
    }
    if (c.scales == KvScaleMode::per_tensor) {
      view.k_scale = &scalars[0];
      view.v_scale = &scalars[1];
    }
    if (c.scales == KvScaleMode::per_token) {
      const auto n = static_cast<std::size_t>(num_pages * page_size * heads);
      k_scales.resize(n);
      v_scales.resize(n);
      for (float& s : k_scales) s = fill ? static_cast<float>(rng() % 1000) / 7.0f + 0.5f : -1.0f;
      for (float& s : v_scales) s = fill ? static_cast<float>(rng() % 1000) / 9.0f + 0.5f : -1.0f;
      view.k_token_scales = k_scales.data();
      view.v_token_scales = v_scales.data();
    }
  }

  // Bytes of element (page, slot, head) of array a (0 K, 1 V, 2 K scales, 3 V scales).
  const unsigned char* at(int a, std::int32_t page, std::int32_t slot, std::int32_t head) const {
    const std::int64_t element = attention::element_bytes(config.dtype);
    if (a < 2) {
      const auto* base = static_cast<const unsigned char*>(a == 0 ? view.k_pages : view.v_pages);
      const std::int64_t stride = view.page_stride == 0 ? attention::packed_page_elements(view) : view.page_stride;
      const std::int64_t within = attention::cache_offset(config.layout, page_size, heads, head_dim, 0, slot, head, 0);
      return base + (page * stride + within) * element;
    }
    const float* scales = a == 2 ? k_scales.data() : v_scales.data();
    return reinterpret_cast<const unsigned char*>(
        scales + attention::cache_offset(config.layout, page_size, heads, 1, page, slot, head, 0));
  }
  std::int64_t unit(int a) const {
    return a < 2 ? head_dim * attention::element_bytes(config.dtype) : static_cast<std::int64_t>(sizeof(float));
  }
  int arrays() const { return config.scales == KvScaleMode::per_token ? 4 : 2; }
};

void apply(std::span<const TransferEntry> entries) {
  for (const TransferEntry& e : entries) {
    std::memcpy(reinterpret_cast<void*>(e.dst), reinterpret_cast<const void*>(e.src), static_cast<std::size_t>(e.bytes));
  }
}

enum class Order { shuffled, ascending, descending };

std::vector<PageId> request_pages(std::mt19937_64& rng, std::int64_t count, Order order) {
  std::vector<PageId> ids(num_pages - 1);
  std::iota(ids.begin(), ids.end(), 1);
  if (order == Order::shuffled) {
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(static_cast<std::size_t>(count));  // holes: the pages not taken
    return ids;
  }
  const auto first = static_cast<std::size_t>(rng() % static_cast<std::uint64_t>(num_pages - count));
  ids = std::vector<PageId>(ids.begin() + static_cast<std::ptrdiff_t>(first),
                            ids.begin() + static_cast<std::ptrdiff_t>(first + static_cast<std::size_t>(count)));
  if (order == Order::descending) std::reverse(ids.begin(), ids.end());  // merged backwards
  return ids;
}

std::vector<PagedConfig> paged_configs() {
  std::vector<PagedConfig> configs;
  for (KvLayout layout : {KvLayout::nhd, KvLayout::hnd}) {
    for (bool combined : {false, true}) {
      configs.push_back({KvDtype::bf16, layout, KvScaleMode::none, combined});
      configs.push_back({KvDtype::fp16, layout, KvScaleMode::per_tensor, combined});
      for (KvDtype fp8 : {KvDtype::fp8_e4m3, KvDtype::fp8_e5m2}) {
        configs.push_back({fp8, layout, KvScaleMode::per_tensor, combined});
        configs.push_back({fp8, layout, KvScaleMode::per_token, combined});
      }
    }
  }
  return configs;
}

std::string message(const Status& status) { return status.to_string(); }

Result<std::int64_t> build(const CacheLayoutDescriptor& src, const CacheLayoutDescriptor& dst,
                           std::span<const PageId> src_pages, std::span<const PageId> dst_pages,
                           std::int64_t tokens, std::span<TransferEntry> out) {
  TransferListArguments arguments;
  arguments.src = src;
  arguments.dst = dst;
  arguments.src_pages = src_pages;
  arguments.dst_pages = dst_pages;
  arguments.num_tokens = tokens;
  return build_transfer_list(arguments, out);
}

}  // namespace

TEST_CASE("paged caches: the transfer list moves exactly the request's filled slots", "[kv][layout]") {
  auto rng = make_rng(1);
  for (const PagedConfig& config : paged_configs()) {
    for (std::int64_t tokens : {std::int64_t{1}, std::int64_t{page_size - 1}, std::int64_t{page_size},
                                std::int64_t{page_size + 1}, std::int64_t{page_size * 23 + 5}}) {
     for (Order order : {Order::shuffled, Order::ascending, Order::descending}) {
      if (order != Order::shuffled && tokens < page_size) continue;  // one page: no run to merge
      CAPTURE(attention::to_string(config.dtype), attention::to_string(config.layout),
              attention::to_string(config.scales), config.combined, tokens, static_cast<int>(order));
      PagedCache src(config, rng, true);
      PagedCache dst(config, rng, false);
      auto src_layout = describe_cache(src.view);
      auto dst_layout = describe_cache(dst.view);
      REQUIRE(src_layout.ok());
      REQUIRE(dst_layout.ok());
      const std::int64_t pages = (tokens + page_size - 1) / page_size;
      const auto src_pages = request_pages(rng, pages, order);
      const auto dst_pages = request_pages(rng, pages, order);
      std::vector<TransferEntry> list(static_cast<std::size_t>(transfer_list_capacity(*src_layout, static_cast<std::int32_t>(pages))));
      auto count = build(*src_layout, *dst_layout, src_pages, dst_pages, tokens, list);
      REQUIRE(count.ok());
      list.resize(static_cast<std::size_t>(*count));
      std::int64_t moved = 0;
      for (const TransferEntry& e : list) moved += e.bytes;
      CHECK(moved == request_transfer_bytes(*src_layout, tokens));
      apply(list);
      // Every slot of every destination page: the source slot when the request owns it, else poison.
      std::vector<std::int32_t> position(num_pages, -1);  // destination page -> request page index
      for (std::size_t i = 0; i < dst_pages.size(); ++i) position[static_cast<std::size_t>(dst_pages[i])] = static_cast<std::int32_t>(i);
      std::int64_t mismatches = 0;
      for (int a = 0; a < src.arrays(); ++a) {
        const auto unit = static_cast<std::size_t>(src.unit(a));
        std::vector<unsigned char> poisoned(unit, poison);
        if (a >= 2) {
          const float minus_one = -1.0f;
          for (std::size_t i = 0; i < unit; i += 4) std::memcpy(poisoned.data() + i, &minus_one, 4);
        }
        for (std::int32_t page = 0; page < num_pages; ++page) {
          for (std::int32_t slot = 0; slot < page_size; ++slot) {
            for (std::int32_t head = 0; head < heads; ++head) {
              const std::int32_t index = position[static_cast<std::size_t>(page)];
              const bool owned = index >= 0 && index * std::int64_t{page_size} + slot < tokens;
              const unsigned char* want =
                  owned ? src.at(a, src_pages[static_cast<std::size_t>(index)], slot, head) : poisoned.data();
              mismatches += std::memcmp(dst.at(a, page, slot, head), want, unit) != 0;
            }
          }
        }
      }
      CHECK(mismatches == 0);
      if (order != Order::shuffled && !config.combined && config.layout == KvLayout::nhd) {
        // One run per array either direction; descending, a partly filled last page (the lowest
        // address) ends short of the run and stays an entry of its own.
        const bool short_last = order == Order::descending && pages > 1 && tokens % page_size != 0;
        CHECK(static_cast<std::int64_t>(list.size()) == src.arrays() * (short_last ? 2 : 1));
      }
     }
    }
  }
}

TEST_CASE("contiguous runs merge into one entry per array", "[kv][layout]") {
  auto rng = make_rng(2);
  for (KvLayout layout : {KvLayout::nhd, KvLayout::hnd}) {
    PagedCache src({KvDtype::fp8_e4m3, layout, KvScaleMode::per_token, false}, rng, true);
    PagedCache dst({KvDtype::fp8_e4m3, layout, KvScaleMode::per_token, false}, rng, false);
    const auto s = describe_cache(src.view).value();
    const auto d = describe_cache(dst.view).value();
    std::vector<PageId> run_a(8), run_b(8);
    std::iota(run_a.begin(), run_a.end(), 3);
    std::iota(run_b.begin(), run_b.end(), 20);
    std::vector<TransferEntry> list(static_cast<std::size_t>(transfer_list_capacity(s, 8)));
    // Full pages, both sides runs: one entry per array.
    auto count = build(s, d, run_a, run_b, 8 * page_size, list);
    REQUIRE(count.ok());
    CHECK(*count == 4);
    CHECK(list[0].bytes == 8 * page_data_bytes(s));
    CHECK(list[2].bytes == 8 * page_scale_bytes(s));
    // A partial last page: NHD continues the run; HND splits the last page per head.
    count = build(s, d, run_a, run_b, 7 * page_size + 3, list);
    REQUIRE(count.ok());
    CHECK(*count == (layout == KvLayout::nhd ? 4 : 4 * heads));
    // A hole on one side breaks the run there.
    run_b[4] = 35;
    count = build(s, d, run_a, run_b, 8 * page_size, list);
    REQUIRE(count.ok());
    CHECK(*count == 4 * 3);
  }
  // A combined K/V allocation: one registration region; K and V stay separate entries.
  PagedCache combined({KvDtype::bf16, KvLayout::nhd, KvScaleMode::none, true}, rng, true);
  const auto c = describe_cache(combined.view).value();
  std::array<CacheArray, 4> regions{};
  REQUIRE(registration_regions(c, regions) == 1);
  CHECK(regions[0].address == reinterpret_cast<std::uintptr_t>(combined.kv.data()));
  CHECK(regions[0].bytes == static_cast<std::int64_t>(combined.kv.size()));
  // K and V in one allocation, the two scale arrays in another with a gap between them: 2 + 1.
  PagedCache separate({KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, false}, rng, true);
  std::vector<float> scales(2 * separate.k_scales.size() + 64);
  separate.view.k_token_scales = scales.data();
  separate.view.v_token_scales = scales.data() + separate.k_scales.size() + 64;
  CHECK(registration_regions(describe_cache(separate.view).value(), regions) == 3);
  separate.view.v_token_scales = scales.data() + separate.k_scales.size();  // touching: merged
  CHECK(registration_regions(describe_cache(separate.view).value(), regions) == 2);
}

TEST_CASE("coalesce_transfer_list: the fewest entries, across arrays, the same bytes", "[kv][layout]") {
  auto rng = make_rng(3);
  for (KvScaleMode scales : {KvScaleMode::per_tensor, KvScaleMode::per_token}) {
    PagedCache src({KvDtype::fp8_e4m3, KvLayout::nhd, scales, true}, rng, true);
    PagedCache dst({KvDtype::fp8_e4m3, KvLayout::nhd, scales, true}, rng, false);
    PagedCache dst_listed({KvDtype::fp8_e4m3, KvLayout::nhd, scales, true}, rng, false);
    const auto s = describe_cache(src.view).value();
    // Runs 9..11 descending, 3..4, 20 (a one-page run) onto runs of the same lengths.
    const std::vector<PageId> src_pages{11, 10, 9, 3, 4, 20};
    const std::vector<PageId> dst_pages{7, 6, 5, 14, 15, 2};
    for (std::int64_t tokens : {6 * page_size, 5 * page_size + 1}) {
      std::vector<TransferEntry> list(static_cast<std::size_t>(transfer_list_capacity(s, 6)));
      auto count = build(s, describe_cache(dst_listed.view).value(), src_pages, dst_pages, tokens, list);
      REQUIRE(count.ok());
      apply(std::span(list).first(static_cast<std::size_t>(*count)));  // the per-array list, reference
      count = build(s, describe_cache(dst.view).value(), src_pages, dst_pages, tokens, list);
      REQUIRE(count.ok());
      const std::int64_t before = *count;
      const std::int64_t merged = coalesce_transfer_list(std::span(list).first(static_cast<std::size_t>(before)));
      // K/V of a combined allocation: one entry per run; per-token scales: one more per run each.
      const std::int64_t runs = 3, per_run = scales == KvScaleMode::per_token ? 3 : 1;
      if (tokens % page_size == 0) {
        CHECK(merged == runs * per_run);
      } else {
        CHECK(merged <= runs * per_run + 2);  // the partly filled page's pieces break its run
      }
      CHECK(merged < before);
      std::int64_t bytes = 0;
      for (std::int64_t i = 0; i < merged; ++i) {
        bytes += list[static_cast<std::size_t>(i)].bytes;
        if (i > 0) CHECK(list[static_cast<std::size_t>(i)].src > list[static_cast<std::size_t>(i - 1)].src);
      }
      CHECK(bytes == request_transfer_bytes(s, tokens));
      apply(std::span(list).first(static_cast<std::size_t>(merged)));
      CHECK(dst.kv == dst_listed.kv);  // every byte where the per-array list put it, nothing else
      CHECK(dst.k_scales == dst_listed.k_scales);
      CHECK(dst.v_scales == dst_listed.v_scales);
    }
  }
  std::vector<TransferEntry> none;
  CHECK(coalesce_transfer_list(none) == 0);
}

TEST_CASE("MLA latent caches: every format, records moved whole", "[kv][layout][mla]") {
  auto rng = make_rng(3);
  const std::pair<KvDtype, MlaScaleMode> formats[] = {{KvDtype::bf16, MlaScaleMode::none},
                                                      {KvDtype::fp8_e4m3, MlaScaleMode::per_tensor},
                                                      {KvDtype::fp8_e4m3, MlaScaleMode::per_token_group}};
  float scale = 1.0f;
  for (auto [dtype, mode] : formats) {
    for (std::int64_t tokens : {std::int64_t{1}, std::int64_t{63}, std::int64_t{64}, std::int64_t{65}, std::int64_t{64 * 9 + 17}}) {
      CAPTURE(attention::to_string(dtype), attention::to_string(mode), tokens);
      constexpr std::int32_t mla_page = 64;
      attention::MlaCacheView src_view, dst_view;
      for (auto* v : {&src_view, &dst_view}) {
        v->num_pages = 16;
        v->page_size = mla_page;
        v->dtype = dtype;
        v->scale_mode = mode;
        v->latent_scale = mode == MlaScaleMode::per_tensor ? &scale : nullptr;
      }
      const auto record = static_cast<std::size_t>(src_view.token_layout().token_bytes);
      std::vector<unsigned char> src_bytes(static_cast<std::size_t>(src_view.bytes()) + 16), dst_bytes(src_bytes.size(), poison);
      for (std::size_t i = 0; i + 8 <= src_bytes.size(); i += 8) {
        const std::uint64_t word = rng();
        std::memcpy(src_bytes.data() + i, &word, 8);
      }
      auto align = [](std::vector<unsigned char>& v) {
        return reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(v.data()) + 15) / 16 * 16);
      };
      unsigned char* src_base = align(src_bytes);
      unsigned char* dst_base = align(dst_bytes);
      src_view.pages = src_base;
      dst_view.pages = dst_base;
      auto s = describe_cache(src_view);
      auto d = describe_cache(dst_view);
      REQUIRE(s.ok());
      REQUIRE(d.ok());
      CHECK(s->token_bytes == static_cast<std::int32_t>(record));
      const std::int64_t pages = (tokens + mla_page - 1) / mla_page;
      std::vector<PageId> src_pages(static_cast<std::size_t>(pages)), dst_pages(static_cast<std::size_t>(pages));
      std::vector<PageId> ids(15);
      std::iota(ids.begin(), ids.end(), 1);
      std::shuffle(ids.begin(), ids.end(), rng);
      std::copy_n(ids.begin(), pages, src_pages.begin());
      std::shuffle(ids.begin(), ids.end(), rng);
      std::copy_n(ids.begin(), pages, dst_pages.begin());
      std::vector<TransferEntry> list(static_cast<std::size_t>(transfer_list_capacity(*s, static_cast<std::int32_t>(pages))));
      auto count = build(*s, *d, src_pages, dst_pages, tokens, list);
      REQUIRE(count.ok());
      apply(std::span(list).first(static_cast<std::size_t>(*count)));
      std::vector<std::int32_t> position(16, -1);
      for (std::size_t i = 0; i < dst_pages.size(); ++i) position[static_cast<std::size_t>(dst_pages[i])] = static_cast<std::int32_t>(i);
      std::vector<unsigned char> poisoned(record, poison);
      std::int64_t mismatches = 0;
      for (std::int32_t page = 0; page < 16; ++page) {
        for (std::int32_t slot = 0; slot < mla_page; ++slot) {
          const std::int32_t index = position[static_cast<std::size_t>(page)];
          const bool owned = index >= 0 && index * std::int64_t{mla_page} + slot < tokens;
          const unsigned char* want =
              owned ? src_base + (static_cast<std::size_t>(src_pages[static_cast<std::size_t>(index)]) * mla_page + slot) * record
                    : poisoned.data();
          mismatches += std::memcmp(dst_base + (static_cast<std::size_t>(page) * mla_page + slot) * record, want, record) != 0;
        }
      }
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("the receiver refuses a mismatched layout naming the field", "[kv][layout]") {
  auto rng = make_rng(4);
  PagedCache base({KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, false}, rng, true);
  const auto local = describe_cache(base.view).value();
  struct Case {
    const char* field;
    void (*mutate)(PagedConfig&, attention::PagedKVCacheView&);
  };
  const Case cases[] = {
      {"dtype (format)", [](PagedConfig&, attention::PagedKVCacheView& v) { v.dtype = KvDtype::fp8_e5m2; }},
      {"layout", [](PagedConfig&, attention::PagedKVCacheView& v) { v.layout = KvLayout::hnd; }},
      {"scale_mode", [](PagedConfig&, attention::PagedKVCacheView& v) {
         v.scale_mode = KvScaleMode::per_tensor;
         static float one = 1.0f;
         v.k_scale = v.v_scale = &one;
       }},
      {"page_size", [](PagedConfig&, attention::PagedKVCacheView& v) { v.page_size = 32; v.num_pages /= 2; }},
      {"num_kv_heads", [](PagedConfig&, attention::PagedKVCacheView& v) { v.num_kv_heads = 1; }},
      {"head_dim", [](PagedConfig&, attention::PagedKVCacheView& v) { v.head_dim = 128; v.num_pages /= 2; }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.field);
    PagedConfig config = base.config;
    attention::PagedKVCacheView view = base.view;
    c.mutate(config, view);
    auto remote = describe_cache(view);
    REQUIRE(remote.ok());
    const Status status = check_layout_compatible(local, *remote);
    REQUIRE(status.code() == StatusCode::invalid_argument);
    CHECK_THAT(message(status), Catch::Contains(std::string("mismatch: ") + c.field));
    // The list builder runs the same check first and writes nothing.
    std::vector<PageId> pages{1};
    std::vector<TransferEntry> list(8, TransferEntry{7, 7, 7});
    auto count = build(*remote, local, pages, pages, 1, list);
    REQUIRE_FALSE(count.ok());
    CHECK(std::all_of(list.begin(), list.end(), [](const TransferEntry& e) { return e == TransferEntry{7, 7, 7}; }));
  }
  // Paged vs MLA.
  attention::MlaCacheView mla;
  alignas(16) static unsigned char pages[16 * 16 * 1152];
  mla.pages = pages;
  mla.num_pages = 16;
  mla.page_size = 16;
  const auto latent = describe_cache(mla).value();
  CHECK_THAT(message(check_layout_compatible(local, latent)), Catch::Contains("mismatch: kind"));
  // Different page counts, addresses and strides are fine.
  PagedCache other({KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, true}, rng, false);
  CHECK(check_layout_compatible(local, describe_cache(other.view).value()).ok());
}

TEST_CASE("descriptors round-trip as bytes; corrupted bytes are refused", "[kv][layout]") {
  auto rng = make_rng(5);
  PagedCache cache({KvDtype::fp8_e5m2, KvLayout::hnd, KvScaleMode::per_token, false}, rng, true);
  const auto layout = describe_cache(cache.view).value();
  const auto bytes = serialize_cache_layout(layout);
  auto parsed = parse_cache_layout(bytes);
  REQUIRE(parsed.ok());
  CHECK(*parsed == layout);
  CHECK(parse_cache_layout(std::span(bytes).first(100)).status().code() == StatusCode::data_loss);
  auto corrupt = [&](std::size_t offset, std::uint8_t value) {
    auto copy = bytes;
    copy[offset] = std::byte{value};
    return parse_cache_layout(copy).status();
  };
  CHECK(corrupt(0, 0).code() == StatusCode::data_loss);               // magic
  CHECK(corrupt(4, 9).code() == StatusCode::unsupported);             // version
  CHECK_THAT(message(corrupt(8, 7)), Catch::Contains("unknown kind"));
  CHECK_THAT(message(corrupt(9, 9)), Catch::Contains("unknown dtype"));
  CHECK_THAT(message(corrupt(11, 3)), Catch::Contains("unknown scale mode"));
  CHECK_THAT(message(corrupt(11, 0)), Catch::Contains("needs scales"));
  CHECK_THAT(message(corrupt(16, 17)), Catch::Contains("page_size 17"));
  CHECK_THAT(message(corrupt(28, 5)), Catch::Contains("token_bytes"));
  CHECK_THAT(message(corrupt(32, 2)), Catch::Contains("num_arrays"));
  CHECK_THAT(message(corrupt(40 + 9, 0)), Catch::Contains("page_stride"));  // K's stride below a page
  CHECK_THAT(message(corrupt(40 + 17, 0)), Catch::Contains("spans"));       // K's span
  auto no_address = layout;
  no_address.v_scales.address = 0;
  CHECK_THAT(message(validate_cache_layout(no_address)), Catch::Contains("v_scales has address 0"));
}

TEST_CASE("transfer lists refuse bad page lists and short outputs, writing nothing", "[kv][layout]") {
  auto rng = make_rng(6);
  PagedCache a({KvDtype::bf16, KvLayout::nhd, KvScaleMode::none, false}, rng, true);
  PagedCache b({KvDtype::bf16, KvLayout::nhd, KvScaleMode::none, false}, rng, false);
  const auto s = describe_cache(a.view).value();
  const auto d = describe_cache(b.view).value();
  std::vector<TransferEntry> list(16, TransferEntry{7, 7, 7});
  auto refused = [&](std::vector<PageId> src, std::vector<PageId> dst, std::int64_t tokens, std::size_t capacity = 16) {
    auto count = build(s, d, src, dst, tokens, std::span(list).first(capacity));
    REQUIRE_FALSE(count.ok());
    CHECK(std::all_of(list.begin(), list.end(), [](const TransferEntry& e) { return e == TransferEntry{7, 7, 7}; }));
    return message(count.status());
  };
  CHECK_THAT(refused({1, 2}, {3, 4}, 0), Catch::Contains("num_tokens 0"));
  CHECK_THAT(refused({1, 2}, {3, 4}, 33), Catch::Contains("need 3 pages"));
  CHECK_THAT(refused({1, 2}, {3}, 20), Catch::Contains("need 2 pages"));
  CHECK_THAT(refused({0, 2}, {3, 4}, 20), Catch::Contains("guard page"));
  CHECK_THAT(refused({1, 2}, {3, num_pages}, 20), Catch::Contains("destination page 1 is 40"));
  CHECK_THAT(refused({1, 2}, {4, 4}, 20), Catch::Contains("destination page 4 is listed twice"));
  CHECK_THAT(refused({2, 2}, {3, 4}, 20), Catch::Contains("source page 2 is listed twice"));
  CHECK_THAT(refused({1, 2}, {3, 4}, 20, 3), Catch::Contains("transfer_list_capacity"));
}
