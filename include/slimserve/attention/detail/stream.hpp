#pragma once
/// \file
/// \brief Names the CUDA stream type without including a CUDA header, so the host-side
/// attention API stays plain C++. The same declaration the CUDA runtime (and the CPU
/// emulator) makes: an opaque pointer.

struct CUstream_st;
using cudaStream_t = CUstream_st*;
