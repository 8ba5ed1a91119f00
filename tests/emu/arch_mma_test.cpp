// ldmatrix -> mma.sync against a plain host matrix product, and prmt / lop3 against bit
// formulas. KERNEL: the same file runs on a real GPU, which is how the emulator's fragment
// layouts are checked against the hardware. Inputs are multiples of 1/32 and 1/1024 small
// enough that every product and sum is exact in fp32, so results must match bit for bit.
#include <catch2/catch.hpp>

#include <bit>
#include <cstdint>
#include <random>
#include <vector>

#include "slimserve/arch/bit_ops.cuh"
#include "slimserve/arch/ldmatrix.cuh"
#include "slimserve/arch/mma.cuh"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/runtime/shared_memory.cuh"
#include "support/random.hpp"

namespace rt = slimserve::rt;
namespace arch = slimserve::arch;

namespace {

constexpr int warps = 2;
constexpr int a_modes = 6;  // x4, x2, x1, x4.trans, x2.trans, x1.trans
constexpr int b_modes = 4;  // x2, x2.trans, x1, x1.trans

struct MmaShared {
  std::uint16_t a[warps][16][16];    // [warp][m][k]
  std::uint16_t a_t[warps][16][16];  // [warp][k][m]
  std::uint16_t b[16][8];            // [k][n]
  std::uint16_t b_t[8][16];          // [n][k]
};

__device__ void load_a(std::uint32_t (&frag)[4], const MmaShared& s, int warp, int lane,
                       int mode) {
  const int j = lane / 8;  // matrix whose row this lane addresses
  const int r = lane % 8;
  // Matrix j of A's fragment: rows 8*(j%2).., columns 8*(j/2).. (registers a0a1, a2a3, ...).
  switch (mode) {
    case 0: arch::ldmatrix_x4(frag, &s.a[warp][(j % 2) * 8 + r][(j / 2) * 8]); break;
    case 1: {
      std::uint32_t lo[2], hi[2];
      arch::ldmatrix_x2(lo, &s.a[warp][(j % 2) * 8 + r][0]);
      arch::ldmatrix_x2(hi, &s.a[warp][(j % 2) * 8 + r][8]);
      frag[0] = lo[0]; frag[1] = lo[1]; frag[2] = hi[0]; frag[3] = hi[1];
      break;
    }
    case 2:
      for (int m = 0; m < 4; ++m) {
        std::uint32_t one[1];
        arch::ldmatrix_x1(one, &s.a[warp][(m % 2) * 8 + r][(m / 2) * 8]);
        frag[m] = one[0];
      }
      break;
    case 3: arch::ldmatrix_x4_trans(frag, &s.a_t[warp][(j / 2) * 8 + r][(j % 2) * 8]); break;
    case 4: {
      std::uint32_t lo[2], hi[2];
      arch::ldmatrix_x2_trans(lo, &s.a_t[warp][r][(j % 2) * 8]);
      arch::ldmatrix_x2_trans(hi, &s.a_t[warp][8 + r][(j % 2) * 8]);
      frag[0] = lo[0]; frag[1] = lo[1]; frag[2] = hi[0]; frag[3] = hi[1];
      break;
    }
    default:
      for (int m = 0; m < 4; ++m) {
        std::uint32_t one[1];
        arch::ldmatrix_x1_trans(one, &s.a_t[warp][(m / 2) * 8 + r][(m % 2) * 8]);
        frag[m] = one[0];
      }
      break;
  }
}

__device__ void load_b(std::uint32_t (&frag)[2], const MmaShared& s, int lane, int mode) {
  const int j = (lane / 8) % 2;
  const int r = lane % 8;
  switch (mode) {
    case 0: arch::ldmatrix_x2(frag, &s.b_t[r][j * 8]); break;
    case 1: arch::ldmatrix_x2_trans(frag, &s.b[lane % 16][0]); break;
    case 2:
      for (int m = 0; m < 2; ++m) {
        std::uint32_t one[1];
        arch::ldmatrix_x1(one, &s.b_t[r][m * 8]);
        frag[m] = one[0];
      }
      break;
    default:
      for (int m = 0; m < 2; ++m) {
        std::uint32_t one[1];
        arch::ldmatrix_x1_trans(one, &s.b[m * 8 + r][0]);
        frag[m] = one[0];
      }
      break;
  }
}

// Block (a_mode, b_mode); warp w computes d[w] = a[w] * b + c[w].
template <bool Bf16>
__global__ void ldmatrix_mma_kernel(const std::uint16_t* __restrict__ a,  // [warps, 16, 16]
                                    const std::uint16_t* __restrict__ b,  // [16, 8]
                                    const float* __restrict__ c,          // [warps, 16, 8]
                                    float* __restrict__ d)  // [a_modes, b_modes, warps, 16, 8]
{
  auto& s = rt::shared_storage<MmaShared>();
  const int tid = static_cast<int>(threadIdx.x);
  for (int i = tid; i < warps * 256; i += warps * 32) {
    const int w = i / 256, m = i / 16 % 16, k = i % 16;
    s.a[w][m][k] = a[i];
    s.a_t[w][k][m] = a[i];
  }
  for (int i = tid; i < 128; i += warps * 32) {
    const int k = i / 8, n = i % 8;
    s.b[k][n] = b[i];
    s.b_t[n][k] = b[i];
  }
  __syncthreads();
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  std::uint32_t a_frag[4];
  std::uint32_t b_frag[2];
  load_a(a_frag, s, warp, lane, static_cast<int>(blockIdx.x));
  load_b(b_frag, s, lane, static_cast<int>(blockIdx.y));
  float c_frag[4];
  for (int i = 0; i < 4; ++i) c_frag[i] = c[(warp * 16 + g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  float d_frag[4];
  if constexpr (Bf16) {
    arch::mma_m16n8k16_bf16(d_frag, a_frag, b_frag, c_frag);
  } else {
    arch::mma_m16n8k16_fp16(d_frag, a_frag, b_frag, c_frag);
  }
  float* out = d + ((blockIdx.x * b_modes + blockIdx.y) * warps + warp) * 128;
  for (int i = 0; i < 4; ++i) out[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d_frag[i];
}

// Exact 16-bit encodings of multiples of 1/32 in [-4, 4] (7 significant bits at most).
std::uint16_t bf16_bits(float value) {
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(value) >> 16);
}
std::uint16_t fp16_bits(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  if ((x & 0x7FFFFFFFu) == 0) return sign;
  const std::uint32_t exponent = ((x >> 23) & 0xFFu) - 127u + 15u;
  return static_cast<std::uint16_t>(sign | exponent << 10 | ((x >> 13) & 0x3FFu));
}

template <bool Bf16>
void check_ldmatrix_mma() {
  auto rng = slimserve_test::make_rng(Bf16 ? 11 : 12);
  std::uniform_int_distribution<int> small(-127, 127);
  std::vector<float> a(warps * 256), b(128), c(warps * 128);
  for (float& x : a) x = static_cast<float>(small(rng)) / 32.0f;
  for (float& x : b) x = static_cast<float>(small(rng)) / 32.0f;
  for (float& x : c) x = static_cast<float>(small(rng)) / 1024.0f;
  std::vector<std::uint16_t> a_bits(a.size()), b_bits(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) a_bits[i] = Bf16 ? bf16_bits(a[i]) : fp16_bits(a[i]);
  for (std::size_t i = 0; i < b.size(); ++i) b_bits[i] = Bf16 ? bf16_bits(b[i]) : fp16_bits(b[i]);

  auto d_a = rt::DeviceBuffer<std::uint16_t>::create(a_bits.size());
  auto d_b = rt::DeviceBuffer<std::uint16_t>::create(b_bits.size());
  auto d_c = rt::DeviceBuffer<float>::create(c.size());
  const std::size_t d_count = static_cast<std::size_t>(a_modes) * b_modes * warps * 128;
  auto d_d = rt::DeviceBuffer<float>::create(d_count);
  REQUIRE((d_a.ok() && d_b.ok() && d_c.ok() && d_d.ok()));
  REQUIRE(d_a->upload(a_bits).ok());
  REQUIRE(d_b->upload(b_bits).ok());
  REQUIRE(d_c->upload(c).ok());
  REQUIRE(d_d->fill_bytes(0xFF).ok());

  const rt::LaunchConfig config{dim3(a_modes, b_modes), dim3(warps * 32), sizeof(MmaShared),
                                nullptr};
  const slimserve::Status status = rt::launch(&ldmatrix_mma_kernel<Bf16>, config, d_a->data(),
                                              d_b->data(), d_c->data(), d_d->data());
  INFO(status.to_string());
  REQUIRE(status.ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  std::vector<float> d(d_count);
  REQUIRE(d_d->download(d).ok());

  int mismatches = 0;
  for (int am = 0; am < a_modes; ++am) {
    for (int bm = 0; bm < b_modes; ++bm) {
      for (int w = 0; w < warps; ++w) {
        for (int m = 0; m < 16; ++m) {
          for (int n = 0; n < 8; ++n) {
            float expected = c[(w * 16 + m) * 8 + n];
            for (int k = 0; k < 16; ++k) expected += a[(w * 16 + m) * 16 + k] * b[k * 8 + n];
            const float got = d[(((am * b_modes + bm) * warps + w) * 16 + m) * 8 + n];
            if (got != expected && ++mismatches <= 8) {
              UNSCOPED_INFO("a_mode " << am << " b_mode " << bm << " warp " << w << " D[" << m
                                      << "][" << n << "] = " << got << ", expected "
                                      << expected);
            }
          }
        }
      }
    }
  }
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("ldmatrix (x1/x2/x4, trans) feeding mma m16n8k16 bf16 matches a host matmul",
          "[emu][arch]") {
  check_ldmatrix_mma<true>();
}

TEST_CASE("ldmatrix (x1/x2/x4, trans) feeding mma m16n8k16 fp16 matches a host matmul",
          "[emu][arch]") {
  check_ldmatrix_mma<false>();
}

namespace {

constexpr int bit_results = 5;

__global__ void bit_ops_kernel(const std::uint32_t* __restrict__ in,  // [n, 4]
                               std::uint32_t* __restrict__ out,       // [n, bit_results]
                               int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const std::uint32_t a = in[4 * i], b = in[4 * i + 1], c = in[4 * i + 2], sel = in[4 * i + 3];
  std::uint32_t* o = out + bit_results * i;
  o[0] = arch::prmt(a, b, sel);
  o[1] = arch::lop3<0x96>(a, b, c);                 // a ^ b ^ c
  o[2] = arch::lop3<0xE8>(a, b, c);                 // majority
  o[3] = arch::lop3<(0xF0 & 0xCC) | 0xAA>(a, b, c);  // (a & b) | c
  o[4] = arch::lop3<0xF0 ^ (0xCC | 0xAA)>(a, b, c);  // a ^ (b | c)
}

std::uint32_t prmt_reference(std::uint32_t a, std::uint32_t b, std::uint32_t sel) {
  const std::uint8_t bytes[8] = {
      static_cast<std::uint8_t>(a),       static_cast<std::uint8_t>(a >> 8),
      static_cast<std::uint8_t>(a >> 16), static_cast<std::uint8_t>(a >> 24),
      static_cast<std::uint8_t>(b),       static_cast<std::uint8_t>(b >> 8),
      static_cast<std::uint8_t>(b >> 16), static_cast<std::uint8_t>(b >> 24)};
  std::uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned nibble = (sel >> (4 * i)) & 15u;
    const std::uint8_t byte = bytes[nibble % 8];
    const std::uint32_t v = nibble >= 8 ? (byte >= 0x80 ? 0xFFu : 0u) : byte;
    r |= v << (8 * i);
  }
  return r;
}

}  // namespace

TEST_CASE("prmt and lop3 match their bit formulas", "[emu][arch]") {
  constexpr int n = 100;
  auto rng = slimserve_test::make_rng(13);
  std::vector<std::uint32_t> in(4 * n);
  for (auto& x : in) x = static_cast<std::uint32_t>(rng());
  in[3] = 0x3210;  // identity
  in[7] = 0x7654;  // b
  in[11] = 0x89AB;  // sign replication of a's bytes
  auto d_in = rt::DeviceBuffer<std::uint32_t>::create(in.size());
  auto d_out = rt::DeviceBuffer<std::uint32_t>::create(bit_results * n);
  REQUIRE((d_in.ok() && d_out.ok()));
  REQUIRE(d_in->upload(in).ok());
  REQUIRE(d_out->fill_bytes(0xFF).ok());
  const slimserve::Status status =
      rt::launch(&bit_ops_kernel, {dim3(2), dim3(64), 0, nullptr}, d_in->data(), d_out->data(), n);
  INFO(status.to_string());
  REQUIRE(status.ok());
  std::vector<std::uint32_t> out(bit_results * n);
  REQUIRE(d_out->download(out).ok());
  for (int i = 0; i < n; ++i) {
    INFO("input " << i);
    const std::uint32_t a = in[4 * i], b = in[4 * i + 1], c = in[4 * i + 2], sel = in[4 * i + 3];
    CHECK(out[bit_results * i + 0] == prmt_reference(a, b, sel));
    CHECK(out[bit_results * i + 1] == (a ^ b ^ c));
    CHECK(out[bit_results * i + 2] == ((a & b) | (a & c) | (b & c)));
    CHECK(out[bit_results * i + 3] == ((a & b) | c));
    CHECK(out[bit_results * i + 4] == (a ^ (b | c)));
  }
  CHECK(out[0] == in[0]);
  CHECK(out[bit_results] == in[5]);
}
