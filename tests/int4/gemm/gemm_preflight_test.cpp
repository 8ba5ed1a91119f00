// Preflight: unsupported shapes, misaligned pointers, bad plans and workspaces are reported
// with a clear status and nothing is written.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "gemm_test_matrices.hpp"
#include "slimserve/int4/gemm.hpp"
#include "slimserve/runtime/memory.hpp"
#include "support/random.hpp"

using namespace slimserve;
using namespace slimserve::int4;

namespace {

struct Buffers {
  rt::DeviceBuffer<std::uint16_t> a;
  rt::DeviceBuffer<std::uint32_t> b;
  rt::DeviceBuffer<std::uint16_t> scales;
  rt::DeviceBuffer<std::uint16_t> c;
};

Buffers make_buffers(std::int64_t m, std::int64_t n, std::int64_t k) {
  auto a = rt::DeviceBuffer<std::uint16_t>::create(static_cast<std::size_t>(m * k + 8));
  auto b = rt::DeviceBuffer<std::uint32_t>::create(static_cast<std::size_t>(k / 8 * n + 8));
  auto scales = rt::DeviceBuffer<std::uint16_t>::create(static_cast<std::size_t>(n * k / 32 + 8));
  auto c = rt::DeviceBuffer<std::uint16_t>::create(static_cast<std::size_t>(m * n + 8));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(scales.ok());
  REQUIRE(c.ok());
  REQUIRE(c->fill_bytes(0xFF).ok());
  return Buffers{std::move(a).value(), std::move(b).value(), std::move(scales).value(),
                 std::move(c).value()};
}

GemmArguments make_args(const Buffers& buffers, std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmArguments args;
  args.activation = ActivationType::bf16;
  args.m = m;
  args.n = n;
  args.k = k;
  args.group_size = 32;
  args.a = buffers.a.data();
  args.b = buffers.b.data();
  args.scales = buffers.scales.data();
  args.c = buffers.c.data();
  return args;
}

void expect_error(const GemmArguments& args, StatusCode code, std::string_view text) {
  const Status status = can_implement(args);
  INFO(status.to_string());
  CHECK(status.code() == code);
  CHECK(status.message().find(text) != std::string_view::npos);
  CHECK(plan_gemm(args).status().code() == code);
}

bool still_poisoned(const rt::DeviceBuffer<std::uint16_t>& c) {
  std::vector<std::uint16_t> host(c.size());
  REQUIRE(c.download(host).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  for (std::uint16_t v : host) {
    if (v != 0xFFFF) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("preflight reports unsupported shapes with their numbers") {
  const Buffers buffers = make_buffers(4, 64, 128);
  GemmArguments good = make_args(buffers, 4, 64, 128);
  REQUIRE(can_implement(good).ok());

  GemmArguments args = good;
  args.n = 56;
  expect_error(args, StatusCode::unsupported, "n = 56");
  args = good;
  args.k = 120;
  expect_error(args, StatusCode::unsupported, "k = 120");
  args = good;
  args.group_size = 48;
  expect_error(args, StatusCode::unsupported, "group_size 48");
  args = good;
  args.group_size = 8;
  expect_error(args, StatusCode::unsupported, "group_size 8");
  args = good;
  args.group_size = 16;  // supported since the GEMM's group is a shift
  CHECK(can_implement(args).ok());
  args = good;
  args.m = 0;
  expect_error(args, StatusCode::invalid_argument, "m = 0");
  args = good;
  args.activation = static_cast<ActivationType>(7);
  expect_error(args, StatusCode::invalid_argument, "activation");
}

TEST_CASE("preflight rejects null and misaligned pointers") {
  const Buffers buffers = make_buffers(4, 64, 128);
  const GemmArguments good = make_args(buffers, 4, 64, 128);
  GemmArguments args = good;
  args.a = buffers.a.data() + 1;  // 2 bytes off
  expect_error(args, StatusCode::invalid_argument, "a (");
  args = good;
  args.b = buffers.b.data() + 1;  // 4 bytes off
  expect_error(args, StatusCode::invalid_argument, "16-byte aligned");
  args = good;
  args.scales = buffers.scales.data() + 4;  // 8 bytes off
  expect_error(args, StatusCode::invalid_argument, "scales");
  args = good;
  args.zeros = buffers.scales.data() + 2;
  expect_error(args, StatusCode::invalid_argument, "zeros");
  args = good;
  args.c = buffers.c.data() + 3;
  expect_error(args, StatusCode::invalid_argument, "c (");
  args = good;
  args.bias = buffers.c.data() + 1;
  expect_error(args, StatusCode::invalid_argument, "bias");
  args = good;
  args.c = nullptr;
  expect_error(args, StatusCode::invalid_argument, "c is null");
}

TEST_CASE("bad split_k, plans and workspaces are refused before any launch") {
  const Buffers buffers = make_buffers(4, 64, 128);
  const GemmArguments args = make_args(buffers, 4, 64, 128);
  GemmOptions options;
  options.path = GemmPath::fused;
  options.split_k = 3;  // k = 128 has 2 steps of 64
  const Status too_many_splits = plan_gemm(args, options).status();
  CHECK(too_many_splits.code() == StatusCode::invalid_argument);
  CHECK(too_many_splits.message().find("split_k = 3") != std::string_view::npos);
  options.split_k = -1;
  CHECK(plan_gemm(args, options).status().code() == StatusCode::invalid_argument);

  options.split_k = 2;
  Result<GemmPlan> plan = plan_gemm(args, options);
  REQUIRE(plan.ok());
  CHECK(plan->splits == 2);
  REQUIRE(plan->workspace_bytes() >= 2 * 4 * 64 * sizeof(float));
  auto workspace = rt::DeviceBuffer<unsigned char>::create(plan->workspace_bytes());
  REQUIRE(workspace.ok());
  const Status short_workspace =
      run_gemm(args, *plan, workspace->data(), plan->workspace_bytes() - 1, nullptr);
  CHECK(short_workspace.code() == StatusCode::resource_exhausted);
  // A null workspace is a caller bug, not a shortage.
  CHECK(run_gemm(args, *plan, nullptr, 0, nullptr).code() == StatusCode::invalid_argument);
  GemmOptions bad_path;
  bad_path.path = static_cast<GemmPath>(7);
  CHECK(plan_gemm(args, bad_path).status().code() == StatusCode::invalid_argument);
  GemmArguments bad_activation = args;
  bad_activation.activation = static_cast<ActivationType>(9);
  CHECK(can_implement(bad_activation).code() == StatusCode::invalid_argument);

  GemmArguments other = args;
  other.m = 8;  // the plan's workspace was sized for m = 4
  const Status wrong_plan = run_gemm(other, *plan, workspace->data(), workspace->size_bytes(), nullptr);
  CHECK(wrong_plan.code() == StatusCode::invalid_argument);
  CHECK(wrong_plan.message().find("plan") != std::string_view::npos);

  GemmArguments misaligned = args;
  misaligned.a = buffers.a.data() + 1;
  CHECK(run_gemm(misaligned, *plan, workspace->data(), workspace->size_bytes(), nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(still_poisoned(buffers.c));
}

TEST_CASE("a plan made for a smaller k is refused, not run over part of K") {
  // Same m and n (so the same, empty, workspace): only k differs. Running it would skip rows.
  const Buffers small = make_buffers(1, 64, 64);
  const Buffers large = make_buffers(1, 64, 256);
  GemmOptions options;
  options.path = GemmPath::fused;
  options.split_k = 1;
  const Result<GemmPlan> plan = plan_gemm(make_args(small, 1, 64, 64), options);
  REQUIRE(plan.ok());
  REQUIRE(plan->workspace_bytes() == 0);
  const Status status = run_gemm(make_args(large, 1, 64, 256), *plan, nullptr, 0, nullptr);
  CHECK(status.code() == StatusCode::invalid_argument);
  CHECK(status.message().find("k=64") != std::string_view::npos);
  CHECK(still_poisoned(large.c));
}

TEST_CASE("the workspace size is the carving: split-K, stream-K and expansion layouts") {
  const Buffers buffers = make_buffers(4, 64, 128);
  const GemmArguments args = make_args(buffers, 4, 64, 128);
  GemmOptions options;
  options.path = GemmPath::fused;
  options.split_k = 1;
  const Result<GemmPlan> fused_plan = plan_gemm(args, options);
  REQUIRE(fused_plan.ok());
  CHECK(fused_plan->workspace_bytes() == 0);
  options.path = GemmPath::expand;
  const Result<GemmPlan> plan = plan_gemm(args, options);
  REQUIRE(plan.ok());
  CHECK(plan->workspace.dense_bytes == 128 * 64 * 2);
  CHECK(plan->workspace_bytes() >= plan->workspace.dense_offset + plan->workspace.dense_bytes);
  CHECK(plan->workspace.library_offset >= plan->workspace.dense_offset + plan->workspace.dense_bytes);
  CHECK(gemm_shared_memory_bytes(ActivationType::bf16, GemmTile::m16_n128) > 0);
  // 4 stages of the wide tile need the launch's opt-in above 48 KB; Hopper allows 227 KB.
  CHECK(gemm_shared_memory_bytes(ActivationType::fp16, GemmTile::m64_n128) <= 227 * 1024);

  // Stream-K: two FP32 block tiles per persistent block, whatever M, N and K are.
  options.path = GemmPath::fused;
  options.split_k = 0;
  options.sm_count = 3;
  const Result<GemmPlan> stream_k = plan_gemm(args, options);
  REQUIRE(stream_k.ok());
  CHECK(stream_k->schedule == GemmSchedule::stream_k);
  CHECK(stream_k->stream_k_blocks == 2);  // 1 tile x 2 steps of 64: never more blocks than units
  // (+ one 128-byte L2 line: run_gemm starts the slots on a line, which L2 discards whole)
  CHECK(stream_k->workspace.partials_bytes == 2 * 2 * 16 * 128 * sizeof(float) + 128);
  CHECK(stream_k->workspace.arrivals_bytes == 1 * sizeof(unsigned));  // one counter per tile
  CHECK(stream_k->workspace.arrivals_offset >=
        stream_k->workspace.partials_offset + stream_k->workspace.partials_bytes);
  CHECK(stream_k->workspace_bytes() >=
        stream_k->workspace.arrivals_offset + stream_k->workspace.arrivals_bytes);
  options.split_k = 2;
  options.schedule = GemmSchedule::stream_k;
  CHECK(plan_gemm(args, options).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("device repack is bit-identical to the host repack") {
  auto rng = slimserve_test::make_rng(31);
  const std::array<slimserve_test::MatrixSpec, 3> specs = {{
      {128, 48, 32, false, false, ActivationType::bf16},
      {96, 32, 96, true, false, ActivationType::fp16},
      {128, 16, 64, false, true, ActivationType::fp16},
  }};
  for (const auto& spec : specs) {
    CAPTURE(spec.k, spec.n, spec.group_size, spec.symmetric, spec.act_order);
    // Device repack rounds FP32 scales itself: use scales not representable in T.
    QuantizedMatrix matrix = slimserve_test::random_quantized_matrix(spec, rng);
    for (float& s : matrix.scales) s *= 1.0001f;
    Result<GemmWeights> host = repack_for_gemm(matrix, spec.activation);
    REQUIRE(host.ok());

    auto codes = rt::DeviceBuffer<std::uint32_t>::create(matrix.codes.size());
    auto scales = rt::DeviceBuffer<float>::create(matrix.scales.size());
    auto zeros = rt::DeviceBuffer<std::uint8_t>::create(matrix.zeros.size());
    auto order = rt::DeviceBuffer<std::int32_t>::create(host->k_order.size());
    auto packed = rt::DeviceBuffer<std::uint32_t>::create(host->packed.size());
    auto scales_out = rt::DeviceBuffer<std::uint16_t>::create(host->scales.size());
    auto zeros_out = rt::DeviceBuffer<std::uint16_t>::create(host->zeros.size());
    REQUIRE((codes.ok() && scales.ok() && zeros.ok() && order.ok() && packed.ok() &&
             scales_out.ok() && zeros_out.ok()));
    REQUIRE(codes->upload(matrix.codes).ok());
    REQUIRE(scales->upload(matrix.scales).ok());
    REQUIRE(zeros->upload(matrix.zeros).ok());
    REQUIRE(order->upload(host->k_order).ok());
    REQUIRE(packed->fill_bytes(0xFF).ok());
    REQUIRE(scales_out->fill_bytes(0xFF).ok());

    DeviceQuantizedMatrix input;
    input.k = spec.k;
    input.n = spec.n;
    input.group_size = spec.group_size;
    input.codes = codes->data();
    input.scales = scales->data();
    input.zeros = spec.symmetric ? nullptr : zeros->data();
    input.k_order = host->k_order.empty() ? nullptr : order->data();
    DeviceGemmWeights output;
    output.packed = packed->data();
    output.scales = scales_out->data();
    output.zeros = spec.symmetric ? nullptr : zeros_out->data();
    const Status status = repack_for_gemm_on_device(input, spec.activation, output, nullptr);
    INFO(status.to_string());
    REQUIRE(status.ok());

    std::vector<std::uint32_t> got_packed(host->packed.size());
    std::vector<std::uint16_t> got_scales(host->scales.size());
    std::vector<std::uint16_t> got_zeros(host->zeros.size());
    REQUIRE(packed->download(got_packed).ok());
    REQUIRE(scales_out->download(got_scales).ok());
    REQUIRE(zeros_out->download(got_zeros).ok());
    REQUIRE(rt::stream_synchronize(nullptr).ok());
    CHECK(got_packed == host->packed);
    CHECK(got_scales == host->scales);
    CHECK(got_zeros == host->zeros);
  }

  DeviceQuantizedMatrix bad;
  bad.k = 100;
  bad.n = 32;
  bad.group_size = 100;
  CHECK(repack_for_gemm_on_device(bad, ActivationType::bf16, DeviceGemmWeights{}, nullptr).code() ==
        StatusCode::unsupported);
}

TEST_CASE("gather_activation_columns refuses null, in-place and empty inputs") {
  const Buffers buffers = make_buffers(4, 64, 128);
  auto order = rt::DeviceBuffer<std::int32_t>::create(128);
  REQUIRE(order.ok());
  const void* a = buffers.a.data();
  CHECK(gather_activation_columns(a, nullptr, buffers.c.data(), 4, 128, nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(gather_activation_columns(a, order->data(), buffers.a.data(), 4, 128, nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(gather_activation_columns(a, order->data(), buffers.c.data(), 0, 128, nullptr).code() ==
        StatusCode::invalid_argument);
  CHECK(still_poisoned(buffers.c));
}

TEST_CASE("decode tile width: 256 columns for groups >= 64, 128 for groups of 16 and 32") {
  const Buffers buffers = make_buffers(16, 1024, 256);
  for (std::int64_t m : {std::int64_t{1}, std::int64_t{2}, std::int64_t{16}}) {
    GemmArguments args = make_args(buffers, m, 1024, 256);
    args.group_size = 128;
    GemmOptions options;
    options.path = GemmPath::fused;
    options.sm_count = 5;
    const Result<GemmPlan> stream_k = plan_gemm(args, options);
    REQUIRE(stream_k.ok());
    CHECK(stream_k->schedule == GemmSchedule::stream_k);
    CHECK(stream_k->block_n == 256);
    CHECK(stream_k->workspace.arrivals_bytes == 4 * sizeof(unsigned));  // 4 tiles of 256
    options.schedule = GemmSchedule::split_k;
    const Result<GemmPlan> split_k = plan_gemm(args, options);
    REQUIRE(split_k.ok());
    CHECK(split_k->block_n == 256);
    args.group_size = 32;
    const Result<GemmPlan> group_32 = plan_gemm(args, options);
    REQUIRE(group_32.ok());
    CHECK(group_32->block_n == 128);
  }
}
