// The core of an MLA decode step on wgmma, one 64-token latent tile (KERNEL: also on a GPU):
// 64 query rows (heads x query tokens) against a latent tile staged once in the 128B-swizzled
// canonical layout (arch/wgmma_tile.cuh), FP8 e4m3 widened exactly to BF16 while staging.
//   S = Q[64, 576] . latent[64, 576]^T   (latent as the K-major B; warpgroup w: tokens 32w..)
//   O = P[64, 64] . latent[64, 0:512]    (the same bytes as the MN-major B; warpgroup w: 256
//                                          latent columns from 256w)
// Every element against an FP64 product of the already-quantized inputs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "slimserve/arch/fp8_convert.cuh"
#include "slimserve/arch/wgmma.cuh"
#include "slimserve/arch/wgmma_tile.cuh"
#include "slimserve/attention/kernels/mla_wgmma_decode_kernel.cuh"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/runtime/launch.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/runtime/shared_memory.cuh"
#include "support/random.hpp"

namespace rt = slimserve::rt;
namespace arch = slimserve::arch;

namespace {

constexpr int rows = 64;        // heads x query tokens: one warpgroup's M
constexpr int tokens = 64;      // latent tile
constexpr int dims = 576;       // 512 latent + 64 rope
constexpr int value_dims = 512;
using QTile = arch::WgmmaTile128B<rows, dims>;
using LatentTile = arch::WgmmaTile128B<tokens, dims>;
using PTile = arch::WgmmaTile128B<rows, tokens>;
constexpr std::uint32_t q_offset = 0;
constexpr std::uint32_t latent_offset = q_offset + QTile::bytes;
constexpr std::uint32_t p_offset = latent_offset + LatentTile::bytes;
constexpr std::uint32_t smem_bytes = p_offset + PTile::bytes;
static_assert(latent_offset % 1024 == 0 && p_offset % 1024 == 0);

struct TileParams {
  const std::uint16_t* q;       // [rows, dims] bf16
  const void* latent;           // [tokens, dims] bf16, or e4m3 codes
  const std::uint16_t* p;       // [rows, tokens] bf16
  float* s;                     // [rows, tokens]
  float* o;                     // [rows, value_dims]
  int* base_alignment;          // shared address of the tiles % 1024 (must be 0)
};

// e4m3 -> f16 is exact, and so is f16 -> bf16 for e4m3 values (4 significant bits, exponents
// within bf16's range).
__device__ __forceinline__ std::uint32_t e4m3x2_to_bf16x2(std::uint16_t codes) {
  const std::uint32_t halves = arch::cvt_e4m3x2_to_f16x2(codes);
  std::uint32_t out = 0;
  for (int i = 0; i < 2; ++i) {
    const float value =
        slimserve::to_float(slimserve::fp16::from_bits(static_cast<std::uint16_t>(halves >> (16 * i))));
    out |= (__float_as_uint(value) >> 16) << (16 * i);
  }
  return out;
}

template <bool Fp8>
__global__ void mla_wgmma_tile_kernel(TileParams p) {
  unsigned char* smem = rt::dynamic_shared_memory();
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  // Stage the tiles: one 16-byte chunk (8 values) per step, written to its swizzled place.
  for (int i = tid; i < rows * dims / 8; i += threads) {
    const int row = i / (dims / 8), chunk = i % (dims / 8);
    *reinterpret_cast<uint4*>(smem + q_offset + QTile::chunk_offset(row, chunk)) =
        *reinterpret_cast<const uint4*>(p.q + row * dims + 8 * chunk);
  }
  if constexpr (Fp8) {
    const auto* codes = static_cast<const std::uint8_t*>(p.latent);
    for (int i = tid; i < tokens * dims / 8; i += threads) {
      const int token = i / (dims / 8), chunk = i % (dims / 8);
      const uint2 packed = *reinterpret_cast<const uint2*>(codes + token * dims + 8 * chunk);
      const std::uint32_t words[2] = {packed.x, packed.y};
      uint4 wide;
      wide.x = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(words[0]));
      wide.y = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(words[0] >> 16));
      wide.z = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(words[1]));
      wide.w = e4m3x2_to_bf16x2(static_cast<std::uint16_t>(words[1] >> 16));
      *reinterpret_cast<uint4*>(smem + latent_offset + LatentTile::chunk_offset(token, chunk)) = wide;
    }
  } else {
    const auto* values = static_cast<const std::uint16_t*>(p.latent);
    for (int i = tid; i < tokens * dims / 8; i += threads) {
      const int token = i / (dims / 8), chunk = i % (dims / 8);
      *reinterpret_cast<uint4*>(smem + latent_offset + LatentTile::chunk_offset(token, chunk)) =
          *reinterpret_cast<const uint4*>(values + token * dims + 8 * chunk);
    }
  }
  for (int i = tid; i < rows * tokens / 8; i += threads) {
    const int row = i / (tokens / 8), chunk = i % (tokens / 8);
    *reinterpret_cast<uint4*>(smem + p_offset + PTile::chunk_offset(row, chunk)) =
        *reinterpret_cast<const uint4*>(p.p + row * tokens + 8 * chunk);
  }
  arch::fence_proxy_async_shared();
  __syncthreads();

  const std::uint32_t base = arch::wgmma_shared_address(smem);
  if (tid == 0) *p.base_alignment = static_cast<int>(base % 1024u);
  const int wg = tid / 128, w = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;

  // S for tokens [32 wg, 32 wg + 32): the B rows start 4 row groups (4 KB) later.
  float s[16];
  arch::wgmma_fence();
  for (int k = 0; k < dims / 16; ++k) {
    arch::wgmma_mma_ss_bf16<32>(
        s, QTile::k_major_descriptor(base + q_offset, k),
        LatentTile::k_major_descriptor(base + latent_offset + 4u * LatentTile::group_bytes * static_cast<std::uint32_t>(wg), k),
        k > 0);
  }
  arch::wgmma_commit_group();
  arch::wgmma_wait_group<0>();
  for (int i = 0; i < 16; ++i) {
    const int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t + i % 2;
    p.s[row * tokens + 32 * wg + col] = s[i];
  }

  // O columns [256 wg, 256 wg + 256): P (K-major A) times the latent as MN-major B.
  float o[128];
  arch::wgmma_fence();
  for (int k = 0; k < tokens / 16; ++k) {
    arch::wgmma_mma_ss_bf16<256, arch::WgmmaMajor::k, arch::WgmmaMajor::mn>(
        o, PTile::k_major_descriptor(base + p_offset, k),
        LatentTile::mn_major_descriptor(base + latent_offset, k, 256 * wg), k > 0);
  }
  arch::wgmma_commit_group();
  arch::wgmma_wait_group<0>();
  for (int i = 0; i < 128; ++i) {
    const int row = 16 * w + g + 8 * ((i / 2) % 2), col = 8 * (i / 4) + 2 * t + i % 2;
    p.o[row * value_dims + 256 * wg + col] = o[i];
  }
}

float bf16_value(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t{bits} << 16); }
std::uint16_t bf16_round(float value) {  // round to nearest even (finite inputs)
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

template <bool Fp8>
void check_tile() {
  auto rng = slimserve_test::make_rng(Fp8 ? 31 : 32);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<std::uint16_t> q(rows * dims), p(rows * tokens), latent_bf16(tokens * dims);
  std::vector<std::uint8_t> latent_fp8(tokens * dims);
  std::vector<double> latent(tokens * dims);  // the quantized values, as the kernel sees them
  for (auto& x : q) x = bf16_round(normal(rng));
  for (auto& x : p) x = bf16_round(unit(rng));
  for (int i = 0; i < tokens * dims; ++i) {
    const float value = 8.0f * normal(rng);
    if constexpr (Fp8) {
      latent_fp8[i] = slimserve::from_float<slimserve::fp8_e4m3>(value).bits;
      latent[i] = slimserve::to_float(slimserve::fp8_e4m3::from_bits(latent_fp8[i]));
    } else {
      latent_bf16[i] = bf16_round(value);
      latent[i] = bf16_value(latent_bf16[i]);
    }
  }

  auto d_q = rt::DeviceBuffer<std::uint16_t>::create(q.size());
  auto d_p = rt::DeviceBuffer<std::uint16_t>::create(p.size());
  auto d_lat16 = rt::DeviceBuffer<std::uint16_t>::create(latent_bf16.size());
  auto d_lat8 = rt::DeviceBuffer<std::uint8_t>::create(latent_fp8.size());
  auto d_s = rt::DeviceBuffer<float>::create(rows * tokens);
  auto d_o = rt::DeviceBuffer<float>::create(rows * value_dims);
  auto d_align = rt::DeviceBuffer<int>::create(1);
  REQUIRE((d_q.ok() && d_p.ok() && d_lat16.ok() && d_lat8.ok() && d_s.ok() && d_o.ok() && d_align.ok()));
  REQUIRE(d_q->upload(q).ok());
  REQUIRE(d_p->upload(p).ok());
  REQUIRE(d_lat16->upload(latent_bf16).ok());
  REQUIRE(d_lat8->upload(latent_fp8).ok());
  REQUIRE(d_s->fill_bytes(0xFF).ok());
  REQUIRE(d_o->fill_bytes(0xFF).ok());
  TileParams params{d_q->data(),
                    Fp8 ? static_cast<const void*>(d_lat8->data()) : static_cast<const void*>(d_lat16->data()),
                    d_p->data(), d_s->data(), d_o->data(), d_align->data()};
  const slimserve::Status status = rt::launch(&mla_wgmma_tile_kernel<Fp8>,
                                              {dim3(1), dim3(256), smem_bytes, nullptr}, params);
  INFO(status.to_string());
  REQUIRE(status.ok());
  REQUIRE(rt::stream_synchronize(nullptr).ok());
  std::vector<float> s(rows * tokens), o(rows * value_dims);
  std::vector<int> alignment(1);
  REQUIRE(d_s->download(s).ok());
  REQUIRE(d_o->download(o).ok());
  REQUIRE(d_align->download(alignment).ok());
  CHECK(alignment[0] == 0);

  // FP32 accumulation of K products: allow K * 2^-23 of the sum of magnitudes.
  int bad_s = 0, bad_o = 0;
  for (int r = 0; r < rows; ++r) {
    for (int n = 0; n < tokens; ++n) {
      double sum = 0.0, magnitude = 0.0;
      for (int d = 0; d < dims; ++d) {
        const double term = static_cast<double>(bf16_value(q[r * dims + d])) * latent[n * dims + d];
        sum += term;
        magnitude += std::fabs(term);
      }
      const double got = s[r * tokens + n];
      if (!(std::fabs(got - sum) <= dims * 0x1p-23 * magnitude + 1e-30) && ++bad_s <= 4) {
        UNSCOPED_INFO("S[" << r << "][" << n << "] = " << got << ", expected " << sum);
      }
    }
    for (int c = 0; c < value_dims; ++c) {
      double sum = 0.0, magnitude = 0.0;
      for (int n = 0; n < tokens; ++n) {
        const double term = static_cast<double>(bf16_value(p[r * tokens + n])) * latent[n * dims + c];
        sum += term;
        magnitude += std::fabs(term);
      }
      const double got = o[r * value_dims + c];
      if (!(std::fabs(got - sum) <= tokens * 0x1p-23 * magnitude + 1e-30) && ++bad_o <= 4) {
        UNSCOPED_INFO("O[" << r << "][" << c << "] = " << got << ", expected " << sum);
      }
    }
  }
  CHECK(bad_s == 0);
  CHECK(bad_o == 0);
}

}  // namespace

TEST_CASE("MLA on wgmma: one BF16 latent tile serves Q.latent^T (K-major) and P.latent (MN-major)",
          "[attention][mla][wgmma]") {
  check_tile<false>();
}

TEST_CASE("MLA on wgmma: an FP8 e4m3 latent tile widened exactly to BF16 while staging",
          "[attention][mla][wgmma]") {
  check_tile<true>();
}

TEST_CASE("WgmmaTile128B offsets are the canonical 128B layout", "[attention][mla][wgmma]") {
  // K-major view: element (row, k) at swizzle(block(k) + row offset + 2k) (PTX ISA canonical
  // ((8,m),(T,2k)):((8T,SBO),(1,T)) per 64-column block); MN-major view of the same bytes:
  // ((T,8,n),(8,k)):((1,T,LBO),(8T,SBO)) with LBO = one column block, SBO = 1024.
  using Tile = arch::WgmmaTile128B<64, 576>;
  int wrong = 0;
  for (int row = 0; row < 64; ++row) {
    for (int col = 0; col < 576; ++col) {
      const std::uint32_t k_major =
          arch::wgmma_smem_offset(arch::WgmmaMajor::k, arch::WgmmaSwizzle::bytes128, 16, 1024,
                                  static_cast<std::uint32_t>(row), static_cast<std::uint32_t>(col % 64)) +
          static_cast<std::uint32_t>(col / 64) * Tile::block_bytes;
      const std::uint32_t mn_major = arch::wgmma_smem_offset(
          arch::WgmmaMajor::mn, arch::WgmmaSwizzle::bytes128, Tile::block_bytes, 1024,
          static_cast<std::uint32_t>(col), static_cast<std::uint32_t>(row));
      wrong += Tile::element_offset(row, col) != k_major;
      wrong += Tile::element_offset(row, col) != mn_major;
    }
  }
  CHECK(wrong == 0);
  // Descriptors of later steps are the base plus constant start-address steps.
  for (std::uint32_t base : {0u, 1024u, 73728u, 147456u}) {
    for (int k = 0; k < 576 / 16; ++k) {
      CHECK(Tile::k_major_descriptor(base, k) == Tile::k_major_descriptor(base, 0) + Tile::k_major_step(k));
    }
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 512; c += 64) {
        CHECK(Tile::mn_major_descriptor(base, r, c) == Tile::mn_major_descriptor(base, 0, 0) + Tile::mn_major_step(r, c));
      }
    }
  }
}

namespace {

/// How many quarter-warp accesses of the widening step (MlaWgmmaTile::widen_token /
/// widen_chunk, raw_chunk) reach fewer than 8 bank groups (or, for NVFP4's 4-byte block-scale
/// loads, put two words on one bank); and whether every (token, chunk) is widened once. A
/// 16-byte shared access serves 8 lanes at a time, conflict-free only when their 16-byte bank
/// groups (address / 16 mod 8) differ.
struct WidenAccesses {
  bool each_chunk_once = false;
  int load_conflicts = 0, store_conflicts = 0, scale_conflicts = 0;
};

int distinct(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return static_cast<int>(std::unique(v.begin(), v.end()) - v.begin());
}

template <class KvT>
WidenAccesses widen_accesses() {
  using Tile = slimserve::attention::kernels::MlaWgmmaTile<KvT>;
  using Latent = typename Tile::LatentTile;
  constexpr bool nvfp4 = Tile::block_scaled;
  constexpr int warps = Tile::threads / 32, chunks = Tile::code_bytes / 16;
  constexpr int fp16_chunks = nvfp4 ? 4 : 2;  // 16-byte fp16 chunks one raw chunk becomes
  std::vector<int> widened(static_cast<std::size_t>(Tile::tile_tokens * chunks), 0);
  WidenAccesses a;
  for (int warp = 0; warp < warps; ++warp) {
    for (int unit = 0; unit < Tile::widen_units; ++unit) {
      for (int quarter = 0; quarter < 4; ++quarter) {
        std::vector<int> load_groups, scale_words;
        std::vector<std::vector<int>> store_groups(fp16_chunks);
        for (int lane = 8 * quarter; lane < 8 * quarter + 8; ++lane) {
          const int token = Tile::widen_token(warp, lane, unit), c = Tile::widen_chunk(lane, unit);
          REQUIRE((token >= 0 && token < Tile::tile_tokens && c >= 0 && c < chunks));
          ++widened[static_cast<std::size_t>(token * chunks + c)];
          load_groups.push_back((token * Tile::code_bytes + 16 * Tile::raw_chunk(token, c)) / 16 % 8);
          for (int word = 0; word < fp16_chunks; ++word) {
            store_groups[static_cast<std::size_t>(word)].push_back(
                static_cast<int>(Latent::chunk_offset(token, fp16_chunks * c + word) / 16 % 8));
          }
          if (nvfp4) scale_words.push_back((token * Tile::token_scale_bytes + 2 * c) / 4);
        }
        a.load_conflicts += distinct(load_groups) != 8;
        for (const auto& g : store_groups) a.store_conflicts += distinct(g) != 8;
        std::vector<int> words = scale_words;
        std::sort(words.begin(), words.end());
        words.erase(std::unique(words.begin(), words.end()), words.end());
        std::vector<int> banks;
        for (int w : words) banks.push_back(w % 32);
        a.scale_conflicts += distinct(banks) != static_cast<int>(words.size());
      }
    }
  }
  a.each_chunk_once = std::count(widened.begin(), widened.end(), 1) == static_cast<long>(widened.size());
  return a;
}

}  // namespace

TEST_CASE("MLA on wgmma, the widening: every chunk once, every quarter-warp access on 8 bank groups",
          "[attention][mla][wgmma]") {
  // NVFP4: the producer's raw placement is a permutation of each token's raw row.
  using Nvfp4Tile = slimserve::attention::kernels::MlaWgmmaTile<slimserve::nvfp4>;
  constexpr int nvfp4_chunks = Nvfp4Tile::code_bytes / 16;
  for (int token = 0; token < Nvfp4Tile::tile_tokens; ++token) {
    std::vector<int> seen(nvfp4_chunks, 0);
    for (int c = 0; c < nvfp4_chunks; ++c) ++seen[static_cast<std::size_t>(Nvfp4Tile::raw_chunk(token, c))];
    CHECK(std::count(seen.begin(), seen.end(), 1) == nvfp4_chunks);
  }
  const auto check = [](const WidenAccesses& a) {
    CHECK(a.each_chunk_once);
    CHECK(a.load_conflicts == 0);
    CHECK(a.store_conflicts == 0);
    CHECK(a.scale_conflicts == 0);
  };
  SECTION("nvfp4") { check(widen_accesses<slimserve::nvfp4>()); }
  SECTION("fp8_e4m3") { check(widen_accesses<slimserve::fp8_e4m3>()); }
  SECTION("fp8_e5m2") { check(widen_accesses<slimserve::fp8_e5m2>()); }
}
