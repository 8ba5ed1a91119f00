#pragma once
// Reads the golden tables written by gen_golden.py (raw little-endian arrays) from the
// directory the build passes in SLIMSERVE_GOLDEN_DIR.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

namespace slimserve_test {

template <class T>
std::vector<T> load_golden(const std::string& name) {
  const std::string path = (std::filesystem::path(SLIMSERVE_GOLDEN_DIR) / name).string();
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  INFO("golden table " << path << " (regenerate with tests/formats/gen_golden.py)");
  REQUIRE(file.good());
  const auto bytes = static_cast<std::size_t>(file.tellg());
  REQUIRE(bytes % sizeof(T) == 0);
  std::vector<T> values(bytes / sizeof(T));
  file.seekg(0);
  // Raw little-endian values (every supported host is little-endian).
  file.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(bytes));
  REQUIRE(file.good());
  return values;
}

inline float float_of(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline bool is_nan_bits(std::uint32_t f32_bits) { return (f32_bits & 0x7FFFFFFFu) > 0x7F800000u; }

}  // namespace slimserve_test
