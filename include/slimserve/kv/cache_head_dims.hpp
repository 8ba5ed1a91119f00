#pragma once
/// \file
/// \brief The head dims of the paged K/V cache, as a typed list (`PagedHeadDims`), and the list
/// template every kernel family's head dims use (`HeadDimList`). Here, in kv/, because the cache
/// views check them; the per-kernel-family lists are in attention/head_dims.hpp. Plain C++.

#include <cstddef>
#include <string>

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

template <int... Dims>
struct HeadDimList {
  static constexpr std::size_t size = sizeof...(Dims);
  static constexpr bool contains(int head_dim) noexcept { return ((head_dim == Dims) || ...); }
  /// f.template operator()<D>() for each D, in order.
  template <class F>
  static constexpr void for_each(F&& f) {
    (f.template operator()<Dims>(), ...);
  }
  /// "64, 96, 128" for error messages.
  static std::string describe() {
    std::string text;
    ((text += (text.empty() ? "" : ", ") + std::to_string(Dims)), ...);
    return text;
  }
};

/// The paged K/V cache and every kernel that reads or writes it by head vector: tensor-core
/// paged attention (prefill, fused prefill, decode, verify), append_kv and dequantize_pages.
/// Rows of any even number of 16-byte chunks are swizzled (kernels/mma_fragments.cuh), and the
/// cache writers pad a head vector's lanes to a power of two (kernels/kv_store.cuh), so 96
/// and 192 work.
using PagedHeadDims = HeadDimList<64, 96, 128, 192, 256>;

}  // namespace attention
SLIMSERVE_NAMESPACE_END
