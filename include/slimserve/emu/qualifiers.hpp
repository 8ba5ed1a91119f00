#pragma once
/// \file
/// \brief CUDA qualifiers and attributes for plain g++/clang++ (the CPU kernel emulator).
///
/// Included before anything else: CUDA's own headers (cuda_bf16.h, cuda_fp8.h) define these
/// only when they are missing, so the emulator's definitions must come first.

#if defined(__CUDACC__)
#error "the CPU kernel emulator is for plain C++ compilers; nvcc uses the CUDA runtime"
#endif

#ifndef __global__
#define __global__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __host__
#define __host__
#endif
#ifndef __forceinline__
#define __forceinline__ __inline__ __attribute__((always_inline))
#endif
// __noinline__ is left alone: system headers spell __attribute__((__noinline__)).
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __grid_constant__
#define __grid_constant__
#endif
#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif
// One block runs at a time, so a function-local or namespace-scope static is the block's
// shared memory. Dynamic shared memory goes through rt::dynamic_shared_memory() instead.
#ifndef __shared__
#define __shared__ static
#endif
#ifndef __constant__
#define __constant__
#endif
#ifndef __managed__
#define __managed__
#endif
// __restrict__ is a g++/clang++ keyword already.
