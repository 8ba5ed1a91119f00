// NVFP4's device pieces against FP64 references written here from the format definitions
// (textbook value formulas and nearest-value searches, never the code under test):
//  * E2M1 in device code: every golden input encoded, every code decoded (ml_dtypes' tables);
//  * the lane-pair quantizer of a head vector (D = 64, 128, 256): every code and every block
//    scale bit for bit, on random data of fresh seeds with per-block magnitudes from flushed to
//    saturated, +-inf, NaN, zero blocks, and invalid tensor scales; reconstruction error within
//    half a code step;
//  * the register widening: all 256 byte values in every byte position of a word, times all
//    256 E4M3 scale codes, to FP16 and to BF16, exact (NaN scales give NaN);
//  * the Walsh-Hadamard rotation: against H x / sqrt(D) in FP64, rotating twice gives x back,
//    and q.k is unchanged by rotating both.
// KERNEL: on a GPU the same kernels check the hardware (prmt, mul.rn.{f16x2,bf16x2}, cvt).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "golden.hpp"
#include "slimserve/formats/fp4.hpp"
#include "slimserve/formats/hadamard.cuh"
#include "slimserve/formats/nvfp4.hpp"
#include "slimserve/formats/nvfp4_quantize.cuh"
#include "slimserve/formats/nvfp4_widen.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "support/random.hpp"

using namespace slimserve;
namespace rt = slimserve::rt;

namespace {

// ---- kernels -----------------------------------------------------------------------------

__global__ void e2m1_kernel(const float* __restrict__ in, std::uint8_t* __restrict__ codes,
                            float* __restrict__ decoded, int n) {
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    codes[i] = from_float<fp4_e2m1>(in[i]).bits;
    if (i < 16) decoded[i] = to_float(fp4_e2m1::from_bits(static_cast<std::uint8_t>(i)));
  }
}

// One thread per 8 elements of x [vectors, D]; codes [vectors, D / 8] words, scales
// [vectors, D / 16] bytes (written by the even lane of each pair).
__global__ void quantize_kernel(const float* __restrict__ x, const float* __restrict__ tensor_scale,
                                std::uint32_t* __restrict__ codes, std::uint8_t* __restrict__ scales) {
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  float v[8];
  for (int k = 0; k < 8; ++k) v[k] = x[8 * t + k];
  const Nvfp4LaneCodes q = nvfp4_quantize_lane(v, *tensor_scale);
  codes[t] = q.codes;
  if (t % 2 == 0) scales[t / 2] = q.scale.bits;
}

// Thread s (one per scale code) widens all 256 test words with scale pair (s, s ^ 0x5A).
template <class T>
__global__ void widen_kernel(const std::uint32_t* __restrict__ words,
                             std::uint32_t* __restrict__ out) {  // [256 scales][2][256 words][4]
  const unsigned s = blockIdx.x * blockDim.x + threadIdx.x;
  std::uint32_t operand[2];
  nvfp4_scale_operands<T>(static_cast<std::uint16_t>(s | ((s ^ 0x5Au) << 8)), operand);
  for (int b = 0; b < 2; ++b) {
    for (int w = 0; w < 256; ++w) {
      std::uint32_t r[4];
      nvfp4_widen8<T>(words[w], operand[b], r);
      std::uint32_t* o = out + ((static_cast<std::size_t>(s) * 2 + b) * 256 + w) * 4;
      for (int i = 0; i < 4; ++i) o[i] = r[i];
    }
  }
}

// x [vectors, D] -> y: rotated once (pass 1) or twice (pass 2).
template <int D>
__global__ void hadamard_kernel(const float* __restrict__ x, float* __restrict__ once,
                                float* __restrict__ twice) {
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  float v[8];
  for (int k = 0; k < 8; ++k) v[k] = x[8 * t + k];
  hadamard_rotate<D>(v);
  for (int k = 0; k < 8; ++k) once[8 * t + k] = v[k];
  hadamard_rotate<D>(v);
  for (int k = 0; k < 8; ++k) twice[8 * t + k] = v[k];
}

// ---- FP64 references ---------------------------------------------------------------------

double e2m1_value(unsigned code) {
  static const double magnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (code & 8u) ? -magnitude[code & 7u] : magnitude[code & 7u];
}
// OCP e4m3fn: bias 7, subnormals m * 2^-9, S.1111.111 NaN.
double e4m3_value(unsigned code) {
  const unsigned e = (code >> 3) & 0xFu, m = code & 7u;
  if (e == 15 && m == 7) return NAN;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, static_cast<int>(e) - 7);
  return (code & 0x80u) ? -v : v;
}
// Nearest of the non-negative codes [0, count) of a format (value(code) ascending), ties to
// the even code, beyond the largest: the largest. Sign applied by the caller.
template <class Value>
unsigned nearest_code(double magnitude, unsigned count, Value value) {
  unsigned best = 0;
  double best_error = INFINITY;
  for (unsigned c = 0; c < count; ++c) {
    const double error = std::fabs(value(c) - magnitude);
    if (error < best_error || (error == best_error && (c & 1u) == 0)) {
      best = c;
      best_error = error;
    }
  }
  return best;
}
unsigned e2m1_reference(double x) {  // NaN -> +0, saturating
  if (std::isnan(x)) return 0;
  // At and beyond 6 the largest code (a search in double would lose the distances there).
  const unsigned magnitude = std::fabs(x) >= 6.0 ? 7u : nearest_code(std::fabs(x), 8, e2m1_value);
  return (std::signbit(x) ? 8u : 0u) | magnitude;
}
unsigned e4m3_reference(double x) {  // x >= 0 finite or inf: satfinite
  if (std::isinf(x)) return 0x7E;
  return nearest_code(x, 0x7F, e4m3_value);  // 0x00..0x7E (0x7F is NaN)
}
float round_f32(double x) { return static_cast<float>(x); }  // one correct rounding

struct BlockReference {
  unsigned scale;
  unsigned codes[16];
};
// The documented rule, step by step in FP64 with each FP32 operation rounded as the rule says.
BlockReference block_reference(const float* x, float tensor_scale) {
  BlockReference r{};
  // The format's domain: (0, FLT_MAX / 2^14], so that a reader's 2^14 widening unit times it is finite.
  const bool scale_ok = tensor_scale > 0.0f && tensor_scale <= std::ldexp(FLT_MAX, -14);
  bool nan = false;
  double amax = 0.0;
  for (int i = 0; i < 16; ++i) {
    nan = nan || std::isnan(x[i]);
    amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
  }
  if (!scale_ok || nan) {
    r.scale = 0x7F;
    // Multiplier 0: the codes are signed zeros (NaN * 0 and inf * 0 are NaN: +0).
    for (int i = 0; i < 16; ++i) r.codes[i] = e2m1_reference(static_cast<double>(round_f32(x[i] * 0.0)));
    return r;
  }
  const float denominator = round_f32(6.0 * tensor_scale);
  const float quotient = round_f32(amax / denominator);
  r.scale = e4m3_reference(quotient);
  const float step = round_f32(e4m3_value(r.scale) * tensor_scale);
  const float multiplier = (step > 0.0f && std::isfinite(step)) ? round_f32(1.0 / step) : 0.0f;
  for (int i = 0; i < 16; ++i) r.codes[i] = e2m1_reference(round_f32(static_cast<double>(x[i]) * multiplier));
  return r;
}

double fp16_value(std::uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const double m = (h & 0x3FF) / 1024.0;
  const double v = e == 0 ? std::ldexp(m, -14) : e == 31 ? (m == 0 ? INFINITY : NAN) : std::ldexp(1.0 + m, e - 15);
  return (h & 0x8000) ? -v : v;
}
double bf16_value(std::uint16_t h) {
  const int e = (h >> 7) & 0xFF;
  const double m = (h & 0x7F) / 128.0;
  const double v = e == 0 ? std::ldexp(m, -126) : e == 255 ? (m == 0 ? INFINITY : NAN) : std::ldexp(1.0 + m, e - 127);
  return (h & 0x8000) ? -v : v;
}

template <class T>
std::vector<T> download(const rt::DeviceBuffer<T>& buffer, std::size_t n) {
  std::vector<T> host(n);
  REQUIRE(buffer.download(host).ok());
  return host;
}
template <class T>
rt::DeviceBuffer<T> upload(const std::vector<T>& host) {
  auto buffer = rt::DeviceBuffer<T>::create(host.size());
  REQUIRE(buffer.ok());
  REQUIRE(buffer->upload(host).ok());
  return std::move(*buffer);
}
template <class T>
rt::DeviceBuffer<T> poisoned(std::size_t n) {
  auto buffer = rt::DeviceBuffer<T>::create(n);
  REQUIRE(buffer.ok());
  REQUIRE(buffer->fill_bytes(0xAB).ok());
  return std::move(*buffer);
}

}  // namespace

TEST_CASE("e2m1 in device code equals ml_dtypes' tables", "[formats][fp4][kernel]") {
  const auto input_bits = slimserve_test::load_golden<std::uint32_t>("f32_inputs.u32");
  const auto golden = slimserve_test::load_golden<std::uint8_t>("f32_to_e2m1.u8");
  const auto decoded_golden = slimserve_test::load_golden<std::uint32_t>("e2m1_to_f32.u32");
  std::vector<float> inputs(input_bits.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) inputs[i] = slimserve_test::float_of(input_bits[i]);
  const int n = static_cast<int>(inputs.size());
  auto d_in = upload(inputs);
  auto d_codes = poisoned<std::uint8_t>(inputs.size());
  auto d_decoded = poisoned<float>(16);
  REQUIRE(rt::launch(&e2m1_kernel, {dim3(16), dim3(128), 0, nullptr}, d_in.data(), d_codes.data(),
                     d_decoded.data(), n).ok());
  const auto codes = download(d_codes, inputs.size());
  const auto decoded = download(d_decoded, 16);
  std::size_t wrong = 0, first = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::uint8_t want = slimserve_test::is_nan_bits(input_bits[i]) ? 0u : golden[i];
    if (codes[i] != want && wrong++ == 0) first = i;
  }
  INFO("first mismatch: input " << first << " bits 0x" << std::hex << input_bits[first]);
  CHECK(wrong == 0);
  for (int c = 0; c < 16; ++c) CHECK(slimserve_test::bits_of(decoded[c]) == decoded_golden[c]);
}

TEMPLATE_TEST_CASE_SIG("NVFP4 lane-pair quantizer: every code and scale against the FP64 rule",
                       "[formats][nvfp4][kernel]", ((int D), D), 64, 128, 256) {
  auto rng = slimserve_test::make_rng(0xF4 + D);
  constexpr int vectors = 96;
  constexpr int blocks_per_vector = D / 16;
  const int n = vectors * D;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_magnitude(-14.0f, 14.0f);
  std::uniform_int_distribution<int> special(0, 15);

  for (const float tensor_scale : {std::ldexp(1.0f, std::uniform_int_distribution<int>(-12, 2)(rng)) * 1.37f,
                                   1.0f, 0.0f, -2.0f, NAN, INFINITY, std::ldexp(FLT_MAX, -14),
                                   std::nextafter(std::ldexp(FLT_MAX, -14), INFINITY)}) {
    INFO("tensor scale " << tensor_scale);
    std::vector<float> x(n);
    for (int b = 0; b < vectors * blocks_per_vector; ++b) {
      // Per-block magnitudes from flushed (amax / 6 < 2^-10 * tensor scale) to saturated.
      const float magnitude = std::exp2(log_magnitude(rng));
      for (int i = 0; i < 16; ++i) x[16 * b + i] = normal(rng) * magnitude;
      switch (special(rng)) {
        case 0: std::fill_n(&x[16 * b], 16, 0.0f); break;
        case 1: x[16 * b + special(rng)] = INFINITY; break;
        case 2: x[16 * b + special(rng)] = -INFINITY; break;
        case 3: x[16 * b + special(rng)] = NAN; break;
        case 4: x[16 * b + special(rng)] *= 1.0e30f; break;
        case 5:  // exact code values: every element on the grid of one scale
          for (int i = 0; i < 16; ++i) x[16 * b + i] = static_cast<float>(e2m1_value(special(rng)) * 0.75);
          break;
        default: break;
      }
    }
    auto d_x = upload(x);
    auto d_scale = upload(std::vector<float>{tensor_scale});
    auto d_codes = poisoned<std::uint32_t>(n / 8);
    auto d_scales = poisoned<std::uint8_t>(n / 16);
    REQUIRE(rt::launch(&quantize_kernel, {dim3(n / 8 / 64), dim3(64), 0, nullptr}, d_x.data(),
                       d_scale.data(), d_codes.data(), d_scales.data()).ok());
    const auto codes = download(d_codes, n / 8);
    const auto scales = download(d_scales, n / 16);
    int flushed = 0, saturated = 0, nan_blocks = 0, compared = 0, wrong_codes = 0, too_far = 0;
    int first_wrong = -1;
    unsigned first_got = 0, first_want = 0;
    double worst = 0.0;
    for (int b = 0; b < n / 16; ++b) {
      const BlockReference ref = block_reference(&x[16 * b], tensor_scale);
      if (scales[b] != ref.scale) {
        INFO("block " << b << " scale 0x" << std::hex << ref.scale);
        REQUIRE(scales[b] == ref.scale);
      }
      flushed += ref.scale == 0 ? 1 : 0;
      saturated += ref.scale == 0x7E ? 1 : 0;
      nan_blocks += ref.scale == 0x7F ? 1 : 0;
      const float step = round_f32(e4m3_value(ref.scale) * tensor_scale);
      for (int i = 0; i < 16; ++i) {
        const unsigned got = (codes[(16 * b + i) / 8] >> (4 * (i % 8))) & 0xFu;
        if (got != ref.codes[i] && wrong_codes++ == 0) {
          first_wrong = 16 * b + i;
          first_got = got;
          first_want = ref.codes[i];
        }
        ++compared;
        // Reconstruction: within half the code spacing (0.5, 1 or 2 by binade) times the step,
        // unless the element saturated at +-6.
        const double xi = x[16 * b + i];
        if (ref.scale != 0x7F && std::isfinite(xi) && std::isfinite(step) && step > 0.0f &&
            std::fabs(xi) / step <= 6.0) {
          const double q = std::fabs(xi) / step;
          const double error = std::fabs(xi - e2m1_value(got) * step) / step;
          const double bound = (1.0 + 1e-6) * (q < 2.0 ? 0.25 : q < 4.0 ? 0.5 : 1.0);
          too_far += error > bound ? 1 : 0;
          worst = std::max(worst, error);
        }
      }
    }
    INFO("first wrong code: element " << first_wrong << " x " << (first_wrong >= 0 ? x[first_wrong] : 0.0f)
                                      << " got " << first_got << " want " << first_want);
    CHECK(wrong_codes == 0);
    CHECK(too_far == 0);
    CHECK(compared == n);
    if (tensor_scale > 0.0f && tensor_scale <= std::ldexp(FLT_MAX, -14)) {
      CHECK(flushed > 0);
      CHECK(nan_blocks > 0);
      if (tensor_scale == 1.0f) CHECK(saturated > 0);
      CHECK(worst <= 1.0 + 1e-6);
    } else {
      CHECK(nan_blocks == n / 16);
    }
  }
}

TEMPLATE_TEST_CASE("NVFP4 widening: 256 byte values x 256 scales, exact", "[formats][nvfp4][kernel]",
                   fp16, bf16) {
  // Word w holds byte values w, w + 67, w + 134, w + 201 (mod 256): every value at every position.
  std::vector<std::uint32_t> words(256);
  for (std::uint32_t w = 0; w < 256; ++w) {
    words[w] = w | ((w + 67) & 0xFFu) << 8 | ((w + 134) & 0xFFu) << 16 | ((w + 201) & 0xFFu) << 24;
  }
  auto d_words = upload(words);
  const std::size_t count = 256 * 2 * 256 * 4;
  auto d_out = poisoned<std::uint32_t>(count);
  REQUIRE(rt::launch(&widen_kernel<TestType>, {dim3(4), dim3(64), 0, nullptr}, d_words.data(),
                     d_out.data()).ok());
  const auto out = download(d_out, count);
  // Compare everything, report the first mismatch (an assertion per element is slow under
  // the sanitizers).
  std::size_t checked = 0, nans = 0, wrong = 0;
  unsigned first_scale = 0, first_code = 0, first_half = 0;
  for (unsigned s = 0; s < 256; ++s) {
    for (unsigned b = 0; b < 2; ++b) {
      const unsigned scale = b == 0 ? s : (s ^ 0x5Au);
      for (unsigned w = 0; w < 256; ++w) {
        for (unsigned e = 0; e < 8; ++e) {
          const unsigned code = (words[w] >> (4 * e)) & 0xFu;
          const std::uint32_t reg = out[((static_cast<std::size_t>(s) * 2 + b) * 256 + w) * 4 + e / 2];
          const auto half = static_cast<std::uint16_t>(reg >> (16 * (e % 2)));
          const double got = std::is_same_v<TestType, fp16> ? fp16_value(half) : bf16_value(half);
          const double want = e2m1_value(code) * e4m3_value(scale) / 128.0;
          const bool ok = std::isnan(want) ? std::isnan(got)
                                           : got == want && std::signbit(got) == std::signbit(want);
          nans += std::isnan(want) ? 1 : 0;
          if (!ok && wrong++ == 0) {
            first_scale = scale;
            first_code = code;
            first_half = half;
          }
          ++checked;
        }
      }
    }
  }
  INFO("first mismatch: scale 0x" << std::hex << first_scale << " code 0x" << first_code
                                  << " half 0x" << first_half);
  CHECK(wrong == 0);
  CHECK(checked == count * 2);
  CHECK(nans == 4 * 256 * 8);  // scale codes 0x7F and 0xFF, in both operands
}

TEMPLATE_TEST_CASE_SIG("Walsh-Hadamard rotation: FP64 reference, involution, q.k kept",
                       "[formats][hadamard][kernel]", ((int D), D), 64, 128, 256) {
  auto rng = slimserve_test::make_rng(0x4AD + D);
  constexpr int vectors = 64;  // even: vector 2j is a query, 2j + 1 a key
  std::vector<float> x(vectors * D);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  for (int t = 0; t < vectors; ++t) x[t * D + (t * 7) % D] += 40.0f;  // an outlier channel each
  auto d_x = upload(x);
  auto d_once = poisoned<float>(x.size());
  auto d_twice = poisoned<float>(x.size());
  REQUIRE(rt::launch(&hadamard_kernel<D>, {dim3(vectors * D / 8 / 32), dim3(32), 0, nullptr},
                     d_x.data(), d_once.data(), d_twice.data()).ok());
  const auto once = download(d_once, x.size());
  const auto twice = download(d_twice, x.size());
  const double eps = std::ldexp(1.0, -24);
  const double rounds = std::log2(static_cast<double>(D)) + 2.0;
  for (int t = 0; t < vectors; ++t) {
    double l1 = 0.0, l2 = 0.0;
    for (int j = 0; j < D; ++j) {
      l1 += std::fabs(x[t * D + j]);
      l2 += static_cast<double>(x[t * D + j]) * x[t * D + j];
    }
    for (int i = 0; i < D; ++i) {
      double want = 0.0;
      for (int j = 0; j < D; ++j) {
        want += (__builtin_popcount(static_cast<unsigned>(i & j)) & 1 ? -1.0 : 1.0) * x[t * D + j];
      }
      want /= std::sqrt(static_cast<double>(D));
      INFO("vector " << t << " element " << i);
      // Each butterfly round rounds once with error <= eps * (partial sums <= l1).
      CHECK(std::fabs(once[t * D + i] - want) <= rounds * eps * l1 / std::sqrt(static_cast<double>(D)) + 1e-30);
      CHECK(std::fabs(twice[t * D + i] - x[t * D + i]) <= 2.0 * rounds * eps * l1 / std::sqrt(static_cast<double>(D)) * std::sqrt(static_cast<double>(D)));
    }
    (void)l2;
  }
  // q.k: each rotated element is off by at most E = rounds * eps * |x|_1 / sqrt(D) (above), so
  // the rotated dot product is off by at most |Hq|_1 E_k + |Hk|_1 E_q + D E_q E_k.
  for (int j = 0; j < vectors; j += 2) {
    double plain = 0.0, rotated = 0.0, q1 = 0.0, k1 = 0.0, hq1 = 0.0, hk1 = 0.0;
    for (int i = 0; i < D; ++i) {
      plain += static_cast<double>(x[j * D + i]) * x[(j + 1) * D + i];
      rotated += static_cast<double>(once[j * D + i]) * once[(j + 1) * D + i];
      q1 += std::fabs(static_cast<double>(x[j * D + i]));
      k1 += std::fabs(static_cast<double>(x[(j + 1) * D + i]));
      hq1 += std::fabs(static_cast<double>(once[j * D + i]));
      hk1 += std::fabs(static_cast<double>(once[(j + 1) * D + i]));
    }
    const double root = std::sqrt(static_cast<double>(D));
    const double eq = rounds * eps * q1 / root, ek = rounds * eps * k1 / root;
    INFO("pair " << j << " plain " << plain << " rotated " << rotated);
    CHECK(std::fabs(plain - rotated) <= 1.01 * (hq1 * ek + hk1 * eq + D * eq * ek));
  }
}

namespace {
// The pieces composed the way an append + attention pair would use them, one head vector per
// D / 8 lanes: rotate, quantize by lane pairs, then widen each lane's word with its block's
// scale. out [vectors, D] FP16 bits (widened, in units of nvfp4_widened_unit^-1).
template <int D>
__global__ void round_trip_kernel(const float* __restrict__ x, const float* __restrict__ tensor_scale,
                                  std::uint32_t* __restrict__ codes, std::uint8_t* __restrict__ scales,
                                  std::uint32_t* __restrict__ widened) {  // [vectors * D / 2]
  const int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  float v[8];
  for (int k = 0; k < 8; ++k) v[k] = x[8 * t + k];
  hadamard_rotate<D>(v);
  const Nvfp4LaneCodes q = nvfp4_quantize_lane(v, *tensor_scale);
  codes[t] = q.codes;
  if (t % 2 == 0) scales[t / 2] = q.scale.bits;
  std::uint32_t operand[2];
  nvfp4_scale_operands<fp16>(static_cast<std::uint16_t>(q.scale.bits * 0x101u), operand);
  std::uint32_t r[4];
  nvfp4_widen8<fp16>(q.codes, operand[0], r);
  for (int i = 0; i < 4; ++i) widened[4 * t + i] = r[i];
}
}  // namespace

TEMPLATE_TEST_CASE_SIG("NVFP4 round trip: rotate, quantize, widen (FP16) against FP64",
                       "[formats][nvfp4][hadamard][kernel]", ((int D), D), 64, 128, 256) {
  auto rng = slimserve_test::make_rng(0x7219 + D);
  constexpr int vectors = 64;
  std::vector<float> x(vectors * D);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng) * 3.0f;
  for (int t = 0; t < vectors; ++t) x[t * D + (t * 13) % D] = 200.0f;  // an outlier each
  const float tensor_scale = 200.0f / 2688.0f;  // amax / (6 * 448)
  auto d_x = upload(x);
  auto d_scale = upload(std::vector<float>{tensor_scale});
  auto d_codes = poisoned<std::uint32_t>(x.size() / 8);
  auto d_scales = poisoned<std::uint8_t>(x.size() / 16);
  auto d_widened = poisoned<std::uint32_t>(x.size() / 2);
  REQUIRE(rt::launch(&round_trip_kernel<D>, {dim3(vectors * D / 8 / 32), dim3(32), 0, nullptr},
                     d_x.data(), d_scale.data(), d_codes.data(), d_scales.data(), d_widened.data()).ok());
  const auto codes = download(d_codes, x.size() / 8);
  const auto scales = download(d_scales, x.size() / 16);
  const auto widened = download(d_widened, x.size() / 2);
  std::size_t wrong_widen = 0, too_far = 0;
  double worst = 0.0;
  for (int t = 0; t < vectors; ++t) {
    for (int i = 0; i < D; ++i) {
      double rotated = 0.0;  // FP64 H x / sqrt(D)
      for (int j = 0; j < D; ++j) {
        rotated += (__builtin_popcount(static_cast<unsigned>(i & j)) & 1 ? -1.0 : 1.0) * x[t * D + j];
      }
      rotated /= std::sqrt(static_cast<double>(D));
      const int e = t * D + i;
      const unsigned code = (codes[e / 8] >> (4 * (e % 8))) & 0xFu;
      const double step = e4m3_value(scales[e / 16]) * tensor_scale;
      const double decoded = e2m1_value(code) * step;  // exact value the cache holds
      const auto half = static_cast<std::uint16_t>(widened[e / 2] >> (16 * (e % 2)));
      wrong_widen += fp16_value(half) * nvfp4_widened_unit * tensor_scale == decoded ? 0 : 1;
      // Half the code spacing at the element's binade (the scale keeps |x| / step <= 6.375, so
      // saturation adds at most 0.375 steps), plus the FP32 rotation's rounding.
      const double q = std::fabs(rotated) / step;
      const double bound = step * (q < 2.0 ? 0.25 : q < 4.0 ? 0.5 : 1.0) + 0.375 * step * (q > 6.0) + 1e-4;
      const double error = std::fabs(decoded - rotated);
      too_far += error > bound ? 1 : 0;
      worst = std::max(worst, error / step);
    }
  }
  CHECK(wrong_widen == 0);
  CHECK(too_far == 0);
  CHECK(worst <= 1.375 + 1e-3);
}

namespace {
__global__ void bf16_multiply_kernel(const std::uint32_t* __restrict__ a, const std::uint32_t* __restrict__ b,
                                     std::uint32_t* __restrict__ d, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) d[i] = arch::mul_rn_bf16x2(a[i], b[i]);
}
// Round to nearest bf16, ties to the even code, by a binary search over the (monotonic)
// positive codes 0x0000..0x7F7F and their textbook values; beyond max + half an ulp: inf.
std::uint16_t bf16_reference(double p) {
  if (std::isnan(p)) return 0x7FC0;
  const std::uint16_t sign = std::signbit(p) ? 0x8000 : 0;
  const double m = std::fabs(p);
  const double max = bf16_value(0x7F7F), half_ulp = (bf16_value(0x7F7F) - bf16_value(0x7F7E)) / 2;
  if (m >= max + half_ulp) return sign | 0x7F80;
  unsigned lo = 0, hi = 0x7F7F;  // largest code with value <= m
  while (lo < hi) {
    const unsigned mid = (lo + hi + 1) / 2;
    if (bf16_value(static_cast<std::uint16_t>(mid)) <= m) lo = mid; else hi = mid - 1;
  }
  unsigned code = lo;
  if (lo < 0x7F7F) {
    const double below = m - bf16_value(static_cast<std::uint16_t>(lo));
    const double above = bf16_value(static_cast<std::uint16_t>(lo + 1)) - m;
    if (above < below || (above == below && (lo & 1u))) code = lo + 1;
  }
  return static_cast<std::uint16_t>(sign | code);
}
}  // namespace

TEST_CASE("mul.rn.bf16x2 (emulated or hardware) rounds once to nearest even",
          "[formats][nvfp4][arch][kernel]") {
  // Random finite bf16 pairs over the whole exponent range (products from subnormal to
  // overflow), plus exact and tie-producing pairs; both halves independently.
  auto rng = slimserve_test::make_rng(0xBF16);
  std::uniform_int_distribution<unsigned> bits(0, 0xFFFF);
  const int n = 40000;
  std::vector<std::uint32_t> a(n), b(n);
  auto finite = [&] {
    std::uint16_t h;
    do h = static_cast<std::uint16_t>(bits(rng)); while (((h >> 7) & 0xFF) == 0xFF);
    return h;
  };
  for (int i = 0; i < n; ++i) {
    std::uint16_t x[2], y[2];
    for (int k = 0; k < 2; ++k) {
      x[k] = finite();
      y[k] = finite();
      if (i % 4 == 1) y[k] = static_cast<std::uint16_t>((y[k] & 0x807F) | (((x[k] >> 7) & 0xFF) > 127 ? 0x2000 : 0x5F00));
      if (i % 4 == 2) y[k] = static_cast<std::uint16_t>(0x3F81 + (bits(rng) & 0x3E));  // near 1: ties
    }
    a[i] = x[0] | static_cast<std::uint32_t>(x[1]) << 16;
    b[i] = y[0] | static_cast<std::uint32_t>(y[1]) << 16;
  }
  auto d_a = upload(a), d_b = upload(b);
  auto d_d = poisoned<std::uint32_t>(n);
  REQUIRE(rt::launch(&bf16_multiply_kernel, {dim3((n + 127) / 128), dim3(128), 0, nullptr}, d_a.data(),
                     d_b.data(), d_d.data(), n).ok());
  const auto d = download(d_d, n);
  std::size_t wrong = 0, first = 0, subnormal = 0, overflow = 0;
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < 2; ++k) {
      const auto x = static_cast<std::uint16_t>(a[i] >> (16 * k));
      const auto y = static_cast<std::uint16_t>(b[i] >> (16 * k));
      const auto got = static_cast<std::uint16_t>(d[i] >> (16 * k));
      const std::uint16_t want = bf16_reference(bf16_value(x) * bf16_value(y));  // exact in double
      subnormal += (want & 0x7F80) == 0 && (want & 0x7F) != 0 ? 1 : 0;
      overflow += (want & 0x7FFF) == 0x7F80 ? 1 : 0;
      if (got != want && wrong++ == 0) first = static_cast<std::size_t>(i) * 2 + k;
    }
  }
  INFO("first mismatch at half " << first);
  CHECK(wrong == 0);
  CHECK(subnormal > 100);
  CHECK(overflow > 100);
}
