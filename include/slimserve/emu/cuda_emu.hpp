#pragma once
/// \file
/// \brief The CPU kernel emulator: standard CUDA kernel source compiled by g++/clang++.
///
/// One fiber per CUDA thread, one block at a time; a fiber runs until it blocks at a barrier
/// or a warp operation. See docs/emulator.md for what it checks and what it cannot.
///
/// Pieces: qualifiers (first, before any CUDA header), vector types, fibers, the scheduler,
/// built-ins and barriers, warp operations, atomics, intrinsics, the launcher.

#include "slimserve/emu/qualifiers.hpp"  // must come first
#include "slimserve/emu/vector_types.hpp"

#include "slimserve/emu/atomics.hpp"
#include "slimserve/emu/builtins.hpp"
#include "slimserve/emu/intrinsics.hpp"
#include "slimserve/emu/launch.hpp"
#include "slimserve/emu/warp_ops.hpp"

// cudaStream_t exists so that host code can pass streams around; the emulator has one
// synchronous stream.
struct CUstream_st;
using cudaStream_t = CUstream_st*;
