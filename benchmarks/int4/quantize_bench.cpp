// Host quantizer throughput: bytes of source weights consumed per second.
//   args: source type (0 = F32, 1 = BF16, 2 = FP8 e4m3 + 128x128 block scales, 3 = FP16),
//         layout (0 = [K, N], 1 = [N, K]), group size (0 = per-channel), symmetric,
//         clip-search steps, threads.

#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "slimserve/formats/float_formats.hpp"
#include "slimserve/int4/quantize.hpp"

namespace int4 = slimserve::int4;

namespace {

constexpr std::int64_t kK = 4096, kN = 4096;

struct Source {
  int4::Tensor weight, block_scales;
};

Source make_source(int type, bool n_by_k) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const std::vector<std::int64_t> shape = n_by_k ? std::vector<std::int64_t>{kN, kK}
                                                 : std::vector<std::int64_t>{kK, kN};
  Source source;
  if (type == 0) {
    source.weight = int4::Tensor(int4::ElementType::float32, shape);
    for (std::int64_t i = 0; i < kK * kN; ++i) source.weight.set(i, normal(rng));
  } else if (type == 1) {
    source.weight = int4::Tensor(int4::ElementType::bfloat16, shape);
    for (std::int64_t i = 0; i < kK * kN; ++i) source.weight.set(i, slimserve::from_float<slimserve::bf16>(normal(rng)).bits);
  } else if (type == 3) {
    source.weight = int4::Tensor(int4::ElementType::float16, shape);
    for (std::int64_t i = 0; i < kK * kN; ++i) source.weight.set(i, slimserve::from_float<slimserve::fp16>(normal(rng)).bits);
  } else {
    source.weight = int4::Tensor(int4::ElementType::float8_e4m3, shape);
    for (std::int64_t i = 0; i < kK * kN; ++i) {
      auto b = static_cast<std::uint8_t>(rng());
      if ((b & 0x7F) == 0x7F) b = 0x38;
      source.weight.set(i, b);
    }
    source.block_scales = int4::Tensor(int4::ElementType::float32, {shape[0] / 128, shape[1] / 128});
    for (std::int64_t i = 0; i < source.block_scales.numel(); ++i) source.block_scales.set(i, 1e-3f);
  }
  return source;
}

void BM_Quantize(benchmark::State& state) {
  const int type = static_cast<int>(state.range(0));
  const bool n_by_k = state.range(1) != 0;
  int4::QuantizeOptions options;
  options.group_size = state.range(2);
  options.symmetric = state.range(3) != 0;
  options.clip.steps = static_cast<int>(state.range(4));
  options.num_threads = static_cast<int>(state.range(5));
  const Source source = make_source(type, n_by_k);
  const int4::BlockScales blocks{source.block_scales.view(), 128, 128};
  const auto layout = n_by_k ? int4::WeightLayout::n_by_k : int4::WeightLayout::k_by_n;
  for (auto _ : state) {
    auto q = int4::quantize(source.weight.view(), layout, options, type == 2 ? &blocks : nullptr);
    if (!q.ok()) {
      state.SkipWithError(q.status().to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(q->codes.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(source.weight.bytes.size()));
}

}  // namespace

BENCHMARK(BM_Quantize)
    ->ArgNames({"type", "nk", "group", "sym", "clip", "threads"})
    ->Args({0, 0, 128, 1, 0, 1})
    ->Args({0, 1, 128, 1, 0, 1})
    ->Args({1, 0, 128, 1, 0, 1})
    ->Args({1, 1, 128, 1, 0, 1})
    ->Args({3, 1, 128, 1, 0, 1})
    ->Args({1, 1, 128, 0, 0, 1})
    ->Args({1, 1, 32, 1, 0, 1})
    ->Args({1, 1, 0, 1, 0, 1})
    ->Args({2, 1, 128, 1, 0, 1})
    ->Args({1, 1, 128, 1, 10, 1})
    ->Args({1, 1, 128, 1, 0, 2})
    ->Args({0, 0, 128, 1, 0, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_MAIN();
