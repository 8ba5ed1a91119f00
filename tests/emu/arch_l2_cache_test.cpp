// The emulated L2 controls (arch/l2_cache.cuh): a hinted store is a plain store, and
// `discard.global.L2` leaves its 128 bytes indeterminate: the emulator poisons them (0xFF, an
// FP32 NaN), so a kernel that reads a line after discarding it computes NaN and fails its
// test. Misaligned addresses fail the launch. (Not a KERNEL test: on a GPU a discarded line
// may read back as anything, including its old contents.)
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include "slimserve/arch/l2_cache.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "support/random.hpp"

namespace rt = slimserve::rt;
namespace arch = slimserve::arch;

namespace {

constexpr int threads = 32;
constexpr int floats_per_line = arch::l2_line_bytes / 4;
constexpr int lines = 4;

// Every thread stores its pairs of `values` into `slots` under an evict-last policy; after a
// barrier, thread t < lines / 2 discards line 2t (lines 0 and 2); then every thread reads the
// slots back into `seen`.
__global__ void store_discard_read_kernel(const float* values, float* slots, float* seen) {
  const int tid = static_cast<int>(threadIdx.x);
  const std::uint64_t keep = arch::l2_evict_last_policy();
  for (int e = 2 * tid; e < lines * floats_per_line; e += 2 * threads) {
    arch::store_f32x2_l2_hint(slots + e, values[e], values[e + 1], keep);
  }
  __syncthreads();
  if (tid < lines / 2) arch::discard_l2_line(slots + 2 * tid * floats_per_line);
  __syncthreads();
  for (int e = tid; e < lines * floats_per_line; e += threads) seen[e] = slots[e];
}

__global__ void discard_misaligned_kernel(float* slots, int offset_floats) {
  if (threadIdx.x == 0) arch::discard_l2_line(slots + offset_floats);
}

__global__ void store_misaligned_kernel(float* slots) {
  if (threadIdx.x == 0) arch::store_f32x2_l2_hint(slots + 1, 1.0f, 2.0f, arch::l2_evict_last_policy());
}

}  // namespace

TEST_CASE("discard.global.L2 leaves exactly its 128-byte line indeterminate", "[emu][arch]") {
  auto rng = slimserve_test::make_rng(23);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::vector<float> values(lines * floats_per_line);
  for (float& v : values) v = value(rng);
  auto d_values = rt::DeviceBuffer<float>::create(values.size());
  auto d_slots = rt::DeviceBuffer<float>::create(values.size());
  auto d_seen = rt::DeviceBuffer<float>::create(values.size());
  REQUIRE((d_values.ok() && d_slots.ok() && d_seen.ok()));
  REQUIRE(d_values->upload(values).ok());
  REQUIRE(d_slots->fill_bytes(0x11).ok());
  REQUIRE(d_seen->fill_bytes(0x22).ok());
  const slimserve::Status status =
      rt::launch(&store_discard_read_kernel, {dim3(1), dim3(threads), 0, nullptr},
                 static_cast<const float*>(d_values->data()), d_slots->data(), d_seen->data());
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<float> seen(values.size());
  REQUIRE(d_seen->download(seen).ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  int wrong = 0;
  for (int e = 0; e < lines * floats_per_line; ++e) {
    const bool discarded = (e / floats_per_line) % 2 == 0;
    const float got = seen[static_cast<std::size_t>(e)];
    const bool ok = discarded ? std::isnan(got) : got == values[static_cast<std::size_t>(e)];
    if (!ok && ++wrong <= 5) {
      UNSCOPED_INFO("element " << e << (discarded ? " (discarded line)" : " (kept line)")
                               << ": got " << got);
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("discard.global.L2 and hinted stores reject misaligned addresses", "[emu][arch]") {
  auto d_slots = rt::DeviceBuffer<float>::create(2 * floats_per_line);
  REQUIRE(d_slots.ok());
  for (const int offset : {4, 16}) {  // 16 and 64 bytes past a line
    CAPTURE(offset);
    const slimserve::Status status = rt::launch(
        &discard_misaligned_kernel, {dim3(1), dim3(threads), 0, nullptr}, d_slots->data(), offset);
    INFO(status.to_string());
    REQUIRE_FALSE(status.ok());
    CHECK(status.message().find("aligned to 128 bytes") != std::string_view::npos);
  }
  const slimserve::Status aligned = rt::launch(
      &discard_misaligned_kernel, {dim3(1), dim3(threads), 0, nullptr}, d_slots->data(), floats_per_line);
  INFO(aligned.to_string());
  CHECK(aligned.ok());
  const slimserve::Status store = rt::launch(&store_misaligned_kernel,
                                             {dim3(1), dim3(threads), 0, nullptr}, d_slots->data());
  INFO(store.to_string());
  REQUIRE_FALSE(store.ok());
  CHECK(store.message().find("8-byte aligned") != std::string_view::npos);
}
