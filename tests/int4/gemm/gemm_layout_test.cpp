// The packed layout: lane/nibble ownership, and repack <-> unpack round trips.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <limits>

#include "gemm_test_matrices.hpp"
#include "slimserve/int4/gemm_layout.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::int4;

TEST_CASE("code_position and code_slot are inverse bijections of a 16x16 tile") {
  std::array<int, 256> seen{};
  for (int lane = 0; lane < 32; ++lane) {
    for (int nibble = 0; nibble < 8; ++nibble) {
      const gemm_layout::TileCoord at = gemm_layout::code_position(lane, nibble);
      REQUIRE(at.k >= 0);
      REQUIRE(at.k < 16);
      REQUIRE(at.n >= 0);
      REQUIRE(at.n < 16);
      ++seen[static_cast<std::size_t>(at.k * 16 + at.n)];
      const gemm_layout::NibbleSlot back = gemm_layout::code_slot(at.k, at.n);
      REQUIRE(back.lane == lane);
      REQUIRE(back.nibble == nibble);
    }
  }
  for (int count : seen) REQUIRE(count == 1);
}

TEST_CASE("a lane's word holds exactly its mma.m16n8k16 B fragments, paired for the magic trick") {
  // PTX B fragment (16x8, col): lane l holds column l/4, rows 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1).
  for (int lane = 0; lane < 32; ++lane) {
    const int column = lane / 4;
    const int t = lane % 4;
    for (int reg = 0; reg < 4; ++reg) {
      const int n8_tile = reg / 2;
      const int b_index = reg % 2;
      // nibble reg is the low half (even row), nibble reg + 4 the high half (odd row).
      const gemm_layout::TileCoord lo = gemm_layout::code_position(lane, reg);
      const gemm_layout::TileCoord hi = gemm_layout::code_position(lane, reg + 4);
      CHECK(lo.n == column + 8 * n8_tile);
      CHECK(hi.n == column + 8 * n8_tile);
      CHECK(lo.k == 2 * t + 8 * b_index);
      CHECK(hi.k == 2 * t + 8 * b_index + 1);
    }
  }
}

TEST_CASE("repack_for_gemm places every code where code_address says and unpack round-trips") {
  auto rng = slimserve_test::make_rng(1);
  const std::array<slimserve_test::MatrixSpec, 8> specs{{
      {64, 48, 32, true},
      {128, 32, 64, false},
      {256, 80, 128, true, false, ActivationType::fp16},
      {96, 16, 96, false},                        // per-channel
      {128, 64, 32, false, true},                 // act-order
      {256, 32, 128, true, true, ActivationType::fp16},
      {48, 16, 48, true, false, ActivationType::fp16},  // per-channel, k not a multiple of 32
      {320, 16, 64, false},  // k % 128 = 64, like k = 10944
  }};
  for (const auto& spec : specs) {
    CAPTURE(spec.k, spec.n, spec.group_size, spec.symmetric, spec.act_order);
    const QuantizedMatrix original = slimserve_test::random_quantized_matrix(spec, rng);
    Result<GemmWeights> packed = repack_for_gemm(original, spec.activation);
    REQUIRE(packed.ok());
    REQUIRE(packed->packed.size() == original.codes.size());
    REQUIRE(packed->zeros.empty() == spec.symmetric);
    REQUIRE(packed->k_order.empty() == !spec.act_order);
    for (std::int64_t packed_row = 0; packed_row < spec.k; ++packed_row) {
      const std::int64_t row = spec.act_order
                                   ? packed->k_order[static_cast<std::size_t>(packed_row)]
                                   : packed_row;
      if (spec.act_order) {
        // sorted by group: packed row i belongs to group i / group_size
        REQUIRE(original.group_of_row(row) == packed_row / spec.group_size);
      }
      for (std::int64_t col = 0; col < spec.n; ++col) {
        const auto at = gemm_layout::code_address(packed_row, col, spec.n);
        const std::uint32_t code =
            (packed->packed[static_cast<std::size_t>(at.word)] >> (4 * at.nibble)) & 0xFu;
        REQUIRE(code == original.code(row, col));
      }
    }
    Result<QuantizedMatrix> unpacked = unpack_from_gemm(*packed);
    REQUIRE(unpacked.ok());
    CHECK(unpacked->k == original.k);
    CHECK(unpacked->n == original.n);
    CHECK(unpacked->group_size == original.group_size);
    CHECK(unpacked->symmetric == original.symmetric);
    CHECK(unpacked->codes == original.codes);
    CHECK(unpacked->scales == original.scales);
    CHECK(unpacked->zeros == original.zeros);
    CHECK(unpacked->row_group == original.row_group);
  }
}

TEST_CASE("repack_for_gemm rejects what the kernel cannot run, with the numbers") {
  auto rng = slimserve_test::make_rng(2);
  const QuantizedMatrix good = slimserve_test::random_quantized_matrix({64, 32, 32, false}, rng);
  REQUIRE(check_gemm_compatible(good).ok());

  QuantizedMatrix odd_n = slimserve_test::random_quantized_matrix({64, 24, 32, false}, rng);
  Status status = repack_for_gemm(odd_n, ActivationType::bf16).status();
  CHECK(status.code() == StatusCode::unsupported);
  CHECK(status.message().find("n = 24") != std::string_view::npos);

  // Groups are powers of two (the kernel's group is a shift): 96 divides k = 192 but is refused.
  QuantizedMatrix group96 = slimserve_test::random_quantized_matrix({192, 32, 96, true}, rng);
  status = repack_for_gemm(group96, ActivationType::bf16).status();
  CHECK(status.code() == StatusCode::unsupported);
  CHECK(status.message().find("group_size 96") != std::string_view::npos);
  QuantizedMatrix group16 = slimserve_test::random_quantized_matrix({64, 32, 16, true}, rng);
  CHECK(repack_for_gemm(group16, ActivationType::bf16).ok());

  QuantizedMatrix bad_scale = good;
  bad_scale.scales[5] = -1.0f;
  CHECK(repack_for_gemm(bad_scale, ActivationType::fp16).status().code() ==
        StatusCode::invalid_argument);
  bad_scale.scales[5] = std::numeric_limits<float>::infinity();
  CHECK(repack_for_gemm(bad_scale, ActivationType::fp16).status().code() ==
        StatusCode::invalid_argument);

  QuantizedMatrix bad_zero = good;
  bad_zero.zeros[3] = 16;
  CHECK(repack_for_gemm(bad_zero, ActivationType::bf16).status().code() ==
        StatusCode::invalid_argument);

  QuantizedMatrix sym_with_zero = slimserve_test::random_quantized_matrix({64, 32, 32, true}, rng);
  sym_with_zero.zeros[0] = 7;
  CHECK(repack_for_gemm(sym_with_zero, ActivationType::bf16).status().code() ==
        StatusCode::invalid_argument);

  QuantizedMatrix uneven = slimserve_test::random_quantized_matrix({64, 32, 32, false, true}, rng);
  for (auto& group : uneven.row_group) group = 0;  // all rows in group 0: 64 != 32
  status = repack_for_gemm(uneven, ActivationType::bf16).status();
  CHECK(status.code() == StatusCode::unsupported);
  CHECK(status.message().find("has 64 rows") != std::string_view::npos);

  QuantizedMatrix short_codes = good;
  short_codes.codes.pop_back();
  CHECK(repack_for_gemm(short_codes, ActivationType::bf16).status().code() ==
        StatusCode::invalid_argument);
}
