// Register dequantization (magic numbers + lop3 + FMA) against the host formula, bit for bit,
// for every code, every zero point and scales from subnormal results to large values.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "slimserve/int4/dequant.cuh"
#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::int4;

namespace {

// Thread i dequantizes words[i] with (scale, zero) of its two columns; writes its 4 registers.
template <class T, bool Unscaled>
__global__ void dequantize_words_kernel(const std::uint32_t* words,     // [threads]
                                        const std::uint16_t* columns,   // [threads, 4]: s0 z0 s1 z1
                                        std::uint32_t* registers,       // [threads, 4]
                                        int count) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= count) return;
  const DequantColumn first = make_dequant_column<T>(columns[4 * i], columns[4 * i + 1]);
  const DequantColumn second = make_dequant_column<T>(columns[4 * i + 2], columns[4 * i + 3]);
  std::uint32_t b[4];
  if constexpr (Unscaled) {
    dequantize_word_unscaled<T>(words[i], first, second, b);
  } else {
    dequantize_word<T>(words[i], first, second, b);
  }
  for (int r = 0; r < 4; ++r) registers[4 * i + r] = b[r];
}

// Unscaled: the registers must hold q - z exactly (GroupScaling::per_group_sum).
template <class T, bool Unscaled>
void check_all_codes(ActivationType type) {
  auto rng = slimserve_test::make_rng(type == ActivationType::bf16 ? 11 : 12);
  // Scales: exact powers, random values, tiny ones (subnormal results) and large ones.
  const float max_scale = type == ActivationType::bf16 ? 1.0e30f : 4000.0f;
  const float min_scale = type == ActivationType::bf16 ? 1.0e-38f : 1.0e-7f;
  std::vector<float> scale_values = {1.0f, 0.5f, 3.0f, min_scale, max_scale, 0.0078125f};
  std::uniform_real_distribution<float> log_scale(std::log2(min_scale), std::log2(max_scale));
  while (scale_values.size() < 8) scale_values.push_back(std::exp2(log_scale(rng)));

  // Every (zero point, rotation of the 16 codes, scale): each nibble position sees all codes.
  std::vector<std::uint32_t> words;
  std::vector<std::uint16_t> columns;
  for (std::uint32_t zero = 0; zero < 16; ++zero) {
    for (std::uint32_t rotation = 0; rotation < 16; ++rotation) {
      for (std::size_t s = 0; s < scale_values.size(); ++s) {
        std::uint32_t word = 0;
        for (std::uint32_t nibble = 0; nibble < 8; ++nibble) {
          word |= ((rotation + nibble * 3) % 16) << (4 * nibble);
        }
        words.push_back(word);
        const float other_scale = scale_values[(s + 3) % scale_values.size()];
        columns.push_back(to_activation_bits(type, scale_values[s]));
        columns.push_back(to_activation_bits(type, static_cast<float>(zero)));
        columns.push_back(to_activation_bits(type, other_scale));
        columns.push_back(to_activation_bits(type, static_cast<float>((zero + 5) % 16)));
      }
    }
  }
  const int count = static_cast<int>(words.size());
  auto d_words = rt::DeviceBuffer<std::uint32_t>::create(words.size());
  auto d_columns = rt::DeviceBuffer<std::uint16_t>::create(columns.size());
  auto d_out = rt::DeviceBuffer<std::uint32_t>::create(words.size() * 4);
  REQUIRE(d_words.ok());
  REQUIRE(d_columns.ok());
  REQUIRE(d_out.ok());
  REQUIRE(d_words->upload(words).ok());
  REQUIRE(d_columns->upload(columns).ok());
  REQUIRE(d_out->fill_bytes(0xFF).ok());
  const unsigned threads = 128;
  const rt::LaunchConfig config{dim3((static_cast<unsigned>(count) + threads - 1) / threads),
                                dim3(threads), 0, nullptr};
  REQUIRE(rt::launch(dequantize_words_kernel<T, Unscaled>, config, d_words->data(), d_columns->data(),
                     d_out->data(), count)
              .ok());
  std::vector<std::uint32_t> out(words.size() * 4);
  REQUIRE(d_out->download(out).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());

  int mismatches = 0;
  for (int i = 0; i < count; ++i) {
    for (int nibble = 0; nibble < 8; ++nibble) {
      const int reg = nibble % 4;  // the layout's pairing: nibble i + 4h -> register i, half h
      const int half = nibble / 4;
      const std::uint32_t code = (words[static_cast<std::size_t>(i)] >> (4 * nibble)) & 0xFu;
      const std::size_t column = static_cast<std::size_t>(4 * i + (reg < 2 ? 0 : 2));
      const std::uint32_t zero = static_cast<std::uint32_t>(activation_to_float(type, columns[column + 1]));
      const std::uint16_t want =
          Unscaled ? to_activation_bits(type, static_cast<float>(static_cast<int>(code) -
                                                                 static_cast<int>(zero)))
                   : dequantize_reference(type, code, zero, columns[column]);
      const auto got = static_cast<std::uint16_t>(out[static_cast<std::size_t>(4 * i + reg)] >> (16 * half));
      if (got != want && ++mismatches <= 10) {
        UNSCOPED_INFO("thread " << i << " nibble " << nibble << " code " << code << " zero "
                                << zero << ": got 0x" << std::hex << got << " want 0x" << want
                                << std::dec);
      }
    }
  }
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("BF16 register dequantization is bit-exact for all codes, zeros and scales") {
  check_all_codes<bf16, false>(ActivationType::bf16);
}

TEST_CASE("BF16 unscaled register dequantization gives q - z exactly") {
  check_all_codes<bf16, true>(ActivationType::bf16);
}

TEST_CASE("FP16 unscaled register dequantization gives q - z exactly") {
  check_all_codes<fp16, true>(ActivationType::fp16);
}

TEST_CASE("FP16 register dequantization is bit-exact for all codes, zeros and scales") {
  check_all_codes<fp16, false>(ActivationType::fp16);
}
