// Cache view: preflight of shapes/pointers/scales, addressing, capacity arithmetic.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <type_traits>

#include "slimserve/attention/append.hpp"
#include "slimserve/attention/decode_plan.hpp"
#include "slimserve/attention/dequantize.hpp"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/attention/paged_attention.hpp"

using namespace slimserve;
using namespace slimserve::attention;

TEST_CASE("static scales: non-finite and non-positive are rejected", "[attention][cache]") {
  CHECK(validate_static_scales(0.5f, 2.0f).ok());
  const float bad[] = {0.0f, -1.0f, -0.0f, std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN()};
  for (float s : bad) {
    auto k = validate_static_scales(s, 1.0f);
    CHECK(k.code() == StatusCode::invalid_argument);
    CHECK(k.message().find("k_scale") != std::string_view::npos);
    CHECK(validate_static_scales(1.0f, s).message().find("v_scale") != std::string_view::npos);
  }
}

TEST_CASE("cache view preflight", "[attention][cache]") {
  float dummy[4] = {1, 1, 1, 1};
  PagedKVCacheView v;
  v.k_pages = dummy;
  v.v_pages = dummy;
  v.num_pages = 4;
  v.page_size = 16;
  v.num_kv_heads = 2;
  v.head_dim = 128;
  v.dtype = KvDtype::bf16;
  CHECK(validate_cache_view(v).ok());
  v.dtype = KvDtype::fp8_e4m3;  // FP8 without scales: refused, never defaulted to 1.0
  CHECK(validate_cache_view(v).code() == StatusCode::invalid_argument);
  v.scale_mode = KvScaleMode::per_tensor;
  CHECK(validate_cache_view(v).code() == StatusCode::invalid_argument);  // null scale pointers
  v.k_scale = dummy;
  v.v_scale = dummy + 1;
  CHECK(validate_cache_view(v).ok());
  v.scale_mode = KvScaleMode::per_token;
  CHECK(validate_cache_view(v).code() == StatusCode::invalid_argument);
  v.k_token_scales = dummy;
  v.v_token_scales = dummy;
  CHECK(validate_cache_view(v).ok());
  v.dtype = KvDtype::bf16;  // per-token scales onto BF16's ~3e38 range would overflow q.k
  CHECK(validate_cache_view(v).code() == StatusCode::invalid_argument);
  CHECK(validate_cache_view(v).message().find("FP8") != std::string_view::npos);
  v.dtype = KvDtype::fp8_e4m3;
  v.head_dim = 80;
  CHECK(validate_cache_view(v).code() == StatusCode::unsupported);
  v.head_dim = 96;  // paged attention reads it (the CUDA-core decode and append refuse it)
  CHECK(validate_cache_view(v).ok());
  v.head_dim = 192;
  CHECK(validate_cache_view(v).ok());
  v.head_dim = 64;
  v.page_size = 24;
  CHECK(validate_cache_view(v).code() == StatusCode::unsupported);
  v.page_size = 128;
  v.v_pages = nullptr;
  CHECK(validate_cache_view(v).code() == StatusCode::invalid_argument);
}

TEST_CASE("enum values cast from integers are range-checked", "[attention][cache]") {
  float dummy[4] = {1, 1, 1, 1};
  PagedKVCacheView v;
  v.k_pages = dummy;
  v.v_pages = dummy;
  v.num_pages = 4;
  v.page_size = 16;
  v.num_kv_heads = 2;
  v.head_dim = 128;
  REQUIRE(can_implement(v).ok());
  PagedKVCacheView bad = v;
  bad.dtype = static_cast<KvDtype>(9);
  CHECK(can_implement(bad).code() == StatusCode::invalid_argument);
  CHECK(can_implement(bad).message().find("9") != std::string_view::npos);
  bad = v;
  bad.layout = static_cast<KvLayout>(2);
  CHECK(can_implement(bad).code() == StatusCode::invalid_argument);
  bad = v;
  bad.scale_mode = static_cast<KvScaleMode>(3);
  CHECK(can_implement(bad).code() == StatusCode::invalid_argument);
  CHECK_FALSE(is_valid(static_cast<ActivationDtype>(2)));
  CHECK(is_valid(ActivationDtype::fp16));
  // One activation enum: attention's and int4's names are the same type.
  static_assert(std::is_same_v<ActivationDtype, slimserve::ActivationDtype>);
  DecodeProblem problem{1, 8, 2, 128, 16, 1, static_cast<KvDtype>(kv_format_count)};  // one past the list
  CHECK(can_implement(problem).code() == StatusCode::invalid_argument);
}

TEST_CASE("cache addressing: NHD and HND cover each page exactly once", "[attention][cache]") {
  constexpr int ps = 16, h = 3, d = 64, pages = 2;
  for (KvLayout layout : {KvLayout::nhd, KvLayout::hnd}) {
    std::vector<int> hits(static_cast<std::size_t>(pages * ps * h * d), 0);
    for (int p = 0; p < pages; ++p)
      for (int s = 0; s < ps; ++s)
        for (int hh = 0; hh < h; ++hh)
          for (int e = 0; e < d; ++e) ++hits[static_cast<std::size_t>(cache_offset(layout, ps, h, d, p, s, hh, e))];
    for (int x : hits) CHECK(x == 1);
  }
  CHECK(cache_offset(KvLayout::nhd, ps, h, d, 1, 2, 1, 5) == ((1 * ps + 2) * h + 1) * d + 5);
  CHECK(cache_offset(KvLayout::hnd, ps, h, d, 1, 2, 1, 5) == ((1 * h + 1) * ps + 2) * d + 5);
}

TEST_CASE("capacity arithmetic", "[attention][cache]") {
  // 8 KV heads x 128: BF16 4096 B/token, FP8 2048, FP8 + per-token scales 2048 + 64.
  CHECK(cache_bytes_per_token(KvDtype::bf16, KvScaleMode::none, 8, 128) == 4096);
  CHECK(cache_bytes_per_token(KvDtype::fp8_e4m3, KvScaleMode::per_tensor, 8, 128) == 2048);
  CHECK(cache_bytes_per_token(KvDtype::fp8_e5m2, KvScaleMode::per_token, 8, 128) == 2112);
  CHECK(tokens_per_gib(KvDtype::bf16, KvScaleMode::none, 8, 128, 16) == 262144);
  CHECK(tokens_per_gib(KvDtype::fp8_e4m3, KvScaleMode::per_tensor, 8, 128, 16) == 524288);
  CHECK(tokens_per_gib(KvDtype::fp8_e4m3, KvScaleMode::per_token, 8, 128, 16) == (1LL << 30) / (2112 * 16) * 16);
}

TEST_CASE("allocation sizes of a cache view", "[attention][cache]") {
  PagedKVCacheView view;
  view.num_pages = 37;
  view.page_size = 16;
  view.num_kv_heads = 3;
  view.head_dim = 128;
  view.dtype = KvDtype::fp8_e4m3;
  view.scale_mode = KvScaleMode::per_token;
  CHECK(packed_pages_bytes(view) == 37LL * 16 * 3 * 128);
  CHECK(token_scale_count(view) == 37LL * 16 * 3);
  view.dtype = KvDtype::bf16;
  view.scale_mode = KvScaleMode::none;
  CHECK(packed_pages_bytes(view) == 37LL * 16 * 3 * 128 * 2);
  CHECK(token_scale_count(view) == 0);
  view.scale_mode = KvScaleMode::per_tensor;
  CHECK(token_scale_count(view) == 0);
  // Every (page, slot, head, d) of both layouts lies inside the allocation the size gives.
  for (auto layout : {KvLayout::nhd, KvLayout::hnd}) {
    const std::int64_t last = cache_offset(layout, view.page_size, view.num_kv_heads, view.head_dim,
                                           view.num_pages - 1, view.page_size - 1, view.num_kv_heads - 1,
                                           view.head_dim - 1);
    CHECK((last + 1) * element_bytes(view.dtype) == packed_pages_bytes(view));
  }
}

TEST_CASE("NVFP4 pages: every kernel family without an NVFP4 path refuses it by name in its preflight",
          "[attention][cache][nvfp4]") {
  alignas(16) static std::uint8_t pages[4 * 16 * 2 * 72] = {};
  const float scale = 1.0f;
  PagedKVCacheView v;
  v.k_pages = v.v_pages = pages;
  v.k_scale = v.v_scale = &scale;
  v.num_pages = 4;
  v.page_size = 16;
  v.num_kv_heads = 2;
  v.head_dim = 128;
  v.dtype = KvDtype::nvfp4;
  v.scale_mode = KvScaleMode::per_tensor;
  REQUIRE(validate_cache_view(v).ok());
  auto refused = [](const Status& s, KvKernel kernel) {
    INFO(s.message());
    if (has_kernel(KvDtype::nvfp4, kernel)) return;  // the family has its NVFP4 path: tested with it
    CHECK(s.code() == StatusCode::unsupported);
    CHECK_THAT(std::string(s.message()),
               Catch::Contains("does not take nvfp4") && Catch::Contains("bf16, fp16, fp8_e4m3, fp8_e5m2"));
  };
  DecodeProblem decode;
  decode.batch_size = 1;
  decode.num_qo_heads = 16;
  decode.num_kv_heads = 2;
  decode.head_dim = 128;
  decode.page_size = 16;
  decode.kv_dtype = KvDtype::nvfp4;
  refused(validate_decode_problem(decode), KvKernel::decode);
  PagedAttentionProblem paged;
  paged.batch_size = 1;
  paged.num_qo_heads = 16;
  paged.num_kv_heads = 2;
  paged.head_dim = 128;
  paged.page_size = 16;
  paged.kv_dtype = KvDtype::nvfp4;
  paged.q_dtype = ActivationDtype::fp16;
  refused(validate_paged_attention_problem(paged), KvKernel::paged_attention);
  AppendArguments append;
  append.cache = v;
  refused(can_implement(append), KvKernel::append);
  const std::int32_t page_ids[1] = {0};
  alignas(16) static bf16 out[16 * 2 * 128];
  const std::uint8_t before = pages[7];
  refused(dequantize_pages(v, page_ids, 1, out, out, nullptr), KvKernel::dequantize);
  CHECK(pages[7] == before);
}
