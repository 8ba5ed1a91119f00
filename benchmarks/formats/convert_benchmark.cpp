// Host bulk conversion throughput (bytes read + written per second).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "slimserve/formats/convert.hpp"

using namespace slimserve;

namespace {

template <class T>
std::vector<T> random_input(std::size_t n) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<T> values(n);
  for (T& v : values) v = from_float<T>(normal(rng));
  return values;
}

template <class In, class Out>
void BM_quantize(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const ConvertOptions options{static_cast<unsigned>(state.range(1)), std::size_t{1} << 18};
  const std::vector<In> src = random_input<In>(n);
  std::vector<Out> dst(n);
  for (auto _ : state) {
    Status status = quantize(std::span<const In>(src), std::span<Out>(dst), 0.75f, options);
    benchmark::DoNotOptimize(status);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * (sizeof(In) + sizeof(Out))));
  state.counters["elements/s"] = benchmark::Counter(static_cast<double>(state.iterations() * n),
                                                    benchmark::Counter::kIsRate);
}

template <class In>
void BM_dequantize(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const ConvertOptions options{static_cast<unsigned>(state.range(1)), std::size_t{1} << 18};
  const std::vector<In> src = random_input<In>(n);
  std::vector<float> dst(n);
  for (auto _ : state) {
    Status status = dequantize(std::span<const In>(src), std::span<float>(dst), 0.75f, options);
    benchmark::DoNotOptimize(status);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * (sizeof(In) + sizeof(float))));
}

// {elements, max_threads}: 16 Mi elements (a 64 MiB float tensor), 1 thread and 2 threads.
#define SLIMSERVE_SIZES Args({1 << 24, 1})->Args({1 << 24, 2})->Unit(benchmark::kMillisecond)->UseRealTime()
BENCHMARK_TEMPLATE(BM_quantize, float, fp8_e4m3)->SLIMSERVE_SIZES;
BENCHMARK_TEMPLATE(BM_quantize, float, fp8_e5m2)->SLIMSERVE_SIZES;
BENCHMARK_TEMPLATE(BM_quantize, bf16, fp8_e4m3)->SLIMSERVE_SIZES;
BENCHMARK_TEMPLATE(BM_quantize, float, bf16)->SLIMSERVE_SIZES;
BENCHMARK_TEMPLATE(BM_quantize, float, fp16)->SLIMSERVE_SIZES;
BENCHMARK_TEMPLATE(BM_dequantize, fp8_e4m3)->SLIMSERVE_SIZES;
BENCHMARK_TEMPLATE(BM_dequantize, bf16)->SLIMSERVE_SIZES;
BENCHMARK_TEMPLATE(BM_dequantize, fp16)->SLIMSERVE_SIZES;

}  // namespace

BENCHMARK_MAIN();
