#pragma once
/// \file
/// \brief Warp-synchronous operations: __shfl*_sync, votes, __syncwarp, __reduce*_sync.
///
/// Each lane posts its value and waits; when every lane named by the mask has arrived, the
/// scheduler computes all results at once, so no lane can overwrite a value before the others
/// read it. Checked: the caller is in its mask, the mask names only live lanes of the warp,
/// a shuffle reads only lanes in the mask, and all lanes of a mask are in the same operation.

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "slimserve/config.hpp"
#include "slimserve/emu/scheduler.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace emu::detail {

/// Posts this lane's payload (already stored) and waits for the whole mask.
inline void warp_exchange(EmulatedThread& self, unsigned mask, WarpCombine combine,
                          const CallSite& site) {
  self.post_site(site);
  relaxed_store(self.warp_mask, mask);
  relaxed_store(self.combine, combine);
  yield_to_scheduler(self, ThreadState::at_warp_op);
}

template <class T>
inline std::uint64_t to_bits(const T& value) noexcept {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                "warp shuffles move values of at most 8 bytes");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}
template <class T>
inline T from_bits(std::uint64_t bits) noexcept {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

// Shuffle payload: word 0 the value, word 1 the source lane (own lane when out of range).
inline void combine_shuffle(WarpGroup& group) {
  for (unsigned lane = 0; lane < warp_size; ++lane) {
    if (!group.contains(lane)) continue;
    const auto source = static_cast<unsigned>(group.payload(lane, 1));
    if (!group.contains(source)) {
      group.fail(lane, "reads lane " + std::to_string(source) + ", which is not in the mask " +
                           format_mask(group.mask()));
      return;
    }
    group.set_result(lane, 0, group.payload(source, 0));
  }
}

inline bool valid_width(int width) noexcept {
  return width >= 1 && width <= 32 && std::has_single_bit(static_cast<unsigned>(width));
}

template <class T>
inline T shuffle(unsigned mask, T value, int width, CallSite site,
                 unsigned (*source_of)(unsigned lane, unsigned width, int operand), int operand) {
  EmulatedThread& self = this_thread(site.what);
  if (!valid_width(width)) {
    fail_this_thread(format_site(site) + ": width " + std::to_string(width) +
                     " is not a power of two in [1, 32]");
  }
  relaxed_store(self.payload[0], to_bits(value));
  relaxed_store(self.payload[1],
                std::uint64_t{source_of(self.lane, static_cast<unsigned>(width), operand)});
  warp_exchange(self, mask, &combine_shuffle, site);
  return from_bits<T>(relaxed_load(self.result[0]));
}

// Source lanes, as the CUDA programming guide defines them for a sub-warp `width`.
inline unsigned source_idx(unsigned lane, unsigned width, int source) {
  return (lane & ~(width - 1)) + (static_cast<unsigned>(source) & (width - 1));
}
inline unsigned source_up(unsigned lane, unsigned width, int delta) {
  const auto d = static_cast<unsigned>(delta);
  return (lane & (width - 1)) >= d ? lane - d : lane;
}
inline unsigned source_down(unsigned lane, unsigned width, int delta) {
  const auto d = static_cast<unsigned>(delta);
  return (lane & (width - 1)) + d < width ? lane + d : lane;
}
inline unsigned source_xor(unsigned lane, unsigned width, int lane_mask) {
  const unsigned source = lane ^ static_cast<unsigned>(lane_mask);
  return source <= (lane | (width - 1)) ? source : lane;  // later groups: own value
}

// Vote payload: word 0 the predicate (0 or 1). Result: the ballot.
inline void combine_ballot(WarpGroup& group) {
  std::uint64_t ballot = 0;
  for (unsigned lane = 0; lane < warp_size; ++lane) {
    if (group.contains(lane) && group.payload(lane, 0) != 0) ballot |= std::uint64_t{1} << lane;
  }
  for (unsigned lane = 0; lane < warp_size; ++lane) {
    if (group.contains(lane)) group.set_result(lane, 0, ballot);
  }
}

inline unsigned ballot(unsigned mask, int predicate, CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  relaxed_store(self.payload[0], std::uint64_t{predicate != 0 ? 1u : 0u});
  warp_exchange(self, mask, &combine_ballot, site);
  return static_cast<unsigned>(relaxed_load(self.result[0]));
}

inline void combine_nothing(WarpGroup&) {}

inline void sync_warp(unsigned mask, CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  // __syncwarp orders memory among the participating lanes.
  tsan_release(&self.warp_state->sync_object);
  warp_exchange(self, mask, &combine_nothing, site);
  tsan_acquire(&self.warp_state->sync_object);
}

enum class ReduceOp { add, min, max, bit_and, bit_or, bit_xor };

template <ReduceOp Op, class T>
inline void combine_reduce(WarpGroup& group) {
  bool first = true;
  T total{};
  for (unsigned lane = 0; lane < warp_size; ++lane) {
    if (!group.contains(lane)) continue;
    const T value = from_bits<T>(group.payload(lane, 0));
    if (first) {
      total = value;
      first = false;
      continue;
    }
    if constexpr (Op == ReduceOp::add) total = static_cast<T>(total + value);
    if constexpr (Op == ReduceOp::min) total = value < total ? value : total;
    if constexpr (Op == ReduceOp::max) total = value > total ? value : total;
    if constexpr (Op == ReduceOp::bit_and) total = static_cast<T>(total & value);
    if constexpr (Op == ReduceOp::bit_or) total = static_cast<T>(total | value);
    if constexpr (Op == ReduceOp::bit_xor) total = static_cast<T>(total ^ value);
  }
  for (unsigned lane = 0; lane < warp_size; ++lane) {
    if (group.contains(lane)) group.set_result(lane, 0, to_bits(total));
  }
}

template <ReduceOp Op, class T>
inline T reduce(unsigned mask, T value, CallSite site) {
  EmulatedThread& self = this_thread(site.what);
  relaxed_store(self.payload[0], to_bits(value));
  warp_exchange(self, mask, &combine_reduce<Op, T>, site);
  return from_bits<T>(relaxed_load(self.result[0]));
}

// __match_any_sync: lanes whose value equals mine.
inline void combine_match_any(WarpGroup& group) {
  for (unsigned lane = 0; lane < warp_size; ++lane) {
    if (!group.contains(lane)) continue;
    std::uint64_t same = 0;
    for (unsigned other = 0; other < warp_size; ++other) {
      if (group.contains(other) && group.payload(other, 0) == group.payload(lane, 0)) {
        same |= std::uint64_t{1} << other;
      }
    }
    group.set_result(lane, 0, same);
  }
}

}  // namespace emu::detail
SLIMSERVE_NAMESPACE_END

#define SLIMSERVE_EMU_SITE(name) \
  ::slimserve::emu::detail::CallSite { name, file, line }

template <class T>
inline T __shfl_sync(unsigned mask, T value, int source_lane, int width = 32,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::slimserve::emu::detail::shuffle(mask, value, width, SLIMSERVE_EMU_SITE("__shfl_sync"),
                                           &::slimserve::emu::detail::source_idx, source_lane);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32,
                        const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::slimserve::emu::detail::shuffle(mask, value, width,
                                           SLIMSERVE_EMU_SITE("__shfl_up_sync"),
                                           &::slimserve::emu::detail::source_up,
                                           static_cast<int>(delta));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32,
                          const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::slimserve::emu::detail::shuffle(mask, value, width,
                                           SLIMSERVE_EMU_SITE("__shfl_down_sync"),
                                           &::slimserve::emu::detail::source_down,
                                           static_cast<int>(delta));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32,
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return ::slimserve::emu::detail::shuffle(mask, value, width,
                                           SLIMSERVE_EMU_SITE("__shfl_xor_sync"),
                                           &::slimserve::emu::detail::source_xor, lane_mask);
}

inline unsigned __ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return ::slimserve::emu::detail::ballot(mask, predicate, SLIMSERVE_EMU_SITE("__ballot_sync"));
}
inline int __any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return ::slimserve::emu::detail::ballot(mask, predicate, SLIMSERVE_EMU_SITE("__any_sync")) != 0;
}
inline int __all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return ::slimserve::emu::detail::ballot(mask, predicate, SLIMSERVE_EMU_SITE("__all_sync")) ==
         mask;
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  ::slimserve::emu::detail::sync_warp(mask, SLIMSERVE_EMU_SITE("__syncwarp"));
}
/// The lanes of the caller's warp that exist and have not exited.
inline unsigned __activemask() {
  auto& self = ::slimserve::emu::detail::this_thread("__activemask");
  return ::slimserve::emu::detail::relaxed_load(self.warp_state->present) &
         ~::slimserve::emu::detail::relaxed_load(self.warp_state->exited);
}
inline unsigned __lanemask_lt() {
  return (1u << ::slimserve::emu::detail::this_thread("__lanemask_lt").lane) - 1u;
}

#define SLIMSERVE_EMU_REDUCE(name, op, T)                                                   \
  inline T name(unsigned mask, T value, const char* file = __builtin_FILE(),                \
                int line = __builtin_LINE()) {                                              \
    return ::slimserve::emu::detail::reduce<::slimserve::emu::detail::ReduceOp::op, T>(     \
        mask, value, SLIMSERVE_EMU_SITE(#name));                                            \
  }
SLIMSERVE_EMU_REDUCE(__reduce_add_sync, add, unsigned)
SLIMSERVE_EMU_REDUCE(__reduce_add_sync, add, int)
SLIMSERVE_EMU_REDUCE(__reduce_min_sync, min, unsigned)
SLIMSERVE_EMU_REDUCE(__reduce_min_sync, min, int)
SLIMSERVE_EMU_REDUCE(__reduce_max_sync, max, unsigned)
SLIMSERVE_EMU_REDUCE(__reduce_max_sync, max, int)
SLIMSERVE_EMU_REDUCE(__reduce_and_sync, bit_and, unsigned)
SLIMSERVE_EMU_REDUCE(__reduce_or_sync, bit_or, unsigned)
SLIMSERVE_EMU_REDUCE(__reduce_xor_sync, bit_xor, unsigned)
#undef SLIMSERVE_EMU_REDUCE

template <class T>
inline unsigned __match_any_sync(unsigned mask, T value, const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
  auto& self = ::slimserve::emu::detail::this_thread("__match_any_sync");
  ::slimserve::emu::detail::relaxed_store(self.payload[0],
                                          ::slimserve::emu::detail::to_bits(value));
  ::slimserve::emu::detail::warp_exchange(self, mask,
                                          &::slimserve::emu::detail::combine_match_any,
                                          SLIMSERVE_EMU_SITE("__match_any_sync"));
  return static_cast<unsigned>(::slimserve::emu::detail::relaxed_load(self.result[0]));
}
