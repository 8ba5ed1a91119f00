#pragma once
/// \file
/// \brief Emulated sm_90a warpgroup MMA: wgmma.fence, wgmma.mma_async (m64nNk16, f32 += bf16 or
/// f16 products), wgmma.commit_group and wgmma.wait_group.
///
/// Layouts follow the PTX ISA ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate":
/// register fragments for .m64nNk16, shared memory matrix layout, matrix descriptor format).
/// With w = warp % 4 (the warp's rank in its warpgroup), g = lane / 4, t = lane % 4:
///   D (64xN, f32), register i < N/2: row 16w + g + 8*((i/2)%2), col 8*(i/4) + 2t + i%2
///   A (64x16) in registers, element i < 8 (half i%2 of register i/2):
///                                    row 16w + g + 8*((i/2)%2), col 2t + i%2 + 8*(i/4)
/// Shared operands are described by a 64-bit descriptor (bits 0-13 start address >> 4, 16-29
/// leading byte offset >> 4, 32-45 stride byte offset >> 4, 49-51 base offset, 62-63 swizzle:
/// 0 none, 1 128B, 2 64B, 3 32B) over 16-bit elements (T = 8 per 16 bytes), in the canonical
/// layouts (coordinates (mn, k); offsets in elements; LBO/SBO in bytes):
///   K-major,  none:     ((8,m),(T,2)) : ((T,SBO),(1,LBO))
///   K-major,  S bytes:  ((8,m),(T,2)) : ((S/2,SBO),(1,T))        LBO unused
///   MN-major, none:     ((T,1,m),(8,k)) : ((1,T,SBO),(T,LBO))
///   MN-major, S bytes:  ((T,S/16,m),(8,k)) : ((1,T,LBO),(S/2,SBO))
/// and the swizzle acts on the absolute shared byte address: bits [4, 4+b) ^= bits [7, 7+b)
/// with b = 3, 2, 1 for 128B, 64B, 32B.
///
/// Asynchrony, as emulated (chosen so that the hazards PTX leaves undefined show up):
/// - Every wgmma.* instruction is a rendezvous of the 128 threads of the warpgroup at one call
///   site (.sync.aligned): a missing warp deadlocks, a divergent one is reported.
/// - mma_async needs a wgmma.fence since the kernel start or the last wait_group (stricter than
///   PTX, which asks for it only when the registers were touched in between; CUTLASS fences
///   every batch). Without it the launch fails.
/// - mma_async captures its A registers and its input accumulator when issued, then fills the
///   accumulator registers with a NaN pattern. Operations on the same accumulator chain as on
///   the hardware. The result is written only when a wait_group retires the operation, so
///   reading the accumulator early gives NaN, and writing it while in flight is reported.
/// - Shared-memory operands are read when the operation retires, by the retiring thread: a
///   kernel that overwrites a tile before waiting computes with the new bytes (a wrong result),
///   and TSan sees the read where the hardware may perform it last.
/// - A thread that exits with operations not retired fails the launch.
/// Not modelled: the async proxy (a missing fence.proxy.async passes), base offset != 0 (refused),
/// the hardware's accumulation order (products are summed exactly in double, rounded once).

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "slimserve/config.hpp"
#include "slimserve/emu/scheduler.hpp"
#include "slimserve/emu/tensor_core.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

/// What an accumulator register holds while an operation on it is in flight (a quiet NaN).
inline constexpr std::uint32_t wgmma_in_flight_bits = 0x7FC0FFEEu;

struct WgmmaDescriptor {
  std::uint32_t start = 0;           // bytes
  std::uint32_t leading_offset = 0;  // bytes
  std::uint32_t stride_offset = 0;   // bytes
  unsigned base_offset = 0;
  unsigned swizzle_mode = 0;  // 0 none, 1 128B, 2 64B, 3 32B
};

inline WgmmaDescriptor decode_wgmma_descriptor(std::uint64_t bits) noexcept {
  WgmmaDescriptor d;
  d.start = static_cast<std::uint32_t>(bits & 0x3FFFu) << 4;
  d.leading_offset = static_cast<std::uint32_t>((bits >> 16) & 0x3FFFu) << 4;
  d.stride_offset = static_cast<std::uint32_t>((bits >> 32) & 0x3FFFu) << 4;
  d.base_offset = static_cast<unsigned>((bits >> 49) & 7u);
  d.swizzle_mode = static_cast<unsigned>(bits >> 62);
  return d;
}

/// Bytes of one swizzled row (the swizzle width); 0 without swizzling.
inline unsigned wgmma_swizzle_bytes(unsigned mode) noexcept {
  constexpr unsigned bytes[4] = {0, 128, 64, 32};
  return bytes[mode & 3u];
}

/// Byte offset from the start address of 16-bit element (mn, k) before swizzling.
inline std::uint32_t wgmma_canonical_offset(const WgmmaDescriptor& d, bool mn_major, unsigned mn,
                                            unsigned k) noexcept {
  constexpr unsigned t = 8;  // elements per 16 bytes
  const unsigned row_bytes = wgmma_swizzle_bytes(d.swizzle_mode);
  if (!mn_major) {
    if (row_bytes == 0) {
      return (mn % 8) * 16 + (mn / 8) * d.stride_offset + (k % t) * 2 + (k / t) * d.leading_offset;
    }
    return (mn % 8) * row_bytes + (mn / 8) * d.stride_offset + k * 2;
  }
  if (row_bytes == 0) {
    return (mn % t) * 2 + (mn / t) * d.stride_offset + (k % 8) * 16 + (k / 8) * d.leading_offset;
  }
  const unsigned atom_elements = row_bytes / 2;  // along MN
  return (mn % atom_elements) * 2 + (mn / atom_elements) * d.leading_offset + (k % 8) * row_bytes +
         (k / 8) * d.stride_offset;
}

/// The swizzle modes permute 16-byte chunks within a row by the row's position (address bits
/// 7..) inside the repeating pattern of 256, 512 or 1024 bytes.
inline std::uint32_t wgmma_swizzle(std::uint32_t address, unsigned mode) noexcept {
  constexpr std::uint32_t row_bits[4] = {0, 7, 3, 1};
  return address ^ (((address >> 7) & row_bits[mode & 3u]) << 4);
}

/// Refuses descriptors the emulator cannot reproduce exactly, or that set reserved bits.
inline std::string wgmma_descriptor_problem(std::uint64_t bits, const char* which) {
  constexpr std::uint64_t reserved = (std::uint64_t{3} << 14) | (std::uint64_t{3} << 30) |
                                     (std::uint64_t{7} << 46) | (std::uint64_t{0x3FF} << 52);
  if ((bits & reserved) != 0) {
    return std::string(which) + " descriptor sets reserved bits (0x" +
           [&] {
             char text[20];
             std::snprintf(text, sizeof text, "%016llx",
                           static_cast<unsigned long long>(bits & reserved));
             return std::string(text);
           }() +
           ")";
  }
  const WgmmaDescriptor d = decode_wgmma_descriptor(bits);
  if (d.base_offset != 0) {
    return std::string(which) +
           " descriptor has a non-zero base offset, which the emulator does not model: start "
           "swizzled tiles on their pattern boundary (1024/512/256 bytes)";
  }
  return {};
}

// Issue payload: word 0 descriptor A (0 when A is in registers), 1 descriptor B, 2 flags
// (shape, majors, scale-d, input type), 3-4 the A registers. Result for A in registers: words
// 2q and 2q+1 = the A registers of thread q of the caller's quad (q = 0..3).
inline void combine_wgmma_issue(WarpgroupView& group) {
  for (unsigned i = 1; i < warpgroup_size; ++i) {
    for (int word = 0; word < 3; ++word) {
      if (group.payload(i, word) != group.payload(0, word)) {
        group.fail(i, word == 2 ? "shape, operand majors or scale-d differ from thread 0 of "
                                  "the warpgroup"
                                : "its matrix descriptor differs from thread 0 of the warpgroup");
        return;
      }
    }
  }
  for (unsigned i = 0; i < warpgroup_size; ++i) {
    const unsigned quad_first = i / 4 * 4;
    for (unsigned q = 0; q < 4; ++q) {
      group.set_result(i, static_cast<int>(2 * q), group.payload(quad_first + q, 3));
      group.set_result(i, static_cast<int>(2 * q + 1), group.payload(quad_first + q, 4));
    }
  }
}

// fence / commit / wait: payload word 0 must agree (wait_group's count).
inline void combine_wgmma_uniform(WarpgroupView& group) {
  for (unsigned i = 1; i < warpgroup_size; ++i) {
    if (group.payload(i, 0) != group.payload(0, 0)) {
      group.fail(i, "operand differs from thread 0 of the warpgroup (" +
                        std::to_string(group.payload(i, 0)) + " vs " +
                        std::to_string(group.payload(0, 0)) + ")");
      return;
    }
  }
}

/// Fails the thread with "site: detail", leaving no heap memory owned by this frame or by a
/// temporary (the failed fiber never unwinds, so anything still owned would leak).
[[noreturn]] inline void fail_keeping_nothing(const CallSite& site, std::string& detail) {
  std::string message = format_site(site) + ": ";
  message += detail;
  std::string().swap(detail);
  fail_this_thread(std::move(message));
}

inline void warpgroup_exchange(EmulatedThread& self, WarpgroupCombine combine,
                               const CallSite& site) {
  self.post_site(site);
  relaxed_store(self.warpgroup_combine, combine);
  yield_to_scheduler(self, ThreadState::at_warpgroup_op);
}

inline void wgmma_fence(CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  relaxed_store(self.payload[0], std::uint64_t{0});
  warpgroup_exchange(self, &combine_wgmma_uniform, site);
  self.wgmma.fenced = true;
}

inline void wgmma_commit(CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  relaxed_store(self.payload[0], std::uint64_t{0});
  warpgroup_exchange(self, &combine_wgmma_uniform, site);
  WgmmaQueue& queue = self.wgmma;
  ++queue.committed_groups;
  for (WgmmaOp& op : queue.ops) {
    if (op.group == 0) op.group = queue.committed_groups;
  }
}

/// Element (mn, k) of a shared operand; an error message (and 0) when it lies outside the
/// block's shared memory.
template <MmaInput Input>
inline float wgmma_read_element(const LaunchState& launch, const WgmmaDescriptor& d,
                                bool mn_major, unsigned mn, unsigned k, const char* which,
                                std::string& error) {
  const std::uint32_t address =
      wgmma_swizzle(d.start + wgmma_canonical_offset(d, mn_major, mn, k), d.swizzle_mode);
  if (static_cast<std::size_t>(address) + 2 > launch.dynamic_smem_bytes) {
    if (error.empty()) {
      error = std::string("operand ") + which + " element (" + std::to_string(mn) + ", k " +
              std::to_string(k) + ") at shared address " + std::to_string(address) +
              " lies outside the block's " + std::to_string(launch.dynamic_smem_bytes) +
              " bytes of shared memory";
    }
    return 0.0f;
  }
  std::uint16_t bits;
  std::memcpy(&bits, launch.dynamic_smem + address, sizeof bits);
  return element_to_float<Input>(bits);
}

/// Retires the oldest operation; returns an error message, empty when it went well. (The
/// caller fails the thread only after every local here is destroyed: a failed fiber never
/// unwinds.)
template <MmaInput Input>
inline std::string wgmma_retire_front(EmulatedThread& self) {
  std::string error;
  WgmmaQueue& queue = self.wgmma;
  WgmmaOp op = std::move(queue.ops.front());
  queue.ops.erase(queue.ops.begin());
  const LaunchState& launch = *self.launch;
  const unsigned g = self.lane / 4;
  const unsigned t = self.lane % 4;
  const unsigned row0 = 16 * (self.warp % 4) + g;

  float a[2][16];
  if (op.a_in_registers) {
    for (unsigned h = 0; h < 2; ++h) {
      for (unsigned k = 0; k < 16; ++k) a[h][k] = element_to_float<Input>(op.a_rows[h][k]);
    }
  } else {
    const WgmmaDescriptor da = decode_wgmma_descriptor(op.desc_a);
    for (unsigned h = 0; h < 2; ++h) {
      for (unsigned k = 0; k < 16; ++k) {
        a[h][k] = wgmma_read_element<Input>(launch, da, op.a_mn_major, row0 + 8 * h, k, "A", error);
      }
    }
  }
  const WgmmaDescriptor db = decode_wgmma_descriptor(op.desc_b);
  const unsigned registers = op.n / 2;
  std::vector<float> value(registers);
  float b[2][16];  // the two columns 2t, 2t+1 of the current 8-column block
  for (unsigned i = 0; i < registers; ++i) {
    const unsigned col = 8 * (i / 4) + 2 * t + i % 2;
    if (i % 4 == 0) {
      for (unsigned c = 0; c < 2; ++c) {
        for (unsigned k = 0; k < 16; ++k) {
          b[c][k] = wgmma_read_element<Input>(launch, db, op.b_mn_major, col + c, k, "B", error);
        }
      }
    }
    const unsigned h = (i / 2) % 2;
    // Products of 16-bit floats are exact in double; one rounding at the end.
    double sum = op.scale_d ? static_cast<double>(op.c[i]) : 0.0;
    for (unsigned k = 0; k < 16; ++k) sum += static_cast<double>(a[h][k]) * b[i % 2][k];
    value[i] = static_cast<float>(sum);
  }
  if (!error.empty()) return error;
  // A later operation on the same accumulator takes this result as its input; only the last
  // one in flight writes the registers.
  for (WgmmaOp& later : queue.ops) {
    if (later.accumulator == op.accumulator) {
      later.c = std::move(value);
      later.has_c = true;
      return error;
    }
  }
  for (unsigned i = 0; i < registers; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, &op.accumulator[i], sizeof bits);
    if (bits != wgmma_in_flight_bits) {
      return "accumulator register " + std::to_string(i) +
             " was written while a wgmma.mma_async on it was in flight (wait with "
             "wgmma.wait_group before touching the accumulator)";
    }
  }
  std::memcpy(op.accumulator, value.data(), registers * sizeof(float));
  return error;
}

inline void wgmma_wait(int pending, CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  relaxed_store(self.payload[0], static_cast<std::uint64_t>(pending));
  warpgroup_exchange(self, &combine_wgmma_uniform, site);
  WgmmaQueue& queue = self.wgmma;
  const auto allowed = static_cast<std::uint64_t>(pending < 0 ? 0 : pending);
  while (queue.committed_groups - queue.completed_groups > allowed) {
    ++queue.completed_groups;
    while (!queue.ops.empty() && queue.ops.front().group == queue.completed_groups) {
      std::string error = queue.ops.front().input == static_cast<unsigned>(MmaInput::bf16)
                              ? wgmma_retire_front<MmaInput::bf16>(self)
                              : wgmma_retire_front<MmaInput::fp16>(self);
      if (!error.empty()) fail_keeping_nothing(site, error);
    }
  }
  queue.fenced = false;  // the program may now touch the registers: fence before the next batch
}

/// One thread's part of wgmma.mma_async. `a_registers` is null when A comes from `desc_a`.
template <MmaInput Input>
inline void wgmma_mma_async(float* accumulator, unsigned n, const std::uint32_t* a_registers,
                            std::uint64_t desc_a, std::uint64_t desc_b, bool a_mn_major,
                            bool b_mn_major, bool scale_d, CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  WgmmaQueue& queue = self.wgmma;
  if (!queue.fenced) {
    fail_this_thread(format_site(site) +
                     ": wgmma.mma_async without a wgmma.fence since the kernel started or since "
                     "the last wgmma.wait_group (accumulator and A registers are not ordered "
                     "with the warpgroup's other register accesses)");
  }
  {
    std::string problem = wgmma_descriptor_problem(desc_b, "B");
    if (problem.empty() && a_registers == nullptr) problem = wgmma_descriptor_problem(desc_a, "A");
    if (!problem.empty()) fail_keeping_nothing(site, problem);
  }
  const unsigned registers = n / 2;
  for (const WgmmaOp& other : queue.ops) {
    const bool overlaps = other.accumulator < accumulator + registers &&
                          accumulator < other.accumulator + other.n / 2;
    if (overlaps && (other.accumulator != accumulator || other.n != n)) {
      fail_this_thread(format_site(site) +
                       ": accumulator overlaps an in-flight wgmma.mma_async of another shape or "
                       "offset (only identical accumulators chain without a fence)");
    }
  }

  std::uint32_t a[4] = {};
  if (a_registers != nullptr) std::memcpy(a, a_registers, sizeof a);
  const std::uint64_t flags = n | std::uint64_t{a_mn_major} << 16 |
                              std::uint64_t{b_mn_major} << 17 | std::uint64_t{scale_d} << 18 |
                              std::uint64_t{a_registers != nullptr} << 19 |
                              std::uint64_t{static_cast<unsigned>(Input)} << 20;
  relaxed_store(self.payload[0], a_registers != nullptr ? 0 : desc_a);
  relaxed_store(self.payload[1], desc_b);
  relaxed_store(self.payload[2], flags);
  relaxed_store(self.payload[3], a[0] | std::uint64_t{a[1]} << 32);
  relaxed_store(self.payload[4], a[2] | std::uint64_t{a[3]} << 32);
  warpgroup_exchange(self, &combine_wgmma_issue, site);

  WgmmaOp op;
  op.accumulator = accumulator;
  op.n = n;
  op.input = static_cast<unsigned>(Input);
  op.a_in_registers = a_registers != nullptr;
  op.a_mn_major = a_mn_major;
  op.b_mn_major = b_mn_major;
  op.scale_d = scale_d;
  op.desc_a = desc_a;
  op.desc_b = desc_b;
  if (op.a_in_registers) {
    for (unsigned q = 0; q < 4; ++q) {  // thread t = q of the quad holds columns 2q, 2q+1, +8
      const std::uint64_t words[2] = {relaxed_load(self.result[2 * q]),
                                      relaxed_load(self.result[2 * q + 1])};
      for (unsigned i = 0; i < 8; ++i) {
        const auto half = static_cast<std::uint16_t>(words[i / 4] >> (16 * (i % 4)));
        op.a_rows[(i / 2) % 2][2 * q + i % 2 + 8 * (i / 4)] = half;
      }
    }
  }
  bool chained = false;
  for (const WgmmaOp& other : queue.ops) chained = chained || other.accumulator == accumulator;
  if (!chained && scale_d) {
    op.c.assign(accumulator, accumulator + registers);
    op.has_c = true;
  }
  for (unsigned i = 0; i < registers; ++i) {
    std::memcpy(&accumulator[i], &wgmma_in_flight_bits, sizeof(float));
  }
  queue.ops.push_back(std::move(op));
}

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END
