// Stream-K's in-place reduction of a shared tile (reduce_shared_tile): whichever block
// reduces, the segments are summed in block order, bit for bit.
//
// The emulator runs blocks in launch order, so in a real GEMM the highest block of a tile is
// always the one that reduces. Here a tile shared by three blocks is reduced with the launch
// order mapped to every order of the logical blocks, so the reducer's own segment (taken from
// its registers) is first, in the middle or last in the sum. The segments are chosen so that
// the reversed sum, or the small segment added last, rounds to different bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "slimserve/int4/gemm_kernel.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::int4;

namespace {

using Config = GemmTileConfig<16, 256, 1, 4, 4, true>;  // the decode tile of groups >= 64
constexpr int tile_elements = Config::block_m * Config::block_n;
constexpr int blocks = 3;

// Launch-order block x plays logical block logical_blocks[x]; its accumulators hold
// segments[logical][row][col] (the fragment layout of store_tile).
template <class T>
__global__ void reduce_in_logical_order_kernel(const __grid_constant__ GemmParams p,
                                               const __grid_constant__ StreamKSchedule schedule,
                                               const __grid_constant__ StreamKWorkspace workspace,
                                               const int* logical_blocks,  // [blocks]
                                               const float* segments) {    // [blocks, 16, 256]
  const int block = logical_blocks[blockIdx.x];
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int warp_col = (warp % Config::warps_n) * Config::warp_n;
  WarpAccumulators<Config> acc;
  for (int j = 0; j < 2 * Config::n16_per_warp; ++j) {
    for (int e = 0; e < 4; ++e) {
      const int row = lane / 4 + 8 * (e / 2);
      const int col = warp_col + j * 8 + (lane % 4) * 2 + e % 2;
      acc[0][j][e] = segments[block * tile_elements + row * Config::block_n + col];
    }
  }
  reduce_shared_tile<T, Config>(p, schedule, workspace, acc, block, 0, 0, 0);
}

template <class T>
void check_orders(ActivationType type) {
  auto rng = slimserve_test::make_rng(type == ActivationType::bf16 ? 41 : 42);
  std::uniform_real_distribution<float> fraction(0.55f, 0.95f);
  std::uniform_real_distribution<float> small(0.25f, 0.75f);
  std::uniform_int_distribution<int> exponent(0, 4);
  // Per element (times 2^p): 2^24, x in (0.5, 1), -(2^24 - 1). In block order 2^24 + x rounds
  // to 2^24 (an FP32 ulp there is 2) and the sum is 1; summed last-first, -(2^24 - 1) + x
  // rounds up (ulp 1) and the sum is 2; with x last it is 1 + x. All differ in T.
  std::vector<float> segments(static_cast<std::size_t>(blocks * tile_elements));
  std::vector<std::uint16_t> bias(Config::block_n);
  for (int i = 0; i < tile_elements; ++i) {
    const float scale = std::ldexp(1.0f, exponent(rng));
    segments[static_cast<std::size_t>(i)] = 16777216.0f * scale;
    segments[static_cast<std::size_t>(tile_elements + i)] = fraction(rng) * scale;
    segments[static_cast<std::size_t>(2 * tile_elements + i)] = -16777215.0f * scale;
  }
  for (auto& b : bias) b = to_activation_bits(type, small(rng));

  std::vector<std::uint16_t> want(static_cast<std::size_t>(tile_elements));
  int order_matters = 0;
  for (int i = 0; i < tile_elements; ++i) {
    const auto at = [&](int b) { return segments[static_cast<std::size_t>(b * tile_elements + i)]; };
    const float b_col = to_float(T::from_bits(bias[static_cast<std::size_t>(i % Config::block_n)]));
    float sum = 0.0f;
    for (int b = 0; b < blocks; ++b) sum += at(b);
    want[static_cast<std::size_t>(i)] = from_float<T>(sum + b_col).bits;
    const float reverse = ((0.0f + at(2)) + at(1)) + at(0);
    const float small_last = ((0.0f + at(0)) + at(2)) + at(1);
    if (from_float<T>(reverse + b_col).bits != want[static_cast<std::size_t>(i)] &&
        from_float<T>(small_last + b_col).bits != want[static_cast<std::size_t>(i)]) {
      ++order_matters;
    }
  }
  REQUIRE(order_matters == tile_elements);  // every element tells the orders apart

  auto d_segments = rt::DeviceBuffer<float>::create(segments.size());
  auto d_bias = rt::DeviceBuffer<std::uint16_t>::create(bias.size());
  auto d_c = rt::DeviceBuffer<std::uint16_t>::create(static_cast<std::size_t>(tile_elements));
  auto d_partials = rt::DeviceBuffer<float>::create(static_cast<std::size_t>(2 * blocks * tile_elements));
  auto d_arrivals = rt::DeviceBuffer<unsigned>::create(1);
  auto d_order = rt::DeviceBuffer<int>::create(blocks);
  REQUIRE(d_segments.ok());
  REQUIRE(d_bias.ok());
  REQUIRE(d_c.ok());
  REQUIRE(d_partials.ok());
  REQUIRE(d_arrivals.ok());
  REQUIRE(d_order.ok());
  REQUIRE(d_segments->upload(segments).ok());
  REQUIRE(d_bias->upload(bias).ok());

  GemmParams p{};
  p.bias = d_bias->data();
  p.c = d_c->data();
  p.m = Config::block_m;
  p.n = Config::block_n;
  p.k = 3 * Config::block_k;
  // One tile of 3 steps over 3 blocks: each block holds one step of it.
  StreamKSchedule schedule{};
  schedule.units = 3;
  schedule.blocks = blocks;
  schedule.k_steps = 3;
  schedule.tiles_n = 1;
  schedule.units_per_block = 1;
  schedule.remainder = 0;
  schedule.by_k_steps = FastDivisor::make(schedule.k_steps);
  schedule.by_tiles_n = FastDivisor::make(schedule.tiles_n);
  const StreamKWorkspace workspace{d_partials->data(), d_arrivals->data()};

  std::array<int, blocks> order = {0, 1, 2};
  do {
    CAPTURE(order[0], order[1], order[2]);
    const std::vector<int> logical(order.begin(), order.end());
    REQUIRE(d_order->upload(logical).ok());
    REQUIRE(d_arrivals->fill_bytes(0).ok());
    // 0x7F7F7F7F (3.4e38, finite): a slot read before it is written overflows the sum.
    REQUIRE(d_partials->fill_bytes(0x7F).ok());
    REQUIRE(d_c->fill_bytes(0xFF).ok());
    const rt::LaunchConfig config{dim3(blocks), dim3(Config::threads), 0, nullptr};
    REQUIRE(rt::launch(reduce_in_logical_order_kernel<T>, config, p, schedule, workspace,
                       static_cast<const int*>(d_order->data()),
                       static_cast<const float*>(d_segments->data()))
                .ok());
    std::vector<std::uint16_t> c(want.size());
    REQUIRE(d_c->download(c).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    int mismatches = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      if (c[i] != want[i] && ++mismatches <= 5) {
        UNSCOPED_INFO("C element " << i << ": got 0x" << std::hex << c[i] << " want 0x"
                                   << want[i] << std::dec);
      }
    }
    CHECK(mismatches == 0);
#if !defined(__CUDACC__)
    // After the sum the reducer discards the stored slots from L2 (the emulator poisons
    // discarded lines with 0xFF; on a GPU their contents are indeterminate, so this is checked
    // on the emulator only): the two blocks launched first stored theirs; the last one
    // launched reduced early and stored nothing, so its slot and every second slot (a block's
    // last-tile slot, unused here) still hold the fill.
    std::vector<std::uint32_t> slots(d_partials->size());
    REQUIRE(d_partials->download(std::span<float>(reinterpret_cast<float*>(slots.data()), slots.size())).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    int wrong_words = 0;
    for (int slot = 0; slot < 2 * blocks; ++slot) {
      const bool stored = slot % 2 == 0 && slot / 2 != order[blocks - 1];
      const std::uint32_t want_word = stored ? 0xFFFFFFFFu : 0x7F7F7F7Fu;
      for (int e = 0; e < tile_elements; ++e) {
        if (slots[static_cast<std::size_t>(slot * tile_elements + e)] != want_word && ++wrong_words <= 5) {
          UNSCOPED_INFO("slot " << slot << " element " << e << (stored ? " not discarded" : " touched"));
        }
      }
    }
    CHECK(wrong_words == 0);
#endif
  } while (std::next_permutation(order.begin(), order.end()));
}

__global__ void divide_kernel(const FastDivisor divisor, const int* numerators, int* quotients,
                              int count) {
  for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x)) {
    quotients[i] = divisor.divide(numerators[i]);
  }
}

}  // namespace

TEST_CASE("FastDivisor divides like / for every non-negative int and positive divisor") {
  auto rng = slimserve_test::make_rng(43);
  std::uniform_int_distribution<int> any(0, std::numeric_limits<int>::max());
  std::vector<int> divisors = {1, 2, 3, 5, 7, 64, 112, 127, 128, 129, 131, 132, 1000, 65535,
                               65536, 65537, (1 << 30) - 1, 1 << 30, (1 << 30) + 1,
                               std::numeric_limits<int>::max()};
  for (int i = 0; i < 12; ++i) divisors.push_back(any(rng) >> (i % 31));
  constexpr int count = 512;
  auto d_numerators = rt::DeviceBuffer<int>::create(count);
  auto d_quotients = rt::DeviceBuffer<int>::create(count);
  REQUIRE((d_numerators.ok() && d_quotients.ok()));
  for (int divisor : divisors) {
    divisor = std::max(divisor, 1);
    CAPTURE(divisor);
    // Edges around multiples of the divisor and the top of the range, and random values.
    std::vector<int> numerators = {0, 1, std::numeric_limits<int>::max(),
                                   std::numeric_limits<int>::max() - 1};
    for (std::int64_t q : {std::int64_t{1}, std::int64_t{2}, std::int64_t{1000},
                           std::int64_t{std::numeric_limits<int>::max()} / divisor}) {
      for (std::int64_t delta = -1; delta <= 1; ++delta) {
        const std::int64_t n = q * divisor + delta;
        if (n >= 0 && n <= std::numeric_limits<int>::max()) numerators.push_back(static_cast<int>(n));
      }
    }
    while (numerators.size() < static_cast<std::size_t>(count)) numerators.push_back(any(rng));
    REQUIRE(d_numerators->upload(numerators).ok());
    REQUIRE(d_quotients->fill_bytes(0xFF).ok());
    REQUIRE(rt::launch(divide_kernel, rt::LaunchConfig{dim3(1), dim3(128), 0, nullptr},
                       FastDivisor::make(divisor), static_cast<const int*>(d_numerators->data()),
                       d_quotients->data(), count)
                .ok());
    std::vector<int> quotients(count);
    REQUIRE(d_quotients->download(quotients).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    int wrong = 0;
    for (int i = 0; i < count; ++i) {
      if (quotients[static_cast<std::size_t>(i)] != numerators[static_cast<std::size_t>(i)] / divisor &&
          ++wrong <= 5) {
        UNSCOPED_INFO(numerators[static_cast<std::size_t>(i)] << " / " << divisor << ": got "
                                                              << quotients[static_cast<std::size_t>(i)]);
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("stream-K in-place reduction sums a shared tile in block order, whoever reduces") {
  check_orders<bf16>(ActivationType::bf16);
  check_orders<fp16>(ActivationType::fp16);
}
