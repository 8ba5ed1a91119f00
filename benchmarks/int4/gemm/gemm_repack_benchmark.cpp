// Host repack throughput: interchange form -> GEMM layout, for one 4096 x 4096 matrix.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>

#include "slimserve/int4/gemm_layout.hpp"

namespace {

using namespace slimserve;
using namespace slimserve::int4;

QuantizedMatrix make_matrix(std::int64_t k, std::int64_t n, std::int64_t group_size) {
  QuantizedMatrix m;
  m.k = k;
  m.n = n;
  m.group_size = group_size;
  m.symmetric = false;
  std::mt19937 rng(7);
  m.codes.resize(static_cast<std::size_t>(k / 8 * n));
  for (auto& w : m.codes) w = static_cast<std::uint32_t>(rng());
  m.scales.assign(static_cast<std::size_t>(k / group_size * n), 0.01f);
  m.zeros.assign(m.scales.size(), 7);
  return m;
}

void BM_RepackForGemm(benchmark::State& state) {
  const std::int64_t k = state.range(0);
  const std::int64_t n = state.range(1);
  const QuantizedMatrix matrix = make_matrix(k, n, 128);
  for (auto _ : state) {
    Result<GemmWeights> packed = repack_for_gemm(matrix, ActivationType::bf16);
    benchmark::DoNotOptimize(packed.ok());
  }
  // Bytes of packed codes produced (k * n / 2) per second.
  state.SetBytesProcessed(state.iterations() * k * n / 2);
}
BENCHMARK(BM_RepackForGemm)->Args({4096, 4096})->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
