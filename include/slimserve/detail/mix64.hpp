#pragma once
/// \file
/// \brief mix64: the library's one 64-bit finalizer (xor-shift / multiply, every input bit
/// reaching every output bit), on the host and the device. Internal: the records' checksum
/// terms (kv/page_movement.hpp, part of the export format: its constants never change) and
/// the prefix cache's chained page hash use it.

#include <cstdint>

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace detail {

SLIMSERVE_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

}  // namespace detail
SLIMSERVE_NAMESPACE_END
