#pragma once
/// \file
/// \brief Names the CUDA stream type without including a CUDA header, so every host façade
/// (kv, attention, int4, the runtime's memory calls) stays plain C++ that g++/clang compile
/// without the CUDA toolkit's headers.
///
/// This is the declaration the CUDA runtime itself makes (`typedef struct CUstream_st*
/// cudaStream_t`) and the one the CPU emulator makes, so it agrees with both when a CUDA or
/// emulator header is also included.

struct CUstream_st;
using cudaStream_t = CUstream_st*;
