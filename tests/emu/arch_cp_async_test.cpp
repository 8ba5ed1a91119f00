// cp.async commit/wait semantics on the emulator: a copy lands only at the wait that covers
// its group, so shared memory read before that wait still holds the 0xFF poison. (Not a
// KERNEL test: on a GPU an early read may or may not see the data.)
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "slimserve/arch/cp_async.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/runtime/shared_memory.cuh"
#include "support/random.hpp"

namespace rt = slimserve::rt;
namespace arch = slimserve::arch;

namespace {

constexpr int threads = 32;
constexpr int stages = 5;
constexpr int checkpoints = 4;

struct Chunk {
  std::uint32_t words[4];  // 16 bytes: one cp.async
};
struct CopyShared {
  Chunk stage[stages][threads];
};

// What thread `tid` sees in its five stage slots at four points:
//   after wait<2> (stage 0 done), after wait<1> (stage 1), after wait<0> (stage 2),
//   and at the end, where stage 3 was committed but never waited for and stage 4 was never
//   committed (a wait covers committed groups only).
__global__ void cp_async_kernel(const Chunk* __restrict__ source,  // [stages, threads]
                                Chunk* __restrict__ seen)  // [checkpoints, stages, threads]
{
  auto& s = rt::shared_storage<CopyShared>();
  const int tid = static_cast<int>(threadIdx.x);
  auto record = [&](int checkpoint) {
    for (int stage = 0; stage < stages; ++stage) {
      seen[(checkpoint * stages + stage) * threads + tid] = s.stage[stage][tid];
    }
  };
  arch::cp_async_16(&s.stage[0][tid], &source[0 * threads + tid]);
  arch::cp_async_commit();
  const bool valid = tid % 2 == 0;  // odd threads zero-fill and read nothing (null source)
  arch::cp_async_16_zfill(&s.stage[1][tid], valid ? &source[1 * threads + tid] : nullptr, valid);
  arch::cp_async_commit();
  arch::cp_async_16(&s.stage[2][tid], &source[2 * threads + tid]);
  arch::cp_async_commit();
  arch::cp_async_wait<2>();
  record(0);
  arch::cp_async_wait<1>();
  record(1);
  arch::cp_async_wait<0>();
  record(2);
  arch::cp_async_16(&s.stage[3][tid], &source[3 * threads + tid]);
  arch::cp_async_commit();
  arch::cp_async_16(&s.stage[4][tid], &source[4 * threads + tid]);
  arch::cp_async_wait<1>();  // one committed group pending is allowed: nothing completes
  record(3);
}

}  // namespace

TEST_CASE("cp.async copies land at the wait that covers their group", "[emu][arch]") {
  auto rng = slimserve_test::make_rng(21);
  std::vector<Chunk> source(stages * threads);
  for (Chunk& chunk : source) {
    for (auto& word : chunk.words) word = static_cast<std::uint32_t>(rng()) & 0x7FFFFFFFu;
  }
  auto d_source = rt::DeviceBuffer<Chunk>::create(source.size());
  auto d_seen = rt::DeviceBuffer<Chunk>::create(checkpoints * stages * threads);
  REQUIRE((d_source.ok() && d_seen.ok()));
  REQUIRE(d_source->upload(source).ok());
  REQUIRE(d_seen->fill_bytes(0x11).ok());
  const slimserve::Status status =
      rt::launch(&cp_async_kernel, {dim3(1), dim3(threads), sizeof(CopyShared), nullptr},
                 d_source->data(), d_seen->data());
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<Chunk> seen(checkpoints * stages * threads);
  REQUIRE(d_seen->download(seen).ok());

  Chunk poison;
  std::memset(&poison, 0xFF, sizeof poison);
  const Chunk zeros{};
  auto same = [](const Chunk& x, const Chunk& y) { return std::memcmp(&x, &y, sizeof x) == 0; };
  for (int tid = 0; tid < threads; ++tid) {
    INFO("thread " << tid);
    auto at = [&](int checkpoint, int stage) {
      return seen[(checkpoint * stages + stage) * threads + tid];
    };
    const Chunk stage1 = tid % 2 == 0 ? source[1 * threads + tid] : zeros;
    // After wait<2>: only stage 0.
    CHECK(same(at(0, 0), source[tid]));
    CHECK(same(at(0, 1), poison));
    CHECK(same(at(0, 2), poison));
    // After wait<1>: stages 0 and 1 (zero-filled where invalid).
    CHECK(same(at(1, 1), stage1));
    CHECK(same(at(1, 2), poison));
    // After wait<0>: all three.
    CHECK(same(at(2, 0), source[tid]));
    CHECK(same(at(2, 1), stage1));
    CHECK(same(at(2, 2), source[2 * threads + tid]));
    // Missing wait: stage 3 and the uncommitted stage 4 still read the poison.
    CHECK(same(at(3, 3), poison));
    CHECK(same(at(3, 4), poison));
  }
}
