#pragma once
/// \file
/// \brief The head dims each attention kernel family is instantiated for, as typed lists: the
/// dispatch tables are generated from them and the preflights consult them, so adding a
/// head_dim to a family is one edit here. Plain C++ (no CUDA header).

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

/// The CUDA-core decode kernel (a head vector is a power-of-two group of lanes, its dot
/// products butterflies): paged attention serves the other head dims of PagedHeadDims, and
/// the plan never picks the CUDA-core kernel for them.
using VectorKernelHeadDims = HeadDimList<64, 128, 256>;

/// The warpgroup-MMA (wgmma) prefill kernel (kernels/paged_prefill_wgmma_kernel.cuh): head
/// dims of whole 128-byte swizzle atoms whose O accumulator fits one m64nD (D <= 256). A
/// subset of PagedHeadDims; the plan keeps the mma.sync kernel for the others.
using PagedWgmmaHeadDims = HeadDimList<128>;

}  // namespace attention
SLIMSERVE_NAMESPACE_END
