// The KV format list and traits: ABI values and names, byte geometry (a sub-byte format with
// per-block scales included), the scale rules the preflights read, dispatch order.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "slimserve/kv/kv_cache_view.hpp"
#include "slimserve/kv/kv_format.hpp"

using namespace slimserve;
using namespace slimserve::attention;

TEST_CASE("KV formats keep their ABI values, names and bits", "[kv][format]") {
  // The C enum's values: an engine built against an older header must read the same formats.
  STATIC_REQUIRE(static_cast<int>(KvDtype::bf16) == 0);
  STATIC_REQUIRE(static_cast<int>(KvDtype::fp16) == 1);
  STATIC_REQUIRE(static_cast<int>(KvDtype::fp8_e4m3) == 2);
  STATIC_REQUIRE(static_cast<int>(KvDtype::fp8_e5m2) == 3);
  STATIC_REQUIRE(static_cast<int>(KvDtype::nvfp4) == 4);
  STATIC_REQUIRE(kv_format_count == 5);
  CHECK(std::string(kv_format_names()) == "bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4");
  const char* names[] = {"bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "nvfp4"};
  const int bits[] = {16, 16, 8, 8, 4};
  for (int value = 0; value < kv_format_count; ++value) {
    const auto dtype = static_cast<KvDtype>(value);
    CHECK(is_valid(dtype));
    CHECK(to_string(dtype) == names[value]);
    CHECK(bits_per_element(dtype) == bits[value]);
    CHECK(element_bytes(dtype) == bits[value] / 8);
  }
  for (const int value : {5, 6, 200, 255}) {
    CHECK_FALSE(is_valid(static_cast<KvDtype>(value)));
    CHECK(to_string(static_cast<KvDtype>(value)) == "unknown");
  }
}

TEST_CASE("KV format traits: storage sizes, scale rules, compute types", "[kv][format]") {
  STATIC_REQUIRE(KvFormat<bf16>::bits == 8 * sizeof(bf16));
  STATIC_REQUIRE(KvFormat<fp8_e4m3>::bits == 8 * sizeof(fp8_e4m3));
  STATIC_REQUIRE(kv_dtype_v<fp8_e5m2> == KvDtype::fp8_e5m2);
  STATIC_REQUIRE(std::is_same_v<KvFormat<fp8_e4m3>::mma_input, fp16>);
  STATIC_REQUIRE(std::is_same_v<KvFormat<bf16>::mma_input, bf16>);
  // 16-bit caches take no scale or a per-tensor one and compute in their own type; FP8 needs a
  // scale, may have one per token-head, and computes in either activation type.
  CHECK_FALSE(requires_scale(KvDtype::bf16));
  CHECK_FALSE(requires_scale(KvDtype::fp16));
  CHECK(requires_scale(KvDtype::fp8_e4m3));
  CHECK(requires_scale(KvDtype::fp8_e5m2));
  CHECK_FALSE(allows_per_token_scales(KvDtype::fp16));
  CHECK(allows_per_token_scales(KvDtype::fp8_e5m2));
  CHECK(kv_format_info(KvDtype::bf16).computes_in_storage_type);
  CHECK(kv_format_info(KvDtype::bf16).storage_activation == ActivationDtype::bf16);
  CHECK(kv_format_info(KvDtype::fp16).storage_activation == ActivationDtype::fp16);
  CHECK_FALSE(kv_format_info(KvDtype::fp8_e4m3).computes_in_storage_type);
}

TEST_CASE("KV format widen/quantize are the scalar conversions", "[kv][format]") {
  // Codes of every byte value pair: widen is exact (NaN as NaN), quantize(widen(x)) gives the
  // code back for every finite value.
  for (std::uint32_t code = 0; code < 256; ++code) {
    const std::uint32_t word = code | (code ^ 0x5Au) << 8 | (255u - code) << 16 | (code * 7u & 0xFFu) << 24;
    const f32x4 wide = KvFormat<fp8_e4m3>::widen(word);
    const float lanes[4] = {wide.x, wide.y, wide.z, wide.w};
    for (int i = 0; i < 4; ++i) {
      const float expected = to_float(fp8_e4m3::from_bits(static_cast<std::uint8_t>(word >> (8 * i))));
      if (expected != expected) {
        CHECK(lanes[i] != lanes[i]);
      } else {
        CHECK(lanes[i] == expected);
      }
    }
    const bool finite = wide.x == wide.x && wide.y == wide.y && wide.z == wide.z && wide.w == wide.w;
    if (finite) CHECK(KvFormat<fp8_e4m3>::quantize(wide) == word);
  }
  const std::uint32_t pair = 0x3F80C040u;  // bf16: element 0 (low half) -3.0, element 1 1.0
  const f32x2 two = KvFormat<bf16>::widen(pair);
  CHECK(two.x == to_float(bf16::from_bits(0xC040u)));
  CHECK(two.y == to_float(bf16::from_bits(0x3F80u)));
  CHECK(KvFormat<bf16>::quantize(two) == pair);
}

TEST_CASE("head vector and page geometry from the trait", "[kv][format]") {
  for (const std::int64_t head_dim : {64, 96, 128, 192, 256}) {
    CHECK(head_vector_bytes(KvDtype::bf16, head_dim) == 2 * head_dim);
    CHECK(head_vector_bytes(KvDtype::fp8_e4m3, head_dim) == head_dim);
  }
  // A 4-bit format with one 8-bit scale per 16 elements (NVFP4's shape): 64 B of codes and 8 B
  // of scales per 128-element head vector.
  const KvFormatInfo four_bit{KvDtype::bf16, "four_bit", 4, KvScaleGeometry::per_block, false, 16, 8, false,
                              ActivationDtype::fp16, 0};
  CHECK(head_vector_bytes(four_bit, 128) == 72);
  CHECK(head_vector_bytes(four_bit, 64) == 36);
  // The view's allocation and capacity arithmetic go through the same geometry.
  PagedKVCacheView cache;
  cache.num_pages = 7;
  cache.page_size = 16;
  cache.num_kv_heads = 3;
  cache.head_dim = 96;
  for (int value = 0; value < kv_format_count; ++value) {
    cache.dtype = static_cast<KvDtype>(value);
    CHECK(packed_pages_bytes(cache) == 7LL * 16 * 3 * head_vector_bytes(cache.dtype, 96));
    CHECK(cache_bytes_per_token(cache.dtype, KvScaleMode::per_tensor, 3, 96) ==
          2LL * 3 * head_vector_bytes(cache.dtype, 96));
  }
}

TEST_CASE("for_each_kv_format visits the list in ABI order", "[kv][format]") {
  std::vector<int> order;
  for_each_kv_format([&]<class Storage>() { order.push_back(static_cast<int>(kv_dtype_v<Storage>)); });
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("an unknown KV dtype is refused naming the formats", "[kv][format]") {
  float dummy[4] = {1, 1, 1, 1};
  PagedKVCacheView v;
  v.k_pages = v.v_pages = dummy;
  v.num_pages = 1;
  v.page_size = 16;
  v.num_kv_heads = 1;
  v.head_dim = 64;
  v.dtype = static_cast<KvDtype>(9);
  const Status s = validate_cache_view(v);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("unknown KV dtype 9") &&
                                           Catch::Contains("one of bf16, fp16, fp8_e4m3, fp8_e5m2, nvfp4"));
}

TEST_CASE("NVFP4's trait: E2M1 pairs, E4M3 per 16, a per-tensor scale required", "[kv][format][nvfp4]") {
  STATIC_REQUIRE(sizeof(nvfp4) == 1);  // two codes a byte
  STATIC_REQUIRE(KvFormat<nvfp4>::bits == 4);
  STATIC_REQUIRE(KvFormat<nvfp4>::scales == KvScaleGeometry::per_block);
  STATIC_REQUIRE(KvFormat<nvfp4>::scale_block == 16);
  STATIC_REQUIRE(KvFormat<nvfp4>::scale_bits == 8);
  STATIC_REQUIRE(std::is_same_v<KvFormat<nvfp4>::scale_format, fp8_e4m3>);
  STATIC_REQUIRE(std::is_same_v<KvFormat<nvfp4>::mma_input, fp16>);
  CHECK(requires_scale(KvDtype::nvfp4));
  CHECK_FALSE(allows_per_token_scales(KvDtype::nvfp4));
  CHECK_FALSE(kv_format_info(KvDtype::nvfp4).computes_in_storage_type);
  CHECK(element_bytes(KvDtype::nvfp4) == 0);  // sub-byte: bytes come from head_vector_bytes
  // nvfp4.hpp's packed layout: D/2 code bytes, then D/16 scale bytes.
  CHECK(head_vector_bytes(KvDtype::nvfp4, 64) == 36);
  CHECK(head_vector_bytes(KvDtype::nvfp4, 128) == 72);
  CHECK(head_vector_bytes(KvDtype::nvfp4, 256) == 144);
}

TEST_CASE("NVFP4 capacity from the cache views: >= 3.5x BF16's tokens per GiB at head_dim 128", "[kv][format][nvfp4]") {
  for (const std::int32_t heads : {1, 8}) {
    for (const std::int32_t page_size : {16, 128}) {
      const auto bf16_tokens = tokens_per_gib(KvDtype::bf16, KvScaleMode::none, heads, 128, page_size);
      const auto fp8_tokens = tokens_per_gib(KvDtype::fp8_e4m3, KvScaleMode::per_tensor, heads, 128, page_size);
      const auto fp4_tokens = tokens_per_gib(KvDtype::nvfp4, KvScaleMode::per_tensor, heads, 128, page_size);
      const double ratio = static_cast<double>(fp4_tokens) / static_cast<double>(bf16_tokens);
      INFO("heads " << heads << " page_size " << page_size << ": " << fp4_tokens << " / " << bf16_tokens);
      CHECK(ratio >= 3.5);
      CHECK(ratio < 256.0 / 72.0 + 0.01);  // 256 B against 72 B a head vector, pages whole
      CHECK(fp4_tokens > fp8_tokens);
    }
  }
  PagedKVCacheView cache;
  cache.num_pages = 5;
  cache.page_size = 16;
  cache.num_kv_heads = 8;
  cache.head_dim = 128;
  cache.dtype = KvDtype::nvfp4;
  CHECK(packed_pages_bytes(cache) == 5LL * 16 * 8 * 72);
}

namespace {
PagedKVCacheView nvfp4_view(std::uint8_t* pages, const float* scale) {
  PagedKVCacheView v;
  v.k_pages = v.v_pages = pages;
  v.k_scale = v.v_scale = scale;
  v.num_pages = 1;
  v.page_size = 16;
  v.num_kv_heads = 1;
  v.head_dim = 64;
  v.dtype = KvDtype::nvfp4;
  v.scale_mode = KvScaleMode::per_tensor;
  return v;
}
}  // namespace

TEST_CASE("an NVFP4 view needs its per-tensor scale and packed pages", "[kv][format][nvfp4]") {
  alignas(16) std::uint8_t pages[16 * 36] = {};
  const float scale = 1.0f;
  CHECK(validate_cache_view(nvfp4_view(pages, &scale)).ok());
  PagedKVCacheView v = nvfp4_view(pages, &scale);
  v.scale_mode = KvScaleMode::none;
  Status s = validate_cache_view(v);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("nvfp4 cache needs scales (per_tensor"));
  v = nvfp4_view(pages, &scale);
  v.scale_mode = KvScaleMode::per_token;
  v.k_token_scales = v.v_token_scales = const_cast<float*>(&scale);
  s = validate_cache_view(v);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("takes scale mode per_tensor"));
  v = nvfp4_view(pages, &scale);
  // Strides count bytes (the page arrays' storage): a page is page_size * heads * 9 D / 16.
  CHECK(packed_page_elements(v) == static_cast<std::int64_t>(v.page_size) * v.num_kv_heads * v.head_dim * 9 / 16);
  v.page_stride = 2 * packed_page_elements(v);  // an interleaved K/V allocation (vLLM's blocks)
  CHECK(validate_cache_view(v).ok());
  CHECK(page_stride_bytes(v) == 2 * packed_page_elements(v));
  v.page_stride = packed_page_elements(v);  // the packed stride, spelled out
  CHECK(validate_cache_view(v).ok());
  v.page_stride = packed_page_elements(v) - 16;  // pages overlap
  s = validate_cache_view(v);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("at least one page") && Catch::Contains("bytes"));
  v.page_stride = packed_page_elements(v) + 8;  // not whole 16-byte steps
  s = validate_cache_view(v);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK_THAT(std::string(s.message()), Catch::Contains("multiple of 16 bytes"));
  v = nvfp4_view(pages, &scale);
  v.head_dim = 96;  // 54-byte vectors: not whole 4-byte words
  s = validate_cache_view(v);
  CHECK(s.code() == StatusCode::unsupported);
  CHECK_THAT(std::string(s.message()), Catch::Contains("head_dim 96 is 54 bytes") && Catch::Contains("64, 128, 192, 256"));
  for (const int head_dim : {64, 128, 192, 256}) {
    v.head_dim = head_dim;
    CHECK(validate_cache_view(v).ok());
  }
}

TEST_CASE("a kernel family refuses a format its trait does not list, naming both", "[kv][format][nvfp4]") {
  for (const KvKernel kernel : {KvKernel::append, KvKernel::dequantize, KvKernel::decode, KvKernel::paged_attention}) {
    for (int value = 0; value < 4; ++value) CHECK(require_kernel(static_cast<KvDtype>(value), kernel).ok());
    const bool listed = has_kernel(KvDtype::nvfp4, kernel);
    const Status s = require_kernel(KvDtype::nvfp4, kernel);
    CHECK(s.ok() == listed);
    if (listed) continue;
    CHECK(s.code() == StatusCode::unsupported);
    const std::string m(s.message());
    CHECK_THAT(m, Catch::Contains(std::string(to_string(kernel))) && Catch::Contains("nvfp4") &&
                      Catch::Contains("bf16, fp16, fp8_e4m3, fp8_e5m2"));
  }
}
