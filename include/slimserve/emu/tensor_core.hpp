#pragma once
/// \file
/// \brief Emulated warp-collective matrix instructions: mma.sync m16n8k16 and ldmatrix.
///
/// Each lane posts its fragment registers (mma) or the 16-byte row it addresses (ldmatrix,
/// read by the lane itself so sanitizers attribute the access to it); once all 32 lanes
/// arrived, the scheduler rebuilds the matrices and hands every lane its part. Fragment
/// layouts follow the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type"
/// and "Warp-level matrix load instruction: ldmatrix"), with g = lane / 4, t = lane % 4:
///   A (16x16, row-major) element i: row g + 8*((i/2)%2), col 2t + i%2 + 8*(i/4)
///   B (16x8, "col")      element i: k 2t + i%2 + 8*(i/2), n g
///   C/D (16x8)           element i: row g + 8*(i/2), col 2t + i%2
/// Element i of a fragment is half (i%2) of register i/2 (low half first).

#include <cstdint>
#include <cstring>
#include <string>

#include "slimserve/config.hpp"
#include "slimserve/emu/half_bits.hpp"
#include "slimserve/emu/scheduler.hpp"
#include "slimserve/emu/warp_ops.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

inline constexpr unsigned full_warp = 0xFFFFFFFFu;

enum class MmaInput { bf16, fp16 };

inline std::uint16_t half_of(std::uint64_t word, unsigned element) noexcept {
  // Word w holds registers 2w (low 32 bits) and 2w+1; each register two 16-bit elements.
  return static_cast<std::uint16_t>(word >> (16 * element));
}

template <MmaInput Input>
inline float element_to_float(std::uint16_t bits) noexcept {
  if constexpr (Input == MmaInput::bf16) {
    return bf16_bits_to_float(bits);
  } else {
    return fp16_bits_to_float(bits);
  }
}

// Payload: words 0-1 = A registers 0-3, word 2 = B registers 0-1, words 3-4 = C floats.
template <MmaInput Input>
inline void combine_mma_m16n8k16(WarpGroup& group) {
  float a[16][16];
  float b[16][8];
  float c[16][8];
  for (unsigned lane = 0; lane < warp_size; ++lane) {
    const unsigned g = lane / 4;
    const unsigned t = lane % 4;
    const std::uint64_t a_words[2] = {group.payload(lane, 0), group.payload(lane, 1)};
    for (unsigned i = 0; i < 8; ++i) {
      const unsigned row = g + 8 * ((i / 2) % 2);
      const unsigned col = 2 * t + i % 2 + 8 * (i / 4);
      a[row][col] = element_to_float<Input>(half_of(a_words[i / 4], i % 4));
    }
    const std::uint64_t b_word = group.payload(lane, 2);
    for (unsigned i = 0; i < 4; ++i) {
      b[2 * t + i % 2 + 8 * (i / 2)][g] = element_to_float<Input>(half_of(b_word, i));
    }
    for (unsigned i = 0; i < 4; ++i) {
      const std::uint64_t word = group.payload(lane, 3 + static_cast<int>(i / 2));
      float value;
      const auto bits = static_cast<std::uint32_t>(word >> (32 * (i % 2)));
      std::memcpy(&value, &bits, sizeof value);
      c[g + 8 * (i / 2)][2 * t + i % 2] = value;
    }
  }
  for (unsigned lane = 0; lane < warp_size; ++lane) {
    const unsigned g = lane / 4;
    const unsigned t = lane % 4;
    std::uint32_t d_bits[4];
    for (unsigned i = 0; i < 4; ++i) {
      const unsigned row = g + 8 * (i / 2);
      const unsigned col = 2 * t + i % 2;
      // Products of 16-bit floats are exact in double; one rounding at the end.
      double sum = c[row][col];
      for (unsigned k = 0; k < 16; ++k) sum += static_cast<double>(a[row][k]) * b[k][col];
      const auto value = static_cast<float>(sum);
      std::memcpy(&d_bits[i], &value, sizeof value);
    }
    group.set_result(lane, 0, d_bits[0] | std::uint64_t{d_bits[1]} << 32);
    group.set_result(lane, 1, d_bits[2] | std::uint64_t{d_bits[3]} << 32);
  }
}

template <MmaInput Input>
inline void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                         const float (&c)[4], CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  std::uint32_t c_bits[4];
  std::memcpy(c_bits, c, sizeof c_bits);
  relaxed_store(self.payload[0], a[0] | std::uint64_t{a[1]} << 32);
  relaxed_store(self.payload[1], a[2] | std::uint64_t{a[3]} << 32);
  relaxed_store(self.payload[2], b[0] | std::uint64_t{b[1]} << 32);
  relaxed_store(self.payload[3], c_bits[0] | std::uint64_t{c_bits[1]} << 32);
  relaxed_store(self.payload[4], c_bits[2] | std::uint64_t{c_bits[3]} << 32);
  warp_exchange(self, full_warp, &combine_mma_m16n8k16<Input>, site);
  const std::uint64_t r0 = relaxed_load(self.result[0]);
  const std::uint64_t r1 = relaxed_load(self.result[1]);
  const std::uint32_t d_bits[4] = {static_cast<std::uint32_t>(r0),
                                   static_cast<std::uint32_t>(r0 >> 32),
                                   static_cast<std::uint32_t>(r1),
                                   static_cast<std::uint32_t>(r1 >> 32)};
  std::memcpy(d, d_bits, sizeof d_bits);
}

// ldmatrix payload: words 0-1 = the 16-byte row this lane addressed (lanes < 8 * matrices).
template <int Matrices, bool Transposed>
inline void combine_ldmatrix(WarpGroup& group) {
  auto element = [&](unsigned matrix, unsigned row, unsigned col) -> std::uint32_t {
    const std::uint64_t word = group.payload(8 * matrix + row, static_cast<int>(col / 4));
    return static_cast<std::uint16_t>(word >> (16 * (col % 4)));
  };
  for (unsigned lane = 0; lane < warp_size; ++lane) {
    std::uint32_t regs[4] = {};
    for (unsigned j = 0; j < static_cast<unsigned>(Matrices); ++j) {
      if constexpr (Transposed) {
        const unsigned col = lane / 4;
        regs[j] = element(j, 2 * (lane % 4), col) | element(j, 2 * (lane % 4) + 1, col) << 16;
      } else {
        const unsigned row = lane / 4;
        regs[j] = element(j, row, 2 * (lane % 4)) | element(j, row, 2 * (lane % 4) + 1) << 16;
      }
    }
    group.set_result(lane, 0, regs[0] | std::uint64_t{regs[1]} << 32);
    group.set_result(lane, 1, regs[2] | std::uint64_t{regs[3]} << 32);
  }
}

template <int Matrices, bool Transposed>
inline void ldmatrix(std::uint32_t (&r)[Matrices], const void* row_address, CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  std::uint64_t row[2] = {0, 0};
  if (self.lane < 8u * Matrices) {  // only these lanes' addresses are used
    if (reinterpret_cast<std::uintptr_t>(row_address) % 16 != 0) {
      fail_this_thread(format_site(site) + ": row address " +
                       std::to_string(reinterpret_cast<std::uintptr_t>(row_address)) +
                       " is not 16-byte aligned");
    }
    std::memcpy(row, row_address, sizeof row);
  }
  relaxed_store(self.payload[0], row[0]);
  relaxed_store(self.payload[1], row[1]);
  warp_exchange(self, full_warp, &combine_ldmatrix<Matrices, Transposed>, site);
  const std::uint64_t r0 = relaxed_load(self.result[0]);
  const std::uint64_t r1 = relaxed_load(self.result[1]);
  const std::uint32_t regs[4] = {static_cast<std::uint32_t>(r0),
                                 static_cast<std::uint32_t>(r0 >> 32),
                                 static_cast<std::uint32_t>(r1),
                                 static_cast<std::uint32_t>(r1 >> 32)};
  for (int j = 0; j < Matrices; ++j) r[j] = regs[j];
}

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END
