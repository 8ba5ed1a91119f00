// The W4A16 GEMM (fused kernel and expansion path) against an FP64 reference.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <vector>

#include "gemm_test_runner.hpp"
#include "slimserve/int4/gemm.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::int4;
using slimserve_test::GemmCase;
using slimserve_test::MatrixSpec;

namespace {

constexpr std::array<std::int64_t, 7> m_values = {1, 2, 7, 16, 33, 128, 1000};

GemmOptions fused(int split_k) {
  GemmOptions options;
  options.path = GemmPath::fused;
  options.split_k = split_k;
  options.sm_count = 8;
  return options;
}

GemmOptions expand() {
  GemmOptions options;
  options.path = GemmPath::expand;
  return options;
}

}  // namespace

TEST_CASE("fused W4A16: every group size, symmetric and asymmetric, BF16 and FP16") {
  auto rng = slimserve_test::make_rng(21);
  const std::array<std::int64_t, 4> group_sizes = {32, 64, 128, 0};  // 0: per-channel
  const std::array<int, 4> splits = {1, 2, 3, 0};
  int index = 0;
  for (ActivationType type : {ActivationType::bf16, ActivationType::fp16}) {
    for (std::int64_t group : group_sizes) {
      for (bool symmetric : {true, false}) {
        const std::int64_t k = group == 128 ? 256 : 192;
        MatrixSpec spec{k, 48, group == 0 ? k : group, symmetric, false, type};
        GemmCase test{spec, m_values[static_cast<std::size_t>(index % 6)], index % 3 != 0,
                      fused(splits[static_cast<std::size_t>(index % 4)])};
        slimserve_test::run_and_check(test, rng);
        ++index;
      }
    }
  }
}

TEST_CASE("fused W4A16: groups 16 and 32 (constants remade inside a stage), both tiles, K tails") {
  auto rng = slimserve_test::make_rng(29);
  int index = 0;
  for (ActivationType type : {ActivationType::bf16, ActivationType::fp16}) {
    for (std::int64_t group : {std::int64_t{16}, std::int64_t{32}}) {
      for (bool symmetric : {true, false}) {
        // k = 224: 3 full stages and a 32-row tail; m = 1 (decode tile) or 21 (wide tile).
        MatrixSpec spec{224, 144, group, symmetric, false, type};
        GemmCase test{spec, index % 2 == 0 ? 1 : 21, index % 3 != 1, fused(1 + index % 3)};
        slimserve_test::run_and_check(test, rng);
        ++index;
      }
    }
  }
}

TEST_CASE("fused W4A16: M = 1, 2, 7, 16, 33, 128, 1000 (M tails masked)") {
  auto rng = slimserve_test::make_rng(22);
  for (std::int64_t m : m_values) {
    for (ActivationType type : {ActivationType::bf16, ActivationType::fp16}) {
      const bool small = m <= 16;
      // Large M keeps N to one 16-column tile: the emulated run stays well under a second.
      MatrixSpec spec{128, small ? 144 : (m >= 128 ? 16 : 32), 64, m % 2 == 0, false, type};
      GemmCase test{spec, m, m % 3 == 1, fused(small ? 2 : 1)};
      slimserve_test::run_and_check(test, rng);
    }
  }
}

TEST_CASE("fused W4A16: K and N tails (K % 64 != 0, N % 128 != 0) with split-K") {
  auto rng = slimserve_test::make_rng(23);
  // k = 208: per-channel, 208 % 64 = 16; k = 160: group 32, 160 % 64 = 32; n = 144 and 16.
  const std::array<MatrixSpec, 4> specs = {{
      {208, 144, 208, true, false, ActivationType::bf16},
      {160, 16, 32, false, false, ActivationType::fp16},
      {160, 144, 32, true, false, ActivationType::fp16},
      {208, 16, 208, false, false, ActivationType::bf16},
  }};
  int index = 0;
  for (const MatrixSpec& spec : specs) {
    for (int split : {1, 3}) {
      GemmCase test{spec, index % 2 == 0 ? 1 : 20, true, fused(split)};
      slimserve_test::run_and_check(test, rng);
      ++index;
    }
  }
}

TEST_CASE("automatic split-K fills the SMs and stays exact") {
  auto rng = slimserve_test::make_rng(24);
  GemmOptions options;
  options.schedule = GemmSchedule::split_k;
  options.sm_count = 8;  // 1 x 1 tiles -> 8 slices wanted, capped by the 2% partials rule:
                         // s * m <= k / 800 = 4
  GemmCase test{{3200, 64, 128, false, false, ActivationType::bf16}, 1, true, options};
  const GemmPlan plan = slimserve_test::run_and_check(test, rng);
  CHECK(plan.path == GemmPath::fused);
  CHECK(plan.schedule == GemmSchedule::split_k);
  CHECK(plan.splits == 4);
  CHECK(plan.k_per_split == 832);  // 13 of the 50 steps
}

TEST_CASE("stream-K: tiles shared by 1..many blocks, both tiles, every group span") {
  auto rng = slimserve_test::make_rng(30);
  // (m, n, k, group, SMs): units = tiles * k_steps dealt to `SMs` blocks. E.g. 3 tiles x 7
  // steps over 5 blocks: blocks hold 4-5 units, so tiles start and end inside blocks; 1 tile
  // x 7 steps over 6 blocks: one tile shared by 6 blocks (5 partial slots, reduced in place
  // by the last block to finish it).
  struct Shape {
    std::int64_t m, n, k, group;
    int sms;
  };
  const std::array<Shape, 8> shapes = {{
      {1, 272, 448, 64, 5},   {16, 272, 512, 128, 5}, {3, 48, 448, 32, 6},  {1, 400, 416, 16, 3},
      {20, 144, 448, 64, 4},  {70, 144, 192, 0, 5},   {9, 128, 1024, 128, 64}, {1, 16, 64, 64, 1},
  }};
  int index = 0;
  for (const Shape& shape : shapes) {
    const ActivationType type = index % 2 == 0 ? ActivationType::bf16 : ActivationType::fp16;
    GemmOptions options;
    options.path = GemmPath::fused;
    options.sm_count = shape.sms;
    GemmCase test{{shape.k, shape.n, shape.group == 0 ? shape.k : shape.group, index % 3 == 0,
                   false, type},
                  shape.m, index % 2 == 1, options};
    const GemmPlan plan = slimserve_test::run_and_check(test, rng);
    CHECK(plan.schedule == GemmSchedule::stream_k);
    CHECK(plan.stream_k_blocks >= 1);
    ++index;
  }
}

TEST_CASE("act-order weights run with A's columns in the packed order") {
  auto rng = slimserve_test::make_rng(25);
  for (ActivationType type : {ActivationType::bf16, ActivationType::fp16}) {
    GemmCase test{{256, 32, 64, false, true, type}, 5, true, fused(2)};
    slimserve_test::run_and_check(test, rng);
  }
}

TEST_CASE("expansion path (dequantize, then dense GEMM) matches the same reference") {
  auto rng = slimserve_test::make_rng(26);
  int index = 0;
  for (std::int64_t m : {std::int64_t{1}, std::int64_t{33}, std::int64_t{128}, std::int64_t{1000}}) {
    const ActivationType type = index % 2 == 0 ? ActivationType::bf16 : ActivationType::fp16;
    const std::int64_t group = index % 2 == 0 ? 32 : 128;
    GemmCase test{{128, m == 1000 ? 16 : 80, group, index % 3 == 0, false, type}, m, index != 1,
                  expand()};
    const GemmPlan plan = slimserve_test::run_and_check(test, rng);
    CHECK(plan.path == GemmPath::expand);
    ++index;
  }
}

TEST_CASE("the automatic path switches to expansion at expand_min_m") {
  auto rng = slimserve_test::make_rng(27);
  GemmOptions options;
  options.expand_min_m = 40;
  options.sm_count = 8;
  GemmCase below{{64, 32, 32, true, false, ActivationType::fp16}, 39, false, options};
  CHECK(slimserve_test::run_and_check(below, rng).path == GemmPath::fused);
  GemmCase at{{64, 32, 32, true, false, ActivationType::fp16}, 40, false, options};
  CHECK(slimserve_test::run_and_check(at, rng).path == GemmPath::expand);
}

TEST_CASE("random shapes, group sizes, types, splits and paths") {
  auto rng = slimserve_test::make_rng(28);
  std::uniform_int_distribution<int> pick(0, 1 << 20);
  const std::array<std::int64_t, 5> group_sizes = {16, 32, 64, 128, 0};
  for (int trial = 0; trial < 6; ++trial) {
    const std::int64_t group = group_sizes[static_cast<std::size_t>(pick(rng) % 5)];
    const std::int64_t k = group == 0 ? 16 * (1 + pick(rng) % 20) : group * (1 + pick(rng) % (256 / group));
    const std::int64_t n = 16 * (1 + pick(rng) % 10);
    const std::int64_t m = 1 + pick(rng) % 40;
    const ActivationType type = pick(rng) % 2 == 0 ? ActivationType::bf16 : ActivationType::fp16;
    const int k_steps = static_cast<int>((k + 63) / 64);
    GemmOptions options = pick(rng) % 4 == 0 ? expand() : fused(pick(rng) % (k_steps + 1));
    options.sm_count = 8;
    GemmCase test{{k, n, group == 0 ? k : group, pick(rng) % 2 == 0, false, type}, m,
                  pick(rng) % 2 == 0, options};
    slimserve_test::run_and_check(test, rng);
  }
}

TEST_CASE("fused W4A16: 256-column decode tile (groups >= 64) across several column tiles") {
  auto rng = slimserve_test::make_rng(31);
  int index = 0;
  for (ActivationType type : {ActivationType::bf16, ActivationType::fp16}) {
    for (std::int64_t group : {std::int64_t{64}, std::int64_t{128}}) {
      // n = 400: one full 256-column tile and one of 144; k = 384: stream-K and split-K
      // slices begin and end inside groups.
      MatrixSpec spec{384, 400, group, index % 2 == 0, false, type};
      slimserve::int4::GemmOptions options;
      options.path = slimserve::int4::GemmPath::fused;
      options.schedule = index % 2 == 0 ? slimserve::int4::GemmSchedule::stream_k
                                        : slimserve::int4::GemmSchedule::split_k;
      options.sm_count = 3;
      GemmCase test{spec, index % 3 == 0 ? 1 : 16, index % 2 == 1, options};
      const slimserve::int4::GemmPlan plan = slimserve_test::run_and_check(test, rng);
      CHECK(plan.scaling == slimserve::int4::GroupScaling::per_group_sum);
      ++index;
    }
  }
}
