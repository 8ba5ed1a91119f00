// wgmma.mma_async m64nNk16 (arch/wgmma.cuh) against an FP64 host matrix product, for several N,
// every swizzle mode, K-major and MN-major operands, A from registers and from shared memory,
// two chained K steps, with and without the input accumulator. KERNEL: the same file runs on a
// real H100/H200, which is how the emulator's fragment and shared-memory layouts are checked
// against the hardware. Inputs are multiples of 1/32 and 1/1024 small enough that every
// product and partial sum is exact in fp32, so results must match bit for bit.
//
// The shared-memory images are built on the host from the canonical layouts as the PTX ISA
// writes them (CuTe shape:stride form, section "Shared Memory Matrix Layout"), independently
// of the emulator's address code; a test also evaluates the ISA's worked examples.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "slimserve/arch/wgmma.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/runtime/shared_memory.cuh"
#include "support/random.hpp"

namespace rt = slimserve::rt;
namespace arch = slimserve::arch;
using arch::WgmmaMajor;
using arch::WgmmaSwizzle;

namespace {

constexpr int warpgroups = 2;  // two warpgroups: fragments must use warp % 4
constexpr int k_steps = 2;     // K = 32: two instructions chained on one accumulator
constexpr int k_total = 16 * k_steps;

/// Deliberate misuse, for the emulator's checks (never on a GPU).
enum class Fault : int { none, no_fence, read_before_wait, write_in_flight, overwrite_smem, no_wait };

struct CaseParams {
  const uint4* image;           // the shared-memory image, copied to offset 0
  std::uint32_t image_chunks;   // 16-byte units
  const std::uint16_t* a;       // [warpgroups][64][k_total] (A from registers)
  const float* c;               // [warpgroups][64][N]
  float* d;                     // [warpgroups][64][N]
  int* base_alignment;          // shared address of the image % 1024 (must be 0)
  std::uint32_t a_start[warpgroups][k_steps];
  std::uint32_t a_lbo, a_sbo, a_swizzle;
  std::uint32_t b_start[k_steps];
  std::uint32_t b_lbo, b_sbo, b_swizzle;
  int accumulate;
  Fault fault;
};

template <int N, bool Fp16, bool ARegisters, WgmmaMajor AMajor, WgmmaMajor BMajor>
__global__ void wgmma_kernel(CaseParams p) {
  unsigned char* smem = rt::dynamic_shared_memory();
  const int tid = static_cast<int>(threadIdx.x);
  for (std::uint32_t i = static_cast<std::uint32_t>(tid); i < p.image_chunks; i += blockDim.x) {
    reinterpret_cast<uint4*>(smem)[i] = p.image[i];
  }
  arch::fence_proxy_async_shared();
  __syncthreads();
  const std::uint32_t base = arch::wgmma_shared_address(smem);
  if (tid == 0) *p.base_alignment = static_cast<int>(base % 1024u);

  const int wg = tid / 128, w = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) {
    const int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t + i % 2;
    // Without `accumulate` the input is ignored: fill it with something loud.
    d[i] = p.accumulate != 0 ? p.c[(wg * 64 + row) * N + col] : 1.0e30f;
  }
  if (p.fault != Fault::no_fence) arch::wgmma_fence();
  for (int s = 0; s < k_steps; ++s) {
    const std::uint64_t desc_b =
        arch::make_wgmma_descriptor(base + p.b_start[s], p.b_lbo, p.b_sbo,
                                    static_cast<WgmmaSwizzle>(p.b_swizzle));
    const bool accumulate = s > 0 || p.accumulate != 0;
    if constexpr (ARegisters) {
      std::uint32_t a[4];
      for (int r = 0; r < 4; ++r) {
        std::uint32_t halves[2];
        for (int h = 0; h < 2; ++h) {
          const int i = 2 * r + h;
          const int row = 16 * w + g + 8 * ((i / 2) % 2), k = 16 * s + 2 * t + i % 2 + 8 * (i / 4);
          halves[h] = p.a[(wg * 64 + row) * k_total + k];
        }
        a[r] = halves[0] | halves[1] << 16;
      }
      if constexpr (Fp16) {
        arch::wgmma_mma_rs_fp16<N, BMajor>(d, a, desc_b, accumulate);
      } else {
        arch::wgmma_mma_rs_bf16<N, BMajor>(d, a, desc_b, accumulate);
      }
    } else {
      const std::uint64_t desc_a =
          arch::make_wgmma_descriptor(base + p.a_start[wg][s], p.a_lbo, p.a_sbo,
                                      static_cast<WgmmaSwizzle>(p.a_swizzle));
      if constexpr (Fp16) {
        arch::wgmma_mma_ss_fp16<N, AMajor, BMajor>(d, desc_a, desc_b, accumulate);
      } else {
        arch::wgmma_mma_ss_bf16<N, AMajor, BMajor>(d, desc_a, desc_b, accumulate);
      }
    }
  }
  arch::wgmma_commit_group();
  float* out = p.d + wg * 64 * N;
  auto store = [&] {
    for (int i = 0; i < N / 2; ++i) {
      const int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t + i % 2;
      out[row * N + col] = d[i];
    }
  };
  if (p.fault == Fault::read_before_wait) store();
  if (p.fault == Fault::write_in_flight) d[0] = 0.0f;
  if (p.fault == Fault::overwrite_smem) {
    __syncthreads();
    for (std::uint32_t i = static_cast<std::uint32_t>(tid); i < p.image_chunks; i += blockDim.x) {
      reinterpret_cast<uint4*>(smem)[i] = uint4{0u, 0u, 0u, 0u};
    }
    __syncthreads();
  }
  if (p.fault == Fault::no_wait) return;
  arch::wgmma_wait_group<0>();
  if (p.fault != Fault::read_before_wait) store();
}

// ---- host side: canonical layouts, written from the PTX ISA's shape:stride expressions ----

std::uint16_t bf16_bits(float value) {
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(value) >> 16);
}
std::uint16_t fp16_bits(float value) {  // exact for the multiples of 1/32 used here
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  if ((x & 0x7FFFFFFFu) == 0) return sign;
  const std::uint32_t exponent = ((x >> 23) & 0xFFu) - 127u + 15u;
  return static_cast<std::uint16_t>(sign | exponent << 10 | ((x >> 13) & 0x3FFu));
}

std::uint32_t swizzle_bytes(WgmmaSwizzle s) {
  switch (s) {
    case WgmmaSwizzle::bytes128: return 128;
    case WgmmaSwizzle::bytes64: return 64;
    case WgmmaSwizzle::bytes32: return 32;
    default: return 0;
  }
}

/// Swizzle<B,4,3> on byte addresses: 16-byte chunk bits [4, 4+B) ^= bits [7, 7+B).
std::uint32_t apply_swizzle(std::uint32_t address, WgmmaSwizzle s) {
  const std::uint32_t b = s == WgmmaSwizzle::bytes128 ? 3 : s == WgmmaSwizzle::bytes64 ? 2
                          : s == WgmmaSwizzle::bytes32 ? 1 : 0;
  const std::uint32_t mask = (1u << b) - 1u;
  return address ^ (((address >> 7) & mask) << 4);
}

/// One operand tile (mn_extent x k_total, 16-bit) in shared memory, 1024-byte aligned.
struct HostTile {
  WgmmaMajor major;
  WgmmaSwizzle swizzle;
  std::uint32_t mn_extent;
  std::uint32_t lbo = 0, sbo = 0;
  std::uint32_t k_atom_stride = 0;  // K-major swizzled: bytes between atoms along K
  std::uint32_t base = 0;
  std::uint32_t bytes = 0;

  // Offset of element (mn, k) before swizzling, relative to the tile. T = 8 elements = 16 B.
  std::uint32_t offset(std::uint32_t mn, std::uint32_t k) const {
    const std::uint32_t s = swizzle_bytes(swizzle);
    if (major == WgmmaMajor::k) {
      if (s == 0) {  // ((8,m),(T,2k)) : ((1T,SBO),(1,LBO))
        return 2 * ((mn % 8) * 8 + (k % 8)) + (mn / 8) * sbo + (k / 8) * lbo;
      }
      // ((8,m),(T,2k)) : ((S/16 T, SBO),(1,T)); K beyond one row goes to the next atom.
      const std::uint32_t e = s / 2;
      return 2 * ((mn % 8) * e + k % e) + (mn / 8) * sbo + (k / e) * k_atom_stride;
    }
    if (s == 0) {  // ((T,1,m),(8,k)) : ((1,T,SBO),(1T,LBO))
      return 2 * ((mn % 8) + (k % 8) * 8) + (mn / 8) * sbo + (k / 8) * lbo;
    }
    // ((T,S/16,m),(8,k)) : ((1,T,LBO),(S/16 T,SBO))
    const std::uint32_t e = s / 2;
    return 2 * ((mn % e) + (k % 8) * e) + (mn / e) * lbo + (k / 8) * sbo;
  }
  // Where the descriptor of K step `step` (k = 16 step ..) starts, relative to the tile.
  std::uint32_t step_start(int step) const {
    const auto k = static_cast<std::uint32_t>(16 * step);
    const std::uint32_t s = swizzle_bytes(swizzle);
    if (major == WgmmaMajor::k) {
      if (s == 0) return (k / 8) * lbo;
      return (k / (s / 2)) * k_atom_stride + (k % (s / 2)) * 2;
    }
    return s == 0 ? (k / 8) * lbo : (k / 8) * sbo;
  }
};

/// Lays a tile out; `alternate` picks the other legal arrangement of LBO and SBO so that the
/// two offsets differ between runs (a swapped pair must change the result).
HostTile make_tile(WgmmaMajor major, WgmmaSwizzle swizzle, std::uint32_t mn_extent, bool alternate,
                   std::uint32_t base) {
  HostTile tile{major, swizzle, mn_extent};
  tile.base = base;
  const std::uint32_t s = swizzle_bytes(swizzle);
  const std::uint32_t core = 128;  // 8 rows x 16 bytes
  if (major == WgmmaMajor::k) {
    if (s == 0) {
      tile.lbo = alternate ? (mn_extent / 8) * core : core;
      tile.sbo = alternate ? core : (k_total / 8) * core;
    } else {
      tile.lbo = 16;  // unused for swizzled K-major ("assumed 1")
      tile.sbo = 8 * s;
      tile.k_atom_stride = (mn_extent / 8) * tile.sbo;
    }
  } else {
    if (s == 0) {
      tile.sbo = alternate ? (k_total / 8) * core : core;
      tile.lbo = alternate ? core : (mn_extent / 8) * core;
    } else {
      const std::uint32_t atoms = (mn_extent + s / 2 - 1) / (s / 2);
      tile.lbo = alternate ? (k_total / 8) * 8 * s : 8 * s;
      tile.sbo = alternate ? 8 * s : atoms * 8 * s;
    }
  }
  std::uint32_t end = 0;
  for (std::uint32_t mn = 0; mn < mn_extent; ++mn) {
    for (std::uint32_t k = 0; k < k_total; ++k) end = std::max(end, tile.offset(mn, k) + 2);
  }
  tile.bytes = (end + 1023) / 1024 * 1024;
  return tile;
}

void place(std::vector<std::uint8_t>& image, const HostTile& tile, std::uint32_t mn,
           std::uint32_t k, std::uint16_t bits) {
  const std::uint32_t address = apply_swizzle(tile.base + tile.offset(mn, k), tile.swizzle);
  if (address + 2 > image.size()) FAIL("host layout bug: address " << address);
  std::memcpy(&image[address], &bits, 2);
}

struct CaseSpec {
  bool a_in_registers;
  WgmmaMajor a_major, b_major;
  WgmmaSwizzle a_swizzle, b_swizzle;
  bool accumulate;
  bool alternate;
  Fault fault = Fault::none;
  bool wrong_b_swizzle = false;  // describe B with another swizzle mode than it was laid out in
};

struct CaseResult {
  slimserve::Status status;
  int mismatches = 0;
  int nans = 0;
  int base_alignment = 0;
};

template <int N, bool Fp16, bool ARegisters, WgmmaMajor AMajor, WgmmaMajor BMajor>
CaseResult run_case(const CaseSpec& spec, std::uint64_t salt) {
  auto rng = slimserve_test::make_rng(salt);
  std::uniform_int_distribution<int> small(-127, 127);
  auto value = [&](int scale) {
    int v = 0;
    while (v == 0) v = small(rng);  // never zero: a dropped term must show
    return static_cast<float>(v) / static_cast<float>(scale);
  };
  std::vector<float> a(warpgroups * 64 * k_total), b(k_total * N), c(warpgroups * 64 * N);
  for (float& x : a) x = value(32);
  for (float& x : b) x = value(32);
  for (float& x : c) x = value(1024);
  auto bits = [](float x) { return Fp16 ? fp16_bits(x) : bf16_bits(x); };

  // Tiles: A of each warpgroup, then B, each on a 1024-byte boundary.
  std::uint32_t next = 0;
  HostTile a_tiles[warpgroups] = {
      make_tile(spec.a_major, spec.a_swizzle, 64, spec.alternate, 0),
      make_tile(spec.a_major, spec.a_swizzle, 64, spec.alternate, 0)};
  for (HostTile& tile : a_tiles) {
    tile.base = next;
    next += tile.bytes;
  }
  HostTile b_tile = make_tile(spec.b_major, spec.b_swizzle, N, !spec.alternate, next);
  next += b_tile.bytes;
  if (spec.wrong_b_swizzle) next += 2048;  // a misread tile may reach past its own bytes
  std::vector<std::uint8_t> image(next, 0xFF);  // unused bytes read as NaN
  for (int wg = 0; wg < warpgroups; ++wg) {
    for (std::uint32_t m = 0; m < 64; ++m) {
      for (std::uint32_t k = 0; k < k_total; ++k) {
        place(image, a_tiles[wg], m, k, bits(a[(wg * 64 + m) * k_total + k]));
      }
    }
  }
  for (std::uint32_t n = 0; n < static_cast<std::uint32_t>(N); ++n) {
    for (std::uint32_t k = 0; k < k_total; ++k) place(image, b_tile, n, k, bits(b[k * N + n]));
  }
  std::vector<std::uint16_t> a_bits(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) a_bits[i] = bits(a[i]);

  CaseParams p{};
  p.image_chunks = static_cast<std::uint32_t>(image.size() / 16);
  for (int wg = 0; wg < warpgroups; ++wg) {
    for (int s = 0; s < k_steps; ++s) p.a_start[wg][s] = a_tiles[wg].base + a_tiles[wg].step_start(s);
  }
  p.a_lbo = a_tiles[0].lbo;
  p.a_sbo = a_tiles[0].sbo;
  p.a_swizzle = static_cast<std::uint32_t>(spec.a_swizzle);
  for (int s = 0; s < k_steps; ++s) p.b_start[s] = b_tile.base + b_tile.step_start(s);
  p.b_lbo = b_tile.lbo;
  p.b_sbo = b_tile.sbo;
  p.b_swizzle = static_cast<std::uint32_t>(spec.b_swizzle);
  if (spec.wrong_b_swizzle) {
    p.b_swizzle = static_cast<std::uint32_t>(spec.b_swizzle == WgmmaSwizzle::bytes128
                                                 ? WgmmaSwizzle::bytes64
                                                 : WgmmaSwizzle::bytes128);
  }
  p.accumulate = spec.accumulate ? 1 : 0;
  p.fault = spec.fault;

  auto d_image = rt::DeviceBuffer<uint4>::create(image.size() / 16);
  auto d_a = rt::DeviceBuffer<std::uint16_t>::create(a_bits.size());
  auto d_c = rt::DeviceBuffer<float>::create(c.size());
  auto d_d = rt::DeviceBuffer<float>::create(c.size());
  auto d_align = rt::DeviceBuffer<int>::create(1);
  REQUIRE((d_image.ok() && d_a.ok() && d_c.ok() && d_d.ok() && d_align.ok()));
  std::vector<uint4> chunks(image.size() / 16);
  std::memcpy(chunks.data(), image.data(), image.size());
  REQUIRE(d_image->upload(chunks).ok());
  REQUIRE(d_a->upload(a_bits).ok());
  REQUIRE(d_c->upload(c).ok());
  REQUIRE(d_d->fill_bytes(0xFF).ok());
  REQUIRE(d_align->fill_bytes(0x7F).ok());
  p.image = d_image->data();
  p.a = d_a->data();
  p.c = d_c->data();
  p.d = d_d->data();
  p.base_alignment = d_align->data();

  const rt::LaunchConfig config{dim3(1), dim3(warpgroups * 128), image.size(), nullptr};
  const slimserve::Status launched =
      rt::launch(&wgmma_kernel<N, Fp16, ARegisters, AMajor, BMajor>, config, p);
  CaseResult result{launched.ok() ? rt::stream_synchronize(nullptr) : launched};
  if (!result.status.ok()) return result;
  std::vector<float> d(c.size());
  REQUIRE(d_d->download(d).ok());
  std::vector<int> alignment(1);
  REQUIRE(d_align->download(alignment).ok());
  result.base_alignment = alignment[0];

  for (int wg = 0; wg < warpgroups; ++wg) {
    for (int m = 0; m < 64; ++m) {
      for (int n = 0; n < N; ++n) {
        double expected = spec.accumulate ? c[(wg * 64 + m) * N + n] : 0.0;
        for (int k = 0; k < k_total; ++k) {
          expected += static_cast<double>(a[(wg * 64 + m) * k_total + k]) * b[k * N + n];
        }
        const float got = d[(wg * 64 + m) * N + n];
        if (std::isnan(got)) ++result.nans;
        if (got != static_cast<float>(expected) && ++result.mismatches <= 4 &&
            spec.fault == Fault::none && !spec.wrong_b_swizzle) {
          UNSCOPED_INFO("warpgroup " << wg << " D[" << m << "][" << n << "] = " << got
                                     << ", expected " << expected);
        }
      }
    }
  }
  return result;
}

const char* swizzle_name(WgmmaSwizzle s) {
  switch (s) {
    case WgmmaSwizzle::bytes128: return "128B";
    case WgmmaSwizzle::bytes64: return "64B";
    case WgmmaSwizzle::bytes32: return "32B";
    default: return "none";
  }
}

constexpr WgmmaSwizzle all_swizzles[4] = {WgmmaSwizzle::none, WgmmaSwizzle::bytes32,
                                          WgmmaSwizzle::bytes64, WgmmaSwizzle::bytes128};

template <int N, bool Fp16, bool ARegisters, WgmmaMajor AMajor, WgmmaMajor BMajor>
void check_all_swizzles(std::uint64_t salt) {
  auto rng = slimserve_test::make_rng(salt);
  for (int sb = 0; sb < 4; ++sb) {
    CaseSpec spec{};
    spec.a_in_registers = ARegisters;
    spec.a_major = AMajor;
    spec.b_major = BMajor;
    spec.b_swizzle = all_swizzles[sb];
    spec.a_swizzle = all_swizzles[(sb + 1 + rng() % 3) % 4];  // a different mode than B's
    spec.accumulate = rng() % 2 == 0;
    spec.alternate = rng() % 2 == 0;
    INFO("N " << N << (Fp16 ? " f16" : " bf16") << (ARegisters ? " A in registers" : " A in smem")
              << " A " << (AMajor == WgmmaMajor::k ? "K" : "M") << "-major "
              << swizzle_name(spec.a_swizzle) << ", B "
              << (BMajor == WgmmaMajor::k ? "K" : "N") << "-major "
              << swizzle_name(spec.b_swizzle) << (spec.accumulate ? ", D += " : ", D = ")
              << (spec.alternate ? "(alternate LBO/SBO)" : ""));
    const CaseResult result =
        run_case<N, Fp16, ARegisters, AMajor, BMajor>(spec, salt * 16 + static_cast<unsigned>(sb));
    INFO(result.status.to_string());
    REQUIRE(result.status.ok());
    CHECK(result.base_alignment == 0);
    CHECK(result.mismatches == 0);
  }
}

template <int N>
void check_shape() {
  constexpr auto K = WgmmaMajor::k;
  constexpr auto MN = WgmmaMajor::mn;
  check_all_swizzles<N, false, false, K, K>(100 + N);
  check_all_swizzles<N, false, false, MN, MN>(200 + N);
  check_all_swizzles<N, false, false, K, MN>(300 + N);
  check_all_swizzles<N, false, false, MN, K>(400 + N);
  check_all_swizzles<N, false, true, K, K>(500 + N);
  check_all_swizzles<N, false, true, K, MN>(600 + N);
}

}  // namespace

TEST_CASE("wgmma m64n16k16 bf16 matches an FP64 matmul in every layout", "[emu][arch][wgmma]") {
  check_shape<16>();
}
TEST_CASE("wgmma m64n64k16 bf16 matches an FP64 matmul in every layout", "[emu][arch][wgmma]") {
  check_shape<64>();
}
TEST_CASE("wgmma m64n128k16 bf16 matches an FP64 matmul in every layout", "[emu][arch][wgmma]") {
  check_shape<128>();
}
TEST_CASE("wgmma m64n256k16 bf16 matches an FP64 matmul in every layout", "[emu][arch][wgmma]") {
  check_shape<256>();
}
TEST_CASE("wgmma m64n64k16 f16 matches an FP64 matmul", "[emu][arch][wgmma]") {
  constexpr auto K = WgmmaMajor::k;
  constexpr auto MN = WgmmaMajor::mn;
  check_all_swizzles<64, true, false, K, MN>(700);
  check_all_swizzles<64, true, false, MN, K>(701);
  check_all_swizzles<64, true, true, K, MN>(702);
}

TEST_CASE("wgmma with a descriptor naming the wrong swizzle gives a wrong result",
          "[emu][arch][wgmma]") {
  for (WgmmaSwizzle swizzle : {WgmmaSwizzle::bytes128, WgmmaSwizzle::bytes64}) {
    CaseSpec spec{false, WgmmaMajor::k, WgmmaMajor::k, WgmmaSwizzle::bytes128, swizzle,
                  true, false};
    spec.wrong_b_swizzle = true;
    const CaseResult result =
        run_case<64, false, false, WgmmaMajor::k, WgmmaMajor::k>(spec, 800);
    INFO(result.status.to_string());
    REQUIRE(result.status.ok());
    CHECK(result.mismatches > 64 * 64);  // most of D is wrong
  }
}

TEST_CASE("the wgmma_smem_offset helper matches the host layouts and the PTX ISA examples",
          "[emu][arch][wgmma]") {
  for (WgmmaMajor major : {WgmmaMajor::k, WgmmaMajor::mn}) {
    for (WgmmaSwizzle swizzle : all_swizzles) {
      for (bool alternate : {false, true}) {
        const HostTile tile = make_tile(major, swizzle, 256, alternate, 0);
        const std::uint32_t k_limit =
            major == WgmmaMajor::k && swizzle != WgmmaSwizzle::none ? swizzle_bytes(swizzle) / 2
                                                                    : k_total;
        int wrong = 0;
        for (std::uint32_t mn = 0; mn < 256; ++mn) {
          for (std::uint32_t k = 0; k < std::min<std::uint32_t>(k_limit, k_total); ++k) {
            const std::uint32_t expected = apply_swizzle(tile.offset(mn, k), swizzle);
            wrong += arch::wgmma_smem_offset(major, swizzle, tile.lbo, tile.sbo, mn, k) != expected;
          }
        }
        INFO((major == WgmmaMajor::k ? "K" : "MN") << "-major " << swizzle_name(swizzle));
        CHECK(wrong == 0);
      }
    }
  }
  // The ISA's bf16 MN-major examples, as "exact layout" ((T,a,m),(8,k)):((1,T,x),(y,z)) in
  // elements, Swizzle<b,4,3> on bytes; LBO/SBO as the ISA lists them (bytes).
  struct Example {
    WgmmaSwizzle swizzle;
    std::uint32_t atom_chunks, mn_atom_stride, k_row_stride, k_group_stride, lbo, sbo;
  };
  const Example examples[] = {
      {WgmmaSwizzle::none, 1, 64, 8, 128, 128 * 2, 64 * 2},
      {WgmmaSwizzle::bytes32, 2, 128, 16, 256, 128 * 2, 256 * 2},
      {WgmmaSwizzle::bytes64, 4, 256, 32, 512, 256 * 2, 512 * 2},
  };
  for (const Example& e : examples) {
    int wrong = 0;
    const std::uint32_t mn_extent = 8 * e.atom_chunks * 2;  // m = 2
    for (std::uint32_t mn = 0; mn < mn_extent; ++mn) {
      for (std::uint32_t k = 0; k < 16; ++k) {  // k = 2
        const std::uint32_t elements = (mn % 8) + (mn / 8 % e.atom_chunks) * 8 +
                                       (mn / (8 * e.atom_chunks)) * e.mn_atom_stride +
                                       (k % 8) * e.k_row_stride + (k / 8) * e.k_group_stride;
        const std::uint32_t expected = apply_swizzle(2 * elements, e.swizzle);
        wrong += arch::wgmma_smem_offset(WgmmaMajor::mn, e.swizzle, e.lbo, e.sbo, mn, k) !=
                 expected;
      }
    }
    INFO("MN-major example " << swizzle_name(e.swizzle));
    CHECK(wrong == 0);
  }
  // K-major, no swizzle: the ISA's tf32 example ((8,2),(4,4)):((4,32),(1,64)) has LBO = 64
  // elements = 256 B between K core matrices and SBO = 32 elements = 128 B between 8-row
  // groups; the same byte strides for 16-bit elements (8 per core-matrix row):
  for (std::uint32_t mn = 0; mn < 16; ++mn) {
    for (std::uint32_t k = 0; k < 16; ++k) {
      const std::uint32_t expected = (mn % 8) * 16 + (mn / 8) * 128 + (k % 8) * 2 + (k / 8) * 256;
      CHECK(arch::wgmma_smem_offset(WgmmaMajor::k, WgmmaSwizzle::none, 256, 128, mn, k) ==
            expected);
    }
  }
  // K-major 32B: ((8,2),(4,4)):((8,64),(1,4)) for tf32: rows 32 B apart, SBO = 256 B.
  for (std::uint32_t mn = 0; mn < 16; ++mn) {
    for (std::uint32_t k = 0; k < 16; ++k) {
      const std::uint32_t expected = apply_swizzle((mn % 8) * 32 + (mn / 8) * 256 + k * 2,
                                                   WgmmaSwizzle::bytes32);
      CHECK(arch::wgmma_smem_offset(WgmmaMajor::k, WgmmaSwizzle::bytes32, 16, 256, mn, k) ==
            expected);
    }
  }
  // The descriptor's bit fields.
  const std::uint64_t desc = arch::make_wgmma_descriptor(0x12340, 0x560, 0x7890,
                                                         WgmmaSwizzle::bytes64);
  CHECK((desc & 0x3FFF) == 0x1234);
  CHECK(((desc >> 16) & 0x3FFF) == 0x56);
  CHECK(((desc >> 32) & 0x3FFF) == 0x789);
  CHECK(((desc >> 49) & 7) == 0);
  CHECK((desc >> 62) == 2);
}

#if !defined(__CUDACC__)
// Misuse the hardware leaves undefined; the emulator makes each one visible.
namespace {
CaseResult run_fault(Fault fault) {
  CaseSpec spec{false, WgmmaMajor::k, WgmmaMajor::mn, WgmmaSwizzle::bytes128,
                WgmmaSwizzle::bytes64, true, false};
  spec.fault = fault;
  return run_case<64, false, false, WgmmaMajor::k, WgmmaMajor::mn>(spec, 900);
}
}  // namespace

TEST_CASE("emulated wgmma: a missing wgmma.fence fails the launch", "[emu][arch][wgmma]") {
  const CaseResult result = run_fault(Fault::no_fence);
  REQUIRE_FALSE(result.status.ok());
  CHECK_THAT(result.status.to_string(), Catch::Contains("without a wgmma.fence"));
}

TEST_CASE("emulated wgmma: accumulators read before wait_group are NaN",
          "[emu][arch][wgmma]") {
  const CaseResult result = run_fault(Fault::read_before_wait);
  INFO(result.status.to_string());
  REQUIRE(result.status.ok());
  CHECK(result.nans == warpgroups * 64 * 64);
}

TEST_CASE("emulated wgmma: writing an accumulator in flight fails the launch",
          "[emu][arch][wgmma]") {
  const CaseResult result = run_fault(Fault::write_in_flight);
  REQUIRE_FALSE(result.status.ok());
  CHECK_THAT(result.status.to_string(), Catch::Contains("was written while a wgmma.mma_async"));
}

TEST_CASE("emulated wgmma: exiting without wait_group fails the launch", "[emu][arch][wgmma]") {
  const CaseResult result = run_fault(Fault::no_wait);
  REQUIRE_FALSE(result.status.ok());
  CHECK_THAT(result.status.to_string(), Catch::Contains("no wgmma.wait_group retired"));
}

TEST_CASE("emulated wgmma: shared operands are read when the wait retires the operation",
          "[emu][arch][wgmma]") {
  const CaseResult result = run_fault(Fault::overwrite_smem);
  INFO(result.status.to_string());
  REQUIRE(result.status.ok());
  CHECK(result.mismatches > 0);  // the zeroed tiles were used: D = C
}

namespace {
__global__ void three_warps_wgmma_kernel() {
  if (threadIdx.x / 32 == 3) return;  // warp 3 never joins its warpgroup
  arch::wgmma_fence();
}
__global__ void partial_warpgroup_kernel() { arch::wgmma_fence(); }
}  // namespace

TEST_CASE("emulated wgmma: every warp of the warpgroup must take part", "[emu][arch][wgmma]") {
  slimserve::Status status =
      rt::launch(&three_warps_wgmma_kernel, {dim3(1), dim3(128), 0, nullptr});
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(status.to_string(), Catch::Contains("exited"));
  status = rt::launch(&partial_warpgroup_kernel, {dim3(1), dim3(96), 0, nullptr});
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(status.to_string(), Catch::Contains("warpgroup 0 needs threads 0..127"));
}
#endif
