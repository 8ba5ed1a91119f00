#pragma once
// Test randomness: a fresh seed per run (printed, so a failure can be replayed with
// SLIMSERVE_TEST_SEED=<seed>), never all-zero data.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace slimserve_test {

inline std::uint64_t test_seed() {
  static const std::uint64_t seed = [] {
    if (const char* fixed = std::getenv("SLIMSERVE_TEST_SEED")) {
      return static_cast<std::uint64_t>(std::strtoull(fixed, nullptr, 0));
    }
    std::uint64_t fresh = std::random_device{}();
    fresh = (fresh << 32) ^ std::random_device{}();
    return fresh;
  }();
  static const bool printed = [] {
    std::printf("slimserve test seed: SLIMSERVE_TEST_SEED=%llu\n",
                static_cast<unsigned long long>(seed));
    return true;
  }();
  (void)printed;
  return seed;
}

/// A generator seeded from the run's seed and a per-use salt (so tests stay independent).
inline std::mt19937_64 make_rng(std::uint64_t salt) {
  return std::mt19937_64(test_seed() ^ (salt * 0x9E3779B97F4A7C15ull));
}

}  // namespace slimserve_test
