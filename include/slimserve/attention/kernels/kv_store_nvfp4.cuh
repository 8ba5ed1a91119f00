#pragma once
/// \file
/// \brief The page store of an NVFP4 cache (kv_store.cuh's store_head_vectors for
/// KvT = nvfp4): quantize one K and one V head vector and write codes and block scales.
///
/// The lane group holds a head vector 8 elements a lane (kv_store.cuh), so the lane pair
/// (2b, 2b+1) holds block b: nvfp4_quantize_lane agrees on the block's amax with one shuffle
/// and codes the lane's 8 elements into one 32-bit word against the block scale computed on
/// the fly from that amax and the per-tensor scale (read through its device pointer; an
/// NVFP4 view always has one, validate_cache_view). Head vector `i` of a page array is
/// head_vector_bytes bytes at byte i * head_vector_bytes of its page (pages page_stride bytes
/// apart, or packed): lane l's word at byte 4 l, the scale of block b at byte head_dim / 2 + b,
/// stored by the pair's even lane.

#include <cstdint>

#include "slimserve/attention/kernels/kv_rotate.cuh"
#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/formats/nvfp4.hpp"
#include "slimserve/formats/nvfp4_quantize.cuh"
#include "slimserve/runtime/platform.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// store_head_vectors for an NVFP4 cache; same contract (every thread of the warp calls it).
/// Target: kv_store.cuh's PageStoreTarget. `Rotation`: rotated before the block amax.
template <class InT, int HeadDim, int ActiveLanes, KvRotation Rotation = KvRotation::none, class Target>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void store_nvfp4_head_vectors(const Target& target, const InT* k_row,
                                                                     const InT* v_row, int lane, bool store,
                                                                     std::int32_t page, std::int32_t slot,
                                                                     std::int32_t head) {
  static_assert(HeadDim % nvfp4_block_elements == 0, "whole 16-element blocks");
  constexpr int vector_bytes = HeadDim / 2 + HeadDim / nvfp4_block_elements;
  static_assert(vector_bytes % 4 == 0, "4-byte code words (validate_cache_view refuses head_dim 96)");
  const bool active = store && lane < ActiveLanes;
  float k[8] = {}, v[8] = {};
  if (active) {
    const Vec16 kv = load16(k_row + lane * 8);
    const Vec16 vv = load16(v_row + lane * 8);
SLIMSERVE_ATTENTION_UNROLL
    for (int i = 0; i < 8; ++i) {
      k[i] = element_to_float<InT>(kv, i);
      v[i] = element_to_float<InT>(vv, i);
    }
  }
  rotate_loaded_head_vectors<Rotation, HeadDim>(k, v);
  // Every lane takes part in the pair shuffle; inactive lanes (zeros) pair among themselves
  // (ActiveLanes is even: HeadDim is a multiple of 16).
  const Nvfp4LaneCodes kc = nvfp4_quantize_lane(k, *target.k_scale);
  const Nvfp4LaneCodes vc = nvfp4_quantize_lane(v, *target.v_scale);
  if (!active) return;
  // Pages are page_stride bytes apart (a combined K/V allocation: twice a page), or packed.
  const std::int64_t page_bytes = target.page_stride != 0
                                      ? target.page_stride
                                      : static_cast<std::int64_t>(target.page_size) * target.num_kv_heads * vector_bytes;
  const std::int64_t vector_in_page = cache_offset(target.layout, target.page_size, target.num_kv_heads, 1, 0, slot, head, 0);
  const std::int64_t offset = page * page_bytes + vector_in_page * vector_bytes;
  std::uint8_t* k_vector = static_cast<std::uint8_t*>(target.k_pages) + offset;
  std::uint8_t* v_vector = static_cast<std::uint8_t*>(target.v_pages) + offset;
  *reinterpret_cast<std::uint32_t*>(k_vector + 4 * lane) = kc.codes;
  *reinterpret_cast<std::uint32_t*>(v_vector + 4 * lane) = vc.codes;
  if (lane % 2 == 0) {
    k_vector[HeadDim / 2 + lane / 2] = kc.scale.bits;
    v_vector[HeadDim / 2 + lane / 2] = vc.scale.bits;
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
