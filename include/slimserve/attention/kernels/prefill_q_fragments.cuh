#pragma once
/// \file
/// \brief The query rows of a wgmma prefill warpgroup as A fragments in registers, loaded
/// once per work item (paged_prefill_wgmma_kernel, paged_prefill_pingpong_kernel).
///
/// Warp w of the warpgroup holds rows 16 w + g and 16 w + g + 8 (lane = 4 g + t); register r
/// of k step s holds columns 16 s + 8 (r / 2) + 2 t and + 1 of row half r % 2: two adjacent
/// elements, so each register is one 32-bit load (the run preflight makes q and its rows
/// 16-byte aligned), where loading the elements one by one took two 16-bit loads, two
/// conversions to FP32 and a pack.

#include <cstdint>
#include <type_traits>

#include "slimserve/arch/satfinite_pack.cuh"
#include "slimserve/attention/kernels/vector_io.cuh"
#include "slimserve/formats/packed.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

/// q_frag[s][r] for the thread's two rows; `row_base[half]`: the row's first element in q
/// (elements of QT), `row_valid[half]` false: a padding row, zeros (not read).
/// QT == MmaT: the pair's bits as they are. Otherwise (BF16 queries on an FP8 cache's fp16
/// operands) both elements through FP32 into one cvt.rn.satfinite (arch::pack_satfinite):
/// rounded to nearest even, saturated to MmaT's range, NaN kept NaN.
template <class QT, class MmaT, int KSteps>
SLIMSERVE_DEVICE SLIMSERVE_FORCEINLINE void load_prefill_q_fragments(const QT* q, const std::int64_t (&row_base)[2],
                                                                     const bool (&row_valid)[2], int t,
                                                                     std::uint32_t (&q_frag)[KSteps][4]) {
SLIMSERVE_ATTENTION_UNROLL
  for (int s = 0; s < KSteps; ++s) {
SLIMSERVE_ATTENTION_UNROLL
    for (int r = 0; r < 4; ++r) {
      const int half = r % 2;
      std::uint32_t pair = 0;
      if (row_valid[half]) {
        pair = load4(q + row_base[half] + 16 * s + 8 * (r / 2) + 2 * t);
        if constexpr (!std::is_same_v<QT, MmaT>) {
          const f32x2 v = to_float2<QT>(pair);
          pair = arch::pack_satfinite<MmaT>(v.x, v.y);
        }
      }
      q_frag[s][r] = pair;
    }
  }
}

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
