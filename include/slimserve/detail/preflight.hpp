#pragma once
/// \file
/// \brief Host preflight checks that several components' `can_implement` share: pointer
/// alignment for the kernels' 16-byte accesses, and token row strides of activations read in
/// 16-byte pieces. Internal, in namespace preflight (the .cu files of attention and kv
/// include it).

#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace preflight {

/// The kernels load and store 16 bytes at a time (cp.async, vector loads, stores).
inline bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

/// A token row stride (elements) of an activation a kernel reads in 16-byte pieces: 0 (packed)
/// or a multiple of 8 elements of at least one row, so that rows never overlap. `op` and
/// `name` go into the message, `row` says what a row is (e.g. "num_kv_heads x head_dim").
inline Status check_row_stride(std::int64_t stride, const char* op, const char* name,
                               std::int64_t row_elements, const char* row) {
  if (stride == 0 || (stride >= row_elements && stride % 8 == 0)) return {};
  return make_status(StatusCode::invalid_argument, op, ": ", name, " ", stride,
                     " must be 0 (packed) or a multiple of 8 elements of at least one row (", row, " = ",
                     row_elements, ")");
}

}  // namespace preflight
SLIMSERVE_NAMESPACE_END
