// Conversions in device code equal the host's, bit for bit. Under nvcc (formats_device_test_gpu)
// this checks the hardware cvt instructions the device path uses against the portable host
// path; under the CPU emulator it checks the same kernels run there.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "golden.hpp"
#include "slimserve/formats/formats.hpp"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"

using namespace slimserve;

namespace {

/// What the kernel computes for encoder input i (one float32).
struct EncodeResult {
  std::uint32_t fp8;       // e4m3 in bits 0..7, e5m2 in bits 8..15
  std::uint32_t halves;    // bf16 in bits 0..15, fp16 in bits 16..31
  std::uint32_t e4m3x4;    // from_float4<fp8_e4m3> of inputs 4j..4j+3 (lane 0 only, else 0)
  std::uint32_t e5m2x4;    // from_float4<fp8_e5m2>, likewise
  std::uint32_t bf16x2;    // from_float2<bf16> of inputs 2j, 2j+1 (even i only, else 0)
  std::uint32_t fp16x2;    // from_float2<fp16>, likewise
};

// [n] float32 inputs -> [n] results; grid-stride so a small grid covers any n.
__global__ void encode_kernel(const float* __restrict__ inputs, EncodeResult* __restrict__ out,
                              int n) {
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    const float x = inputs[i];
    EncodeResult r{};
    r.fp8 = static_cast<std::uint32_t>(from_float<fp8_e4m3>(x).bits) |
            (static_cast<std::uint32_t>(from_float<fp8_e5m2>(x).bits) << 8);
    r.halves = static_cast<std::uint32_t>(from_float<bf16>(x).bits) |
               (static_cast<std::uint32_t>(from_float<fp16>(x).bits) << 16);
    if (i % 4 == 0 && i + 3 < n) {
      const f32x4 v{inputs[i], inputs[i + 1], inputs[i + 2], inputs[i + 3]};
      r.e4m3x4 = from_float4<fp8_e4m3>(v);
      r.e5m2x4 = from_float4<fp8_e5m2>(v);
    }
    if (i % 2 == 0 && i + 1 < n) {
      const f32x2 v{inputs[i], inputs[i + 1]};
      r.bf16x2 = from_float2<bf16>(v);
      r.fp16x2 = from_float2<fp16>(v);
    }
    out[i] = r;
  }
}

/// What the kernel decodes from 32-bit word w (= its index, 0..65535).
struct DecodeResult {
  float bf16_scalar, fp16_scalar;  // to_float of the low half-word
  f32x2 bf16_pair, fp16_pair;      // to_float2 of (w | w << 16) ^ 0x80000000
  f32x4 e4m3_quad, e5m2_quad;      // to_float4 of w * 0x01010101 ^ 0x80FF0001 (all codes)
};

__device__ std::uint32_t fp8_test_word(std::uint32_t w) { return (w & 0xFFu) * 0x01010101u ^ 0x80FF0001u; }
__device__ std::uint32_t half_test_word(std::uint32_t w) { return (w | (w << 16)) ^ 0x80000000u; }

// [65536] results, one per 16-bit pattern.
__global__ void decode_kernel(DecodeResult* __restrict__ out) {
  for (std::uint32_t w = blockIdx.x * blockDim.x + threadIdx.x; w < 65536u;
       w += gridDim.x * blockDim.x) {
    DecodeResult r;
    r.bf16_scalar = to_float(bf16::from_bits(static_cast<std::uint16_t>(w)));
    r.fp16_scalar = to_float(fp16::from_bits(static_cast<std::uint16_t>(w)));
    r.bf16_pair = to_float2<bf16>(half_test_word(w));
    r.fp16_pair = to_float2<fp16>(half_test_word(w));
    r.e4m3_quad = to_float4<fp8_e4m3>(fp8_test_word(w));
    r.e5m2_quad = to_float4<fp8_e5m2>(fp8_test_word(w));
    out[w] = r;
  }
}

std::uint32_t bits(float x) { return slimserve_test::bits_of(x); }

/// Device allocation for the test (plain rt:: calls), freed on scope exit.
template <class T>
struct DeviceArray {
  T* data = nullptr;
  std::size_t count = 0;
  explicit DeviceArray(std::size_t n) : count(n) {
    void* ptr = nullptr;
    REQUIRE(rt::device_malloc(&ptr, n * sizeof(T)).ok());
    data = static_cast<T*>(ptr);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { (void)rt::device_free(data); }
  Status upload(const std::vector<T>& host) {
    return rt::copy_async(data, host.data(), count * sizeof(T), rt::CopyDirection::host_to_device, nullptr);
  }
  Status download(std::vector<T>& host) const {
    host.resize(count);
    return rt::copy_async(host.data(), data, count * sizeof(T), rt::CopyDirection::device_to_host, nullptr);
  }
  Status poison() { return rt::memset_async(data, 0xA5, count * sizeof(T), nullptr); }
};

}  // namespace

TEST_CASE("device encoders equal the host encoders bit for bit", "[formats][kernel]") {
  std::vector<float> inputs;
  for (std::uint32_t b : slimserve_test::load_golden<std::uint32_t>("f32_inputs.u32")) {
    inputs.push_back(slimserve_test::float_of(b));
  }
#if defined(SLIMSERVE_PLATFORM_EMULATOR)
  inputs.resize(32768);  // the emulator runs ~100x slower than native code: a slice suffices
#endif
  const int n = static_cast<int>(inputs.size());
  DeviceArray<float> d_inputs(inputs.size());
  DeviceArray<EncodeResult> d_out(inputs.size());
  REQUIRE(d_inputs.upload(inputs).ok());
  REQUIRE(d_out.poison().ok());
  const Status launched = rt::launch(encode_kernel, rt::LaunchConfig{dim3(32), dim3(128), 0, nullptr},
                                     d_inputs.data, d_out.data, n);
  REQUIRE(launched.ok());
  std::vector<EncodeResult> out;
  REQUIRE(d_out.download(out).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());

  std::size_t failures = 0;
  for (int i = 0; i < n; ++i) {
    const float x = inputs[static_cast<std::size_t>(i)];
    EncodeResult e{};
    e.fp8 = static_cast<std::uint32_t>(from_float<fp8_e4m3>(x).bits) |
            (static_cast<std::uint32_t>(from_float<fp8_e5m2>(x).bits) << 8);
    e.halves = static_cast<std::uint32_t>(from_float<bf16>(x).bits) |
               (static_cast<std::uint32_t>(from_float<fp16>(x).bits) << 16);
    const auto at = [&](int k) { return inputs[static_cast<std::size_t>(k)]; };
    if (i % 4 == 0 && i + 3 < n) {
      const f32x4 v{at(i), at(i + 1), at(i + 2), at(i + 3)};
      e.e4m3x4 = from_float4<fp8_e4m3>(v);
      e.e5m2x4 = from_float4<fp8_e5m2>(v);
    }
    if (i % 2 == 0 && i + 1 < n) {
      e.bf16x2 = from_float2<bf16>(f32x2{at(i), at(i + 1)});
      e.fp16x2 = from_float2<fp16>(f32x2{at(i), at(i + 1)});
    }
    const EncodeResult& g = out[static_cast<std::size_t>(i)];
    const bool same = g.fp8 == e.fp8 && g.halves == e.halves && g.e4m3x4 == e.e4m3x4 &&
                      g.e5m2x4 == e.e5m2x4 && g.bf16x2 == e.bf16x2 && g.fp16x2 == e.fp16x2;
    if (!same && ++failures <= 10) {
      FAIL_CHECK("input " << i << " (bits " << bits(x) << "): device fp8 " << g.fp8 << " halves "
                          << g.halves << ", host fp8 " << e.fp8 << " halves " << e.halves);
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("device decoders equal the host decoders on every code", "[formats][kernel]") {
  DeviceArray<DecodeResult> d_out(65536);
  REQUIRE(d_out.poison().ok());
  REQUIRE(rt::launch(decode_kernel, rt::LaunchConfig{dim3(64), dim3(128), 0, nullptr},
                     d_out.data).ok());
  std::vector<DecodeResult> out;
  REQUIRE(d_out.download(out).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());

  std::size_t failures = 0;
  for (std::uint32_t w = 0; w < 65536u; ++w) {
    const DecodeResult& g = out[w];
    const auto h = static_cast<std::uint16_t>(w);
    const std::uint32_t half_word = (w | (w << 16)) ^ 0x80000000u;
    const std::uint32_t fp8_word = (w & 0xFFu) * 0x01010101u ^ 0x80FF0001u;
    const f32x2 bf = to_float2<bf16>(half_word), fh = to_float2<fp16>(half_word);
    const f32x4 e4 = to_float4<fp8_e4m3>(fp8_word), e5 = to_float4<fp8_e5m2>(fp8_word);
    bool same = bits(g.bf16_scalar) == bits(to_float(bf16::from_bits(h))) &&
                bits(g.fp16_scalar) == bits(to_float(fp16::from_bits(h))) &&
                bits(g.bf16_pair.x) == bits(bf.x) && bits(g.bf16_pair.y) == bits(bf.y) &&
                bits(g.fp16_pair.x) == bits(fh.x) && bits(g.fp16_pair.y) == bits(fh.y);
    const float device_quads[8] = {g.e4m3_quad.x, g.e4m3_quad.y, g.e4m3_quad.z, g.e4m3_quad.w,
                                   g.e5m2_quad.x, g.e5m2_quad.y, g.e5m2_quad.z, g.e5m2_quad.w};
    const float host_quads[8] = {e4.x, e4.y, e4.z, e4.w, e5.x, e5.y, e5.z, e5.w};
    for (int k = 0; k < 8; ++k) same = same && bits(device_quads[k]) == bits(host_quads[k]);
    if (!same && ++failures <= 10) FAIL_CHECK("decode mismatch for word " << w);
  }
  CHECK(failures == 0);
}
