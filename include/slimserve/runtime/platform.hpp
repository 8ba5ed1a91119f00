#pragma once
/// \file
/// \brief Selects the execution platform for kernel code: the CUDA runtime under nvcc, the
/// CPU kernel emulator when SLIMSERVE_EMULATE is defined (plain g++/clang++).
///
/// Kernel headers include this instead of <cuda_runtime.h>. Headers that need no device
/// (numeric formats on the host, the page allocator) do not include it, so they compile with
/// any C++20 compiler.

#include "slimserve/config.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#define SLIMSERVE_PLATFORM_CUDA 1
#elif defined(SLIMSERVE_EMULATE)
#include "slimserve/emu/cuda_emu.hpp"
#define SLIMSERVE_PLATFORM_EMULATOR 1
#else
#error "slimserve kernel headers need nvcc, or -DSLIMSERVE_EMULATE to run them on the CPU emulator"
#endif
