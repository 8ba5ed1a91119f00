#pragma once
/// \file
/// \brief slimserve's version, as macros (for the preprocessor) and as a constexpr value.

#include "slimserve/detail/version_numbers.hpp"
#include "slimserve/config.hpp"

/// MAJOR * 10000 + MINOR * 100 + PATCH, for `#if SLIMSERVE_VERSION >= 100` style checks.
#define SLIMSERVE_VERSION \
  (SLIMSERVE_VERSION_MAJOR * 10000 + SLIMSERVE_VERSION_MINOR * 100 + SLIMSERVE_VERSION_PATCH)

SLIMSERVE_NAMESPACE_BEGIN

struct Version {
  int major;
  int minor;
  int patch;
};

inline constexpr Version version{SLIMSERVE_VERSION_MAJOR, SLIMSERVE_VERSION_MINOR,
                                 SLIMSERVE_VERSION_PATCH};
inline constexpr int version_number = SLIMSERVE_VERSION;

/// The version of the compiled library that was linked (compare with `version`).
Version linked_version() noexcept;

SLIMSERVE_NAMESPACE_END
