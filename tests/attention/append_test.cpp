// Fused quantize-and-append: every byte of the cache after an append equals the host
// quantizer's image (appended slots bit-exact, every other byte untouched), aborted requests
// and out-of-range destinations write nothing, and dequantize_pages returns stored * scale.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "attention_test_support.hpp"
#include "slimserve/attention/append.hpp"
#include "slimserve/attention/dequantize.hpp"

using namespace attn_test;

namespace {

struct AppendCase {
  KvDtype dtype;
  KvLayout layout;
  KvScaleMode scale_mode;
  int head_dim;
  int num_kv_heads;
  int page_size;
  ActivationDtype input;
};

std::vector<AppendCase> append_grid() {
  using enum KvDtype;
  return {
      {fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 128, 2, 16, ActivationDtype::bf16},
      {fp8_e5m2, KvLayout::hnd, KvScaleMode::per_token, 64, 3, 32, ActivationDtype::fp16},
      {fp8_e4m3, KvLayout::hnd, KvScaleMode::per_token, 256, 1, 16, ActivationDtype::bf16},
      {bf16, KvLayout::hnd, KvScaleMode::none, 256, 1, 16, ActivationDtype::bf16},
      {fp16, KvLayout::nhd, KvScaleMode::per_tensor, 128, 2, 64, ActivationDtype::fp16},
      // head_dim 96 and 192: 12 and 24 active lanes of 16- and 32-lane groups (kv_store.cuh);
      // 5 and 3 heads leave heads of the last block idle.
      {fp8_e4m3, KvLayout::nhd, KvScaleMode::per_tensor, 96, 5, 16, ActivationDtype::bf16},
      {fp8_e4m3, KvLayout::hnd, KvScaleMode::per_token, 192, 3, 32, ActivationDtype::fp16},
      {fp8_e5m2, KvLayout::hnd, KvScaleMode::per_token, 96, 2, 16, ActivationDtype::fp16},
      {fp8_e5m2, KvLayout::nhd, KvScaleMode::per_tensor, 192, 1, 16, ActivationDtype::bf16},
      {bf16, KvLayout::nhd, KvScaleMode::per_tensor, 96, 3, 16, ActivationDtype::bf16},
      {fp16, KvLayout::hnd, KvScaleMode::none, 192, 2, 16, ActivationDtype::fp16},
  };
}

/// New tokens [num_tokens, H, D] as activation bits, with outliers beyond the FP8 (and, for
/// the FP16 cache, the FP16) range of the static scale: they must saturate, never become
/// NaN or infinity.
struct NewTokens {
  std::vector<std::uint16_t> k_bits, v_bits;
  std::vector<float> k, v;  // the activation values
};
NewTokens make_tokens(std::mt19937_64& rng, const AppendCase& c, int num_tokens) {
  NewTokens n;
  std::vector<float> row(static_cast<std::size_t>(c.head_dim));
  for (int t = 0; t < num_tokens * c.num_kv_heads; ++t) {
    for (int which = 0; which < 2; ++which) {
      realistic_row(rng, c.head_dim, row.data(), which == 0 ? 1.0f : 0.5f);
      if (t % 5 == 1) row[7] = 3000.0f * (which == 0 ? 1.0f : -1.0f);  // saturates per-tensor FP8
      // Beyond FP16's 65504 once divided by the FP16 case's K scale 0.37: must store ±max, not inf.
      if (t % 7 == 3) row[11] = 30000.0f * (which == 0 ? -1.0f : 1.0f);
      for (float x : row) {
        const std::uint16_t bits = to_activation(c.input, x);
        (which == 0 ? n.k_bits : n.v_bits).push_back(bits);
        (which == 0 ? n.k : n.v).push_back(from_activation(c.input, bits));
      }
    }
  }
  return n;
}

/// The host image of the cache after appending `token` at (page, slot).
void host_append(HostCache& cache, const NewTokens& n, int token, int page, int slot) {
  const int h_count = cache.shape.num_kv_heads, d_dim = cache.shape.head_dim;
  for (int h = 0; h < h_count; ++h) {
    const std::size_t base = (static_cast<std::size_t>(token) * static_cast<std::size_t>(h_count) + static_cast<std::size_t>(h)) * static_cast<std::size_t>(d_dim);
    cache.store(false, page, slot, h, n.k.data() + base);
    cache.store(true, page, slot, h, n.v.data() + base);
  }
}

/// Random poison in every byte (a recognizable image the kernel must not disturb).
void poison(HostCache& cache, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : cache.k) b = static_cast<unsigned char>(byte(rng));
  for (auto& b : cache.v) b = static_cast<unsigned char>(byte(rng));
  std::uniform_real_distribution<float> s(0.5f, 2.0f);
  for (auto& x : cache.k_token_scale) x = s(rng);
  for (auto& x : cache.v_token_scale) x = s(rng);
}

void check_device_equals_host(const DeviceCache& device, const HostCache& expected) {
  const auto k = download(device.k, expected.k.size());
  const auto v = download(device.v, expected.v.size());
  std::size_t k_diff = 0, v_diff = 0;
  for (std::size_t i = 0; i < k.size(); ++i) k_diff += k[i] != expected.k[i];
  for (std::size_t i = 0; i < v.size(); ++i) v_diff += v[i] != expected.v[i];
  CHECK(k_diff == 0);
  CHECK(v_diff == 0);
  if (expected.shape.scale_mode == KvScaleMode::per_token) {
    const auto ks = download(device.k_token_scale, expected.k_token_scale.size());
    const auto vs = download(device.v_token_scale, expected.v_token_scale.size());
    std::size_t s_diff = 0;
    for (std::size_t i = 0; i < ks.size(); ++i) {
      s_diff += std::memcmp(&ks[i], &expected.k_token_scale[i], 4) != 0;
      s_diff += std::memcmp(&vs[i], &expected.v_token_scale[i], 4) != 0;
    }
    CHECK(s_diff == 0);
  }
}

}  // namespace

TEST_CASE("append: chunk form is bit-exact with the host quantizer, neighbours untouched", "[attention][append]") {
  auto rng = slimserve_test::make_rng(411);
  for (const AppendCase& c : append_grid()) {
    INFO("dtype " << to_string(c.dtype) << " layout " << to_string(c.layout) << " scales "
                  << to_string(c.scale_mode) << " D " << c.head_dim << " H " << c.num_kv_heads);
    // Lengths after the append, and how many tokens each request appends (its last ones).
    const std::vector<std::int64_t> lengths{5, c.page_size + 1, 1, 2 * c.page_size, 3};
    const std::vector<std::int32_t> appended{5, 3, 1, 2, 0};
    const HostPageTable table = make_page_table(lengths, c.page_size, rng, false);
    HostCache expected(CacheShape{c.dtype, c.layout, c.scale_mode, table.num_pages, c.page_size,
                                  c.num_kv_heads, c.head_dim});
    poison(expected, rng);
    expected.k_scale = is_fp8(c.dtype) ? 0.03125f : 0.37f;  // non-unit, K != V
    expected.v_scale = is_fp8(c.dtype) ? 0.0078125f * 3.0f : 1.9f;
    std::vector<std::int32_t> append_indptr{0};
    for (auto n : appended) append_indptr.push_back(append_indptr.back() + n);
    const int num_tokens = append_indptr.back();
    const NewTokens tokens = make_tokens(rng, c, num_tokens);
    // Request 3 failed the tag check: its tokens must not be written.
    std::vector<kv::RequestStatus> status(lengths.size(), kv::RequestStatus{kv::RequestState::ok, -1});
    status[3] = {kv::RequestState::stale_tag, 1};

    DeviceCache device(expected);  // uploads the poisoned image
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      if (b == 3) continue;
      const auto pages = table.pages_of(b);
      for (int i = 0; i < appended[b]; ++i) {
        const std::int64_t position = lengths[b] - appended[b] + i;
        host_append(expected, tokens, append_indptr[b] + i, pages[static_cast<std::size_t>(position / c.page_size)],
                    static_cast<int>(position % c.page_size));
      }
    }
    AppendDestinationsHost host{table.indptr, table.indices, table.last_page_len, {}, {}, append_indptr,
                                num_tokens, c.page_size, table.num_pages};
    REQUIRE(check_append_destinations(host).ok());

    auto indptr = upload(table.indptr);
    auto indices = upload(table.indices);
    auto last = upload(table.last_page_len);
    auto k_new = upload(tokens.k_bits);
    auto v_new = upload(tokens.v_bits);
    auto ai = upload(append_indptr);
    auto st = upload(status);
    AppendArguments args;
    args.cache = device.view;
    args.table = kv::PageTableView{indptr.data(), indices.data(), last.data(), nullptr,
                                   static_cast<std::int32_t>(lengths.size()), c.page_size};
    args.request_status = st.data();
    args.k_new = k_new.data();
    args.v_new = v_new.data();
    args.input_dtype = c.input;
    args.num_tokens = num_tokens;
    args.append_indptr = ai.data();
    const Status s = append_kv(args, nullptr);
    INFO(s.to_string());
    REQUIRE(s.ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    check_device_equals_host(device, expected);

    // Finite inputs never produce a NaN code in the written slots (saturation, not overflow).
    std::size_t nan_codes = 0;
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      if (b == 3) continue;
      const auto pages = table.pages_of(b);
      for (int i = 0; i < appended[b]; ++i) {
        const std::int64_t position = lengths[b] - appended[b] + i;
        for (int h = 0; h < c.num_kv_heads; ++h)
          for (int d = 0; d < c.head_dim; ++d)
            nan_codes += std::isnan(expected.real(false, pages[static_cast<std::size_t>(position / c.page_size)],
                                                  static_cast<int>(position % c.page_size), h, d));
      }
    }
    CHECK(nan_codes == 0);

    // dequantize_pages: stored * scale rounded to BF16, bit-exact; an invalid id gives NaN.
    std::vector<std::int32_t> listed{table.indices[0], table.indices[2], -1, table.num_pages};
    auto listed_d = upload(listed);
    const std::size_t page_elems = static_cast<std::size_t>(c.page_size * c.num_kv_heads * c.head_dim);
    auto k_out = rt::DeviceBuffer<bf16>::create(listed.size() * page_elems);
    auto v_out = rt::DeviceBuffer<bf16>::create(listed.size() * page_elems);
    REQUIRE(k_out.ok());
    REQUIRE(v_out.ok());
    REQUIRE(dequantize_pages(device.view, listed_d.data(), static_cast<std::int32_t>(listed.size()),
                             k_out->data(), v_out->data(), nullptr).ok());
    const auto k_host = download(*k_out, listed.size() * page_elems);
    const auto v_host = download(*v_out, listed.size() * page_elems);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < listed.size(); ++i) {
      for (int slot = 0; slot < c.page_size; ++slot)
        for (int h = 0; h < c.num_kv_heads; ++h)
          for (int d = 0; d < c.head_dim; ++d) {
            const std::size_t o = ((i * static_cast<std::size_t>(c.page_size) + static_cast<std::size_t>(slot)) * static_cast<std::size_t>(c.num_kv_heads) + static_cast<std::size_t>(h)) * static_cast<std::size_t>(c.head_dim) + static_cast<std::size_t>(d);
            if (i >= 2) {
              mismatches += !std::isnan(to_float(k_host[o])) || !std::isnan(to_float(v_host[o]));
              continue;
            }
            const int page = listed[i];
            for (int which = 0; which < 2; ++which) {
              const bool is_v = which == 1;
              const float want = dequantize(c.dtype, expected.bits(is_v ? expected.v : expected.k, expected.offset(page, slot, h, d))) *
                                 expected.scale_of(is_v, page, slot, h);
              const bf16 got = is_v ? v_host[o] : k_host[o];
              const bf16 want_bits = from_float<bf16>(want);
              mismatches += got.bits != want_bits.bits && !(std::isnan(want) && std::isnan(to_float(got)));
            }
          }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("append: explicit destinations; out-of-range ones are skipped on device and refused on host", "[attention][append]") {
  auto rng = slimserve_test::make_rng(412);
  const AppendCase c{KvDtype::fp8_e4m3, KvLayout::hnd, KvScaleMode::per_token, 64, 2, 16, ActivationDtype::bf16};
  const std::vector<std::int64_t> lengths{20, 16, 1};
  const HostPageTable table = make_page_table(lengths, c.page_size, rng, false);
  HostCache expected(CacheShape{c.dtype, c.layout, c.scale_mode, table.num_pages, c.page_size,
                                c.num_kv_heads, c.head_dim});
  poison(expected, rng);
  // (request, position): decode-style last tokens, a mid-request rewrite, and three bad ones.
  const std::vector<std::int32_t> request{0, 1, 2, 0, 1, 5, -1};
  const std::vector<std::int32_t> position{19, 15, 0, 3, 16, 0, 0};
  const int num_tokens = static_cast<int>(request.size());
  const NewTokens tokens = make_tokens(rng, c, num_tokens);
  DeviceCache device(expected);
  for (int t = 0; t < 4; ++t) {
    const auto pages = table.pages_of(static_cast<std::size_t>(request[static_cast<std::size_t>(t)]));
    host_append(expected, tokens, t, pages[static_cast<std::size_t>(position[static_cast<std::size_t>(t)] / c.page_size)],
                position[static_cast<std::size_t>(t)] % c.page_size);
  }
  AppendDestinationsHost host{table.indptr, table.indices, table.last_page_len, request, position, {},
                              num_tokens, c.page_size, table.num_pages};
  const Status refused = check_append_destinations(host);
  CHECK(refused.code() == StatusCode::out_of_range);
  CHECK(refused.message().find("token 4 of request 1 goes to position 16") != std::string_view::npos);
  // The first four alone pass the host check.
  AppendDestinationsHost good = host;
  good.token_request = std::span<const std::int32_t>(request).first(4);
  good.token_position = std::span<const std::int32_t>(position).first(4);
  good.num_tokens = 4;
  CHECK(check_append_destinations(good).ok());
  // Two tokens on one slot are refused.
  const std::vector<std::int32_t> dup_request{0, 0};
  const std::vector<std::int32_t> dup_position{7, 7};
  AppendDestinationsHost dup{table.indptr, table.indices, table.last_page_len, dup_request, dup_position, {},
                             2, c.page_size, table.num_pages};
  CHECK(check_append_destinations(dup).code() == StatusCode::invalid_argument);

  // The device skips the bad ones by itself (backstop when the host check is not run).
  auto indptr = upload(table.indptr);
  auto indices = upload(table.indices);
  auto last = upload(table.last_page_len);
  auto k_new = upload(tokens.k_bits);
  auto v_new = upload(tokens.v_bits);
  auto req = upload(request);
  auto pos = upload(position);
  AppendArguments args;
  args.cache = device.view;
  args.table = kv::PageTableView{indptr.data(), indices.data(), last.data(), nullptr, 3, c.page_size};
  args.k_new = k_new.data();
  args.v_new = v_new.data();
  args.input_dtype = c.input;
  args.num_tokens = num_tokens;
  args.token_request = req.data();
  args.token_position = pos.data();
  REQUIRE(append_kv(args, nullptr).ok());
  check_device_equals_host(device, expected);

  SECTION("preflight") {
    AppendArguments bad = args;
    bad.append_indptr = req.data();  // both forms
    CHECK(append_kv(bad, nullptr).code() == StatusCode::invalid_argument);
    bad = args;
    bad.cache.head_dim = 80;  // not in PagedHeadDims
    CHECK(append_kv(bad, nullptr).code() == StatusCode::unsupported);
    bad = args;
    bad.table.page_size = 32;
    CHECK(append_kv(bad, nullptr).code() == StatusCode::invalid_argument);
    bad = args;
    bad.cache.scale_mode = KvScaleMode::none;  // FP8 without scales
    CHECK(append_kv(bad, nullptr).code() == StatusCode::invalid_argument);
    check_device_equals_host(device, expected);
  }
}

TEST_CASE("append: strided K/V rows (a fused QKV output's slices) are read in place, gaps never", "[attention][append]") {
  auto rng = slimserve_test::make_rng(413);
  // Per-token FP8 (a gap read into a row's amax would change its scale), per-tensor FP8, BF16.
  const std::vector<AppendCase> cases{
      {KvDtype::fp8_e4m3, KvLayout::nhd, KvScaleMode::per_token, 64, 3, 16, ActivationDtype::bf16},
      {KvDtype::fp8_e5m2, KvLayout::hnd, KvScaleMode::per_tensor, 192, 1, 32, ActivationDtype::fp16},
      {KvDtype::bf16, KvLayout::nhd, KvScaleMode::none, 96, 2, 16, ActivationDtype::bf16},
      {KvDtype::fp16, KvLayout::hnd, KvScaleMode::per_tensor, 128, 2, 16, ActivationDtype::fp16},
  };
  for (const AppendCase& c : cases) {
    INFO("dtype " << to_string(c.dtype) << " layout " << to_string(c.layout) << " D " << c.head_dim
                  << " H " << c.num_kv_heads);
    const std::int64_t row = static_cast<std::int64_t>(c.num_kv_heads) * c.head_dim;
    constexpr int num_pages = 7;
    HostCache expected(CacheShape{c.dtype, c.layout, c.scale_mode, num_pages, c.page_size, c.num_kv_heads,
                                  c.head_dim});
    poison(expected, rng);
    expected.k_scale = is_fp8(c.dtype) ? 0.0625f : 0.5f;
    expected.v_scale = is_fp8(c.dtype) ? 0.03125f : 1.5f;
    // Slots: page starts and ends, a padded token (-1), one past the cache; 1 and 2 tokens too.
    const std::vector<std::int64_t> all_slots{3 * c.page_size + 0, 5 * c.page_size + c.page_size - 1, -1,
                                              1 * c.page_size + 7, static_cast<std::int64_t>(num_pages) * c.page_size,
                                              6 * c.page_size + 2, 0};
    for (const std::size_t count : {std::size_t{1}, std::size_t{2}, all_slots.size()}) {
      const std::vector<std::int64_t> slots(all_slots.begin(), all_slots.begin() + static_cast<std::ptrdiff_t>(count));
      const int num_tokens = static_cast<int>(count);
      const NewTokens tokens = make_tokens(rng, c, num_tokens);
      // vLLM's fused [tokens, q | k | v] output: K rows 4 rows + 8 apart, V rows 1 row + 16 apart
      // (a different stride each); every gap element a NaN (and the V gap an FP outlier), so
      // a read of one would show in a code or a per-token scale.
      const std::int64_t k_stride = 4 * row + 8, v_stride = row + 16;
      std::vector<std::uint16_t> k_rows(static_cast<std::size_t>(num_tokens * k_stride), 0x7FFF);
      std::vector<std::uint16_t> v_rows(static_cast<std::size_t>(num_tokens * v_stride),
                                        to_activation(c.input, 30000.0f));
      for (int t = 0; t < num_tokens; ++t)
        for (std::int64_t i = 0; i < row; ++i) {
          k_rows[static_cast<std::size_t>(t * k_stride + i)] = tokens.k_bits[static_cast<std::size_t>(t * row + i)];
          v_rows[static_cast<std::size_t>(t * v_stride + i)] = tokens.v_bits[static_cast<std::size_t>(t * row + i)];
        }
      DeviceCache device(expected);
      for (int t = 0; t < num_tokens; ++t) {
        const std::int64_t s = slots[static_cast<std::size_t>(t)];
        if (s < 0 || s / c.page_size >= num_pages) continue;
        host_append(expected, tokens, t, static_cast<int>(s / c.page_size), static_cast<int>(s % c.page_size));
      }
      auto k_new = upload(k_rows);
      auto v_new = upload(v_rows);
      auto slot_d = upload(slots);
      AppendArguments args;
      args.cache = device.view;
      args.table.page_size = c.page_size;
      args.k_new = k_new.data();
      args.v_new = v_new.data();
      args.k_row_stride = k_stride;
      args.v_row_stride = v_stride;
      args.input_dtype = c.input;
      args.num_tokens = num_tokens;
      args.slot_mapping = slot_d.data();
      const Status s = append_kv(args, nullptr);
      INFO(s.to_string());
      REQUIRE(s.ok());
      REQUIRE(rt::stream_synchronize(nullptr).ok());
      check_device_equals_host(device, expected);  // every byte and every per-token scale

      // Preflight: each bad stride refused by name, nothing written.
      for (const auto& [k_bad, v_bad, word] :
           {std::tuple<std::int64_t, std::int64_t, const char*>{row - 8, v_stride, "k_row_stride"},
            {k_stride, row + 4, "v_row_stride"},
            {-row, v_stride, "k_row_stride"},
            {k_stride, 1, "v_row_stride"}}) {
        AppendArguments bad = args;
        bad.k_row_stride = k_bad;
        bad.v_row_stride = v_bad;
        const Status refused = append_kv(bad, nullptr);
        CHECK(refused.code() == StatusCode::invalid_argument);
        CHECK(refused.message().find(word) != std::string_view::npos);
      }
      check_device_equals_host(device, expected);
    }
  }
}
