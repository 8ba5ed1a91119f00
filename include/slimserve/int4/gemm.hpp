#pragma once
/// \file
/// \brief W4A16 GEMM façade: C[M,N] = A[M,K] . dequant(W)[K,N] (+ bias).
///
/// Host-only header (no CUDA includes). Usage, CUTLASS-style and CUDA-graph friendly (plan on
/// the host once per shape, run on a stream as often as needed):
///
///     int4::GemmArguments args{...};                 // device pointers + shape
///     Result<int4::GemmPlan> plan = int4::plan_gemm(args);   // preflight + path + workspace
///     rt::DeviceBuffer<std::byte> workspace = ... plan->workspace_bytes ...;
///     Status s = int4::run_gemm(args, *plan, workspace.data(), workspace.size(), stream);
///
/// Two paths: the fused W4A16 kernel (decode and small M: weights read once as 4-bit codes)
/// and the expansion path (large M, prefill: dequantize W to the activation type into the
/// workspace once, then a dense GEMM: cuBLASLt on the GPU, a tiled FP32-accumulating kernel
/// in the emulator). `GemmOptions::expand_min_m` is the crossover; see docs/int4-gemm.md.

#include <cstddef>
#include <cstdint>

#include "slimserve/config.hpp"
#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/runtime/stream.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace int4 {

enum class GemmPath : std::uint8_t {
  automatic,  ///< choose by M (GemmOptions::expand_min_m)
  fused,      ///< the W4A16 tensor-core kernel
  expand,     ///< dequantize to a dense workspace copy, then a dense GEMM
};

/// The fused kernel's thread-block tiles (the typed dispatch table's second key).
enum class GemmTile : std::uint8_t {
  m16_n128,  ///< decode: 16 x 128 per block, 4 warps side by side along N, 4 stages
  m64_n128,  ///< 64 x 128 per block, 2 x 2 warps, 3 stages
};

/// How the fused path spreads work over the SMs.
enum class GemmSchedule : std::uint8_t {
  automatic,  ///< stream-K, unless GemmOptions::split_k asks for a number of slices
  stream_k,   ///< persistent blocks, equal shares of (tile, K step) units; shared tiles
              ///< reduced in place by the last of their blocks
  split_k,    ///< grid (N tiles, M tiles, slices); FP32 partials of every slice, then a reduce
};

/// Everything is a device pointer; the element type of a, c, bias, scales and zeros is
/// `activation`. All pointers must be 16-byte aligned (cp.async rows; cuBLASLt operands).
struct GemmArguments {
  ActivationType activation = ActivationType::bf16;
  std::int64_t m = 0;
  std::int64_t n = 0;  ///< multiple of 16
  std::int64_t k = 0;  ///< multiple of 16
  std::int64_t group_size = 0;  ///< power of two >= 16 dividing k, or k (per-channel)
  const void* a = nullptr;             ///< [m, k] row-major
  const std::uint32_t* b = nullptr;    ///< [k/16, n/16, 32] packed (gemm_layout.hpp)
  const void* scales = nullptr;        ///< [k/group_size, n]
  const void* zeros = nullptr;         ///< [k/group_size, n] z values, or null: z = 8
  const void* bias = nullptr;          ///< [n], or null
  void* c = nullptr;                   ///< [m, n] row-major
};

struct GemmOptions {
  GemmPath path = GemmPath::automatic;
  GemmSchedule schedule = GemmSchedule::automatic;
  /// Split-K only. 0: automatic (enough K slices to give every SM work while the FP32
  /// partials stay within 2% of the weight bytes); 1: no split; s: s slices. A value > 0
  /// selects the split-K schedule under GemmSchedule::automatic.
  int split_k = 0;
  /// Stream-K only: persistent blocks per SM (0: 1).
  int stream_k_blocks_per_sm = 0;
  /// Streaming multiprocessors to fill; 0: ask the device (the emulator reports 8).
  int sm_count = 0;
  /// Smallest M that takes the expansion path under GemmPath::automatic. UNMEASURED default:
  /// the H200 roofline puts W4A16's compute-bound point near M = 53 and Marlin-class kernels
  /// reach parity with dense BF16 near M = 128; measure with the gemm benchmark and set it.
  std::int64_t expand_min_m = 128;
};

/// Byte ranges inside the caller's workspace; computed by one function for both the size
/// query and the carving.
struct GemmWorkspaceLayout {
  std::size_t partials_offset = 0;  ///< FP32 [splits, m, n] (split-K, splits > 1) or
                                    ///< [2 * blocks, block_m, block_n] (stream-K)
  std::size_t partials_bytes = 0;
  std::size_t arrivals_offset = 0;  ///< stream-K: one counter per tile (zeroed by run_gemm)
  std::size_t arrivals_bytes = 0;
  std::size_t dense_offset = 0;     ///< activation type [k, n] (expansion path)
  std::size_t dense_bytes = 0;
  std::size_t library_offset = 0;   ///< cuBLASLt scratch (expansion path on the GPU)
  std::size_t library_bytes = 0;
  std::size_t total_bytes = 0;
};

struct GemmPlan {
  /// The problem the plan was made for; run_gemm refuses other arguments (a plan made for a
  /// smaller k would otherwise silently skip rows of K).
  ActivationType activation = ActivationType::bf16;
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  std::int64_t group_size = 0;
  GemmPath path = GemmPath::fused;
  GemmTile tile = GemmTile::m16_n128;
  GemmSchedule schedule = GemmSchedule::split_k;
  int splits = 1;        ///< split-K slices (1 under stream-K)
  int k_per_split = 0;
  int stream_k_blocks = 0;  ///< persistent blocks (stream-K)
  /// Fused path: the block's columns (the decode tile runs groups >= 64 with 256 columns,
  /// groups of 16 and 32 with 128); run_gemm refuses a plan whose kernel is not this wide.
  int block_n = 0;
  /// Fused path: where the group scales are applied (the FP64 model the results match; the
  /// expansion path rounds every weight to T: per_weight).
  GroupScaling scaling = GroupScaling::per_weight;
  GemmWorkspaceLayout workspace;
  std::size_t workspace_bytes() const { return workspace.total_bytes; }
};

/// Preflight: shapes, group size, pointer presence and alignment. Nothing is launched.
Status can_implement(const GemmArguments& args);

/// Preflight plus the choice of path, tile and split, and the workspace it needs.
Result<GemmPlan> plan_gemm(const GemmArguments& args, const GemmOptions& options = {});

/// Launches the plan on `stream`. `workspace` must hold plan.workspace_bytes() (16-byte
/// aligned); it is scratch, nothing is kept in it between calls.
Status run_gemm(const GemmArguments& args, const GemmPlan& plan, void* workspace,
                std::size_t workspace_bytes, CUstream_st* stream);

/// Registers and shared memory are compile-time facts of a tile; this reports the most shared
/// memory one block of `tile` asks for (sizeof its SharedStorage; the stream-K kernel's,
/// with its deeper pipeline, where that is larger).
std::size_t gemm_shared_memory_bytes(ActivationType activation, GemmTile tile);

/// Act-order weights (GemmWeights::k_order non-empty) need A's columns in the packed row
/// order: out[r, i] = a[r, k_order[i]] for [m, k] BF16/FP16 matrices (not in place).
/// repack_for_gemm validated k_order; the kernel still reads only inside A: an entry outside
/// [0, k) yields NaN columns.
Status gather_activation_columns(const void* a, const std::int32_t* k_order, void* out,
                                 std::int64_t m, std::int64_t k, CUstream_st* stream);

/// Device-side inputs of `repack_for_gemm_on_device`: the interchange form's buffers.
struct DeviceQuantizedMatrix {
  std::int64_t k = 0;
  std::int64_t n = 0;
  std::int64_t group_size = 0;
  const std::uint32_t* codes = nullptr;  ///< [k/8, n]
  const float* scales = nullptr;         ///< [k/group_size, n], finite and > 0 (not rechecked)
  const std::uint8_t* zeros = nullptr;   ///< [k/group_size, n], or null for symmetric
  const std::int32_t* k_order = nullptr; ///< [k] act-order row order (GemmWeights::k_order), or null
};
/// Device-side outputs: the GEMM layout's buffers (sizes as in GemmWeights).
struct DeviceGemmWeights {
  std::uint32_t* packed = nullptr;  ///< [k/16, n/16, 32]
  void* scales = nullptr;           ///< [k/group_size, n] activation type
  void* zeros = nullptr;            ///< [k/group_size, n] activation type; must be set iff input has zeros
};

/// Repacks plain codes in device memory into the GEMM layout (bit-identical to
/// repack_for_gemm). Shapes are checked on the host; scale values are not.
Status repack_for_gemm_on_device(const DeviceQuantizedMatrix& input, ActivationType activation,
                                 const DeviceGemmWeights& output, CUstream_st* stream);

}  // namespace int4
SLIMSERVE_NAMESPACE_END
