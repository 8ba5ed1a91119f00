#pragma once
/// \file
/// \brief Multi-head latent attention (DeepSeek-V3 / Kimi K2) over a paged latent cache:
/// fused quantize-and-append, absorbed decode on tensor cores (plan / run, split-KV, CSR or
/// block table), and the prefix gather for prefill. Layout: mla_cache_view.hpp.
///
///   append_mla(args, stream)                          new (latent, rope) -> their slots
///   mla_decode_workspace_size(plan_args) / mla_decode_workspace_bound(bound)
///   plan_mla_decode(plan_args, ws, bytes, stream)     host: validate, schedule, upload
///   run_mla_decode(args, plan, ws, bytes, stream)     launch only (CUDA-graph capturable)
///   gather_mla_latent(args, stream)                   cached prefix -> BF16 [tokens, 576]
///
/// Absorbed decode: the engine multiplies q_nope by W_UK (per head) so q is
/// [batch * query_tokens, num_heads, 576] (512 latent + 64 rope); attention over the cached
/// (latent | rope) rows gives o [batch * query_tokens, num_heads, 512] in latent space, which
/// the engine multiplies by W_UV. Request b owns query tokens [b * query_tokens, (b + 1) *
/// query_tokens), the request's last positions (its new tokens are already appended): query
/// token t sees positions <= length - query_tokens + t. Ragged absorbed prefill of short
/// chunks: with `MlaDecodeProblem::ragged_queries` and the plan's qo_indptr_host, request b owns
/// query tokens [qo_indptr[b], qo_indptr[b + 1]) instead (0 .. query_tokens of them, causal in
/// the same way: token t of n sees positions <= length - n + t). A row that sees no token outputs 0
/// with lse -inf. Aborted requests (tag check not ok, inconsistent device table): no page is
/// read; output rows are NaN and lse is -inf.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "slimserve/attention/detail/stream.hpp"
#include "slimserve/attention/mla_cache_view.hpp"
#include "slimserve/config.hpp"
#include "slimserve/kv/page_table_view.hpp"
#include "slimserve/kv/request_status.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

// ---- append ---------------------------------------------------------------------------------

/// New tokens' latent [num_tokens, 512] and rope [num_tokens, 64] (BF16 or FP16), quantized
/// into the cache: FP8 latent with a per-128-value scale amax / 448 (per_token_group) or the
/// calibrated per-tensor scale; BF16 latent saturated to the finite range; rope stored BF16.
/// Destinations and skip rules are append_kv's (append.hpp): explicit (token_request,
/// token_position) or chunk form (append_indptr); a token of an aborted request, or outside
/// its request's pages, writes nothing. Bytes written per token: the record of
/// mla_cache_view.hpp (656 for FP8 with group scales, 640 per-tensor, 416 NVFP4, 1152 BF16).
/// NVFP4: per 16 latent values an E4M3 block scale from their amax and the tensor scale
/// (append_kv's NVFP4 rule, formats/nvfp4.hpp), codes round to nearest even, saturating.
struct MlaAppendArguments {
  MlaCacheView cache;
  kv::PageTableView table;                            ///< device arrays
  const kv::RequestStatus* request_status = nullptr;  ///< [batch_size] device, or null
  const void* latent_new = nullptr;  ///< latent_new[t * latent_stride + d], 16-byte aligned
  const void* rope_new = nullptr;    ///< rope_new[t * rope_stride + d], 16-byte aligned
  std::int64_t latent_stride = 0;    ///< elements; 0 = 512 (packed). Multiple of 8.
  std::int64_t rope_stride = 0;      ///< elements; 0 = 64 (packed). Multiple of 8.
  ActivationDtype input_dtype = ActivationDtype::bf16;
  std::int32_t num_tokens = 0;
  const std::int32_t* token_request = nullptr;   ///< [num_tokens] explicit form
  const std::int32_t* token_position = nullptr;  ///< [num_tokens] explicit form
  const std::int32_t* append_indptr = nullptr;   ///< [batch_size + 1] chunk form
};
Status append_mla(const MlaAppendArguments& args, cudaStream_t stream);

// ---- absorbed decode ------------------------------------------------------------------------

/// Head counts the decode supports: tensor-parallel slices of 64- and 128-head models.
constexpr bool supported_mla_heads(std::int32_t heads) noexcept {
  return heads == 8 || heads == 16 || heads == 32 || heads == 64 || heads == 128;
}
inline constexpr std::int32_t mla_max_query_tokens = 8;
/// Largest query chunk per request of the ragged (prefill) form. Absorbed attention spends
/// 2 x 1088 FLOPs per head, query and key against the non-absorbed 2 x 320 plus the prefix's
/// up-projection (2 x 512 x 256 per head and key, once per chunk), so it does less work for
/// chunks below ~170 tokens; past that, gather_mla_latent and non-absorbed prefill.
inline constexpr std::int32_t mla_max_chunk_query_tokens = 128;

/// CTAs of the decode kernel for (latent type, warps_m: MlaDecodePlan::warps_m) that one SM
/// holds at once: what a plan's `ctas_per_sm = 0` means, so that a split fills the device's
/// CTA slots rather than its SMs. The kernels guarantee it (`__launch_bounds__` minimum, and
/// the dispatch table checks their shared memory against it): the 16-row FP8 and NVFP4
/// kernels (110 KB and 88 KB, 128 threads) run two per SM; every other one (16-row BF16: 126 KB; 32 rows: 256 threads of
/// 240 registers; wgmma: 180-226 KB) one.
constexpr std::int32_t mla_decode_resident_ctas(KvDtype kv_dtype, std::int32_t warps_m) noexcept {
  return (kv_dtype == KvDtype::fp8_e4m3 || kv_dtype == KvDtype::nvfp4) && warps_m == 1 ? 2 : 1;
}

/// Shapes and types shared by plan and run; run refuses a plan made for another problem.
struct MlaDecodeProblem {
  std::int32_t batch_size = 0;
  std::int32_t num_heads = 0;
  std::int32_t query_tokens = 1;  ///< 1 (decode) .. 8 (speculative verify); ragged: the largest count
  std::int32_t page_size = 0;
  KvDtype kv_dtype = KvDtype::bf16;
  MlaScaleMode scale_mode = MlaScaleMode::none;
  ActivationDtype q_dtype = ActivationDtype::bf16;  ///< q and o (bf16 only)
  std::int32_t latent_dim = mla_latent_dim;
  std::int32_t rope_dim = mla_rope_dim;
  /// Query counts per request from the plan's qo_indptr_host (each 0 .. query_tokens, and
  /// query_tokens up to mla_max_chunk_query_tokens): absorbed prefill of short chunks.
  bool ragged_queries = false;
  /// Run the sm_90a warpgroup-MMA (wgmma) kernel, 64 rows per CTA, for requests of at least
  /// 64 rows (heads x query tokens); smaller problems keep the mma.sync kernel. Off by default
  /// until the kernel has run on a GPU (docs/mla.md, "wgmma path"). Every latent type (BF16,
  /// FP8, NVFP4) has the kernel.
  bool warpgroup_mma = false;
  friend bool operator==(const MlaDecodeProblem&, const MlaDecodeProblem&) = default;
};

/// Shape checks (head count, query tokens, dims, dtype / scale pairing) with clear messages.
Status validate_mla_decode_problem(const MlaDecodeProblem& problem);

struct MlaDecodePlanArguments {
  MlaDecodeProblem problem;
  /// Host copies of the lengths: the CSR table's indptr and last_page_len, or (block table)
  /// seq_lens; exactly one form.
  std::span<const std::int32_t> kv_indptr_host;      ///< [batch_size + 1]
  std::span<const std::int32_t> last_page_len_host;  ///< [batch_size]
  std::span<const std::int32_t> seq_lens_host;       ///< [batch_size]
  /// Ragged form only (problem.ragged_queries): query rows per request, [batch_size + 1].
  std::span<const std::int32_t> qo_indptr_host;
  std::int32_t num_sms = 0;  ///< 0 = ask the current device (plan_mla_decode, mla_decode_workspace_size)
  std::int32_t ctas_per_sm = 0;  ///< 0 = the chosen kernel's (mla_decode_resident_ctas)
  std::int32_t min_chunk_tokens = 256;  ///< no split chunk shorter than this
  bool allow_split = true;
};

struct MlaDecodeWorkspaceLayout {
  std::size_t work_request = 0;  ///< byte offsets into the workspace
  std::size_t work_row_tile = 0;
  std::size_t work_split = 0;
  std::size_t work_num_splits = 0;
  std::size_t unit_request = 0;
  std::size_t unit_row_tile = 0;
  std::size_t unit_indptr = 0;
  std::size_t qo_indptr = 0;  ///< [batch_size + 1]: b * query_tokens, or the ragged qo_indptr
  std::size_t partial_o = 0;
  std::size_t partial_lse = 0;
  std::size_t int_bytes = 0;  ///< bytes of the int32 head (uploaded by the plan)
  std::size_t total_bytes = 0;
};

struct MlaDecodePlan {
  MlaDecodeProblem problem;
  std::int32_t warps_m = 2;   ///< mma.sync kernel: CTA = 4 * warps_m warps; 4: the wgmma kernel (8 warps)
  std::int32_t cta_rows = 32; ///< packed (query token x head) rows per CTA
  bool split_kv = false;
  std::int32_t chunk_tokens = 0;
  std::int32_t num_work_items = 0;  ///< grid.x
  std::int32_t num_units = 0;       ///< (request, row tile) pairs: merge grid.x
  MlaDecodeWorkspaceLayout layout;
  std::vector<std::int32_t> host_ints;
};

Result<MlaDecodePlan> make_mla_decode_plan(const MlaDecodePlanArguments& args);
Result<std::size_t> mla_decode_workspace_size(const MlaDecodePlanArguments& args);

/// Upper bound of the workspace of every plan up to these sizes (one allocation for a
/// CUDA-graph engine).
struct MlaDecodeWorkspaceBound {
  MlaDecodeProblem problem;  ///< batch_size = the maximum batch
  std::int32_t num_sms = 0;  ///< 0 = the current device
  std::int32_t ctas_per_sm = 0;  ///< 0 = the plans' kernel's (mla_decode_resident_ctas)
};
Result<std::size_t> mla_decode_workspace_bound(const MlaDecodeWorkspaceBound& bound);

struct MlaDecodeArguments {
  MlaCacheView cache;
  /// The page table: CSR (table.indptr non-null) or block table (block_table.block_table).
  kv::PageTableView table;
  kv::BlockTableView block_table;
  const kv::RequestStatus* request_status = nullptr;  ///< [batch_size] device, or null
  const void* q = nullptr;  ///< q[token * q_token_stride + head * q_head_stride + d], d < 576
  void* o = nullptr;        ///< o[token * o_token_stride + head * o_head_stride + d], d < 512
  float* lse = nullptr;     ///< [query tokens in all, num_heads] natural log, or null
  /// Strides in elements; 0 = packed. Multiples of 8.
  std::int64_t q_token_stride = 0, q_head_stride = 0;
  std::int64_t o_token_stride = 0, o_head_stride = 0;
  /// Softmax scale of q.k; DeepSeek-V3 uses 1 / sqrt(192) (the non-absorbed head dim), so
  /// there is no default.
  float sm_scale = 0.0f;
};

Result<MlaDecodePlan> plan_mla_decode(MlaDecodePlanArguments args, void* workspace,
                                      std::size_t workspace_bytes, cudaStream_t stream);
Status run_mla_decode(const MlaDecodeArguments& args, const MlaDecodePlan& plan, void* workspace,
                      std::size_t workspace_bytes, cudaStream_t stream);

// ---- prefill support ------------------------------------------------------------------------

/// Gathers cached tokens, dequantized to BF16, for engines that up-project the prefix and run
/// prefill in non-absorbed form: output row token_indptr[b] + i = position i of request b,
/// [latent (512) | rope (64)] at out[row * out_stride]. Rows [token_indptr[b],
/// token_indptr[b+1]) must not exceed the request's length; rows of an aborted request, or
/// past its length per the device table, are NaN. Grid = num_rows (host; an upper bound is
/// fine: rows past token_indptr[batch_size] are not written).
struct MlaGatherArguments {
  MlaCacheView cache;
  kv::PageTableView table;
  const kv::RequestStatus* request_status = nullptr;
  const std::int32_t* token_indptr = nullptr;  ///< [batch_size + 1] device
  void* out = nullptr;                         ///< BF16 [num_rows, out_stride]
  std::int64_t out_stride = 0;                 ///< elements; 0 = 576. Multiple of 8.
  std::int32_t num_rows = 0;
};
Status gather_mla_latent(const MlaGatherArguments& args, cudaStream_t stream);

}  // namespace attention
SLIMSERVE_NAMESPACE_END
