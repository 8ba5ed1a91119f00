#pragma once
/// \file
/// \brief Compiler glue shared by every slimserve header: host/device qualifiers and the
/// versioned namespace.
///
/// Symbol isolation: every slimserve symbol lives in an inline namespace named after the
/// version (and, for CPU-emulated builds, the emulator), so two copies of slimserve linked
/// into one engine (say, one inside a plugin) cannot collide, the way CUB isolates itself.
/// Engines that need a private copy can additionally wrap everything in their own namespace
/// by defining SLIMSERVE_WRAPPED_NAMESPACE.

#include "slimserve/detail/version_numbers.hpp"

#if defined(__CUDACC__)
#define SLIMSERVE_HOST_DEVICE __host__ __device__
#define SLIMSERVE_DEVICE __device__
#define SLIMSERVE_FORCEINLINE __forceinline__
#else
#define SLIMSERVE_HOST_DEVICE
#define SLIMSERVE_DEVICE
#define SLIMSERVE_FORCEINLINE inline __attribute__((always_inline))
#endif

#define SLIMSERVE_PP_CAT_(a, b) a##b
#define SLIMSERVE_PP_CAT(a, b) SLIMSERVE_PP_CAT_(a, b)
#define SLIMSERVE_PP_CAT3(a, b, c) SLIMSERVE_PP_CAT(SLIMSERVE_PP_CAT(a, b), c)

#if defined(SLIMSERVE_EMULATE)
#define SLIMSERVE_ABI_TAG                                                                  \
  SLIMSERVE_PP_CAT(SLIMSERVE_PP_CAT3(v, SLIMSERVE_VERSION_MAJOR, _),                       \
                   SLIMSERVE_PP_CAT3(SLIMSERVE_VERSION_MINOR, _emu, ))
#else
#define SLIMSERVE_ABI_TAG                                                                  \
  SLIMSERVE_PP_CAT(SLIMSERVE_PP_CAT3(v, SLIMSERVE_VERSION_MAJOR, _), SLIMSERVE_VERSION_MINOR)
#endif

#if defined(SLIMSERVE_WRAPPED_NAMESPACE)
#define SLIMSERVE_NAMESPACE_BEGIN \
  namespace SLIMSERVE_WRAPPED_NAMESPACE { namespace slimserve { inline namespace SLIMSERVE_ABI_TAG {
#define SLIMSERVE_NAMESPACE_END }}}
#else
#define SLIMSERVE_NAMESPACE_BEGIN namespace slimserve { inline namespace SLIMSERVE_ABI_TAG {
#define SLIMSERVE_NAMESPACE_END }}
#endif
