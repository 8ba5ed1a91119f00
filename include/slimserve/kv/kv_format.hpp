#pragma once
/// \file
/// \brief The KV cache's element formats: one trait per format (`KvFormat<Storage>`) and the one
/// list of formats (`SLIMSERVE_KV_FORMAT_LIST`) from which everything per format is made.
///
/// Made from the list, in C++ at compile time: the `KvDtype` enum and its names, `is_valid`,
/// `for_each_kv_format` (the kernels' dispatch tables and the extern templates of the
/// per-format instantiation units), `kv_format_info` (the byte geometry the planners,
/// preflights and page movers use). Made from the list by tools/gen_kv_formats.py, committed
/// and checked stale by a test: the per-format instantiation units under cuda/attention, the C
/// enum in slimserve.h, the Python package's names and the SASS report's element sizes. Adding
/// a format: docs/kv.md, "Adding a KV format".
///
/// A head vector of a format is `head_dim * bits / 8` bytes of codes, followed (formats with
/// per-block scales) by one scale of `scale_bits` per `scale_block` elements. Per-tensor and
/// per-token-head scales live beside the pages (KvScaleMode), not in the head vector.
/// Plain C++: usable by host code that never includes a CUDA header.

#include <cstdint>
#include <string_view>

#include "slimserve/activation_dtype.hpp"
#include "slimserve/config.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/formats/nvfp4.hpp"
#include "slimserve/formats/packed.hpp"

/// The KV formats, one X(...) per format, in ABI order:
///   X(name, abi value, bits per element, Python canonical name, Python names (space-separated),
///     tensor dtypes that may hold its pages (DLPack names, space-separated),
///     elements per in-vector scale (0: none), bits of one in-vector scale)
/// `name` is at once the storage type (slimserve::name), the enumerator (KvDtype::name), the
/// C constant (SLIMSERVE_KV_<NAME>) and the suffix of the instantiation units; the bits and the
/// in-vector scale geometry are checked against its KvFormat trait (the generator needs them
/// for the bytes the SASS report's formulas count). The ABI values are the C enum's: never
/// renumber, append.
/// After an edit: python3 tools/gen_kv_formats.py (a test fails while its outputs are stale).
// clang-format off
#define SLIMSERVE_KV_FORMAT_LIST(X)                                                                  \
  X(bf16,     0, 16, "bfloat16", "bfloat16 bf16",              "bfloat16 uint16",                 0, 0) \
  X(fp16,     1, 16, "float16",  "float16 fp16 half",          "float16",                         0, 0) \
  X(fp8_e4m3, 2,  8, "fp8_e4m3", "fp8 fp8_e4m3 float8_e4m3fn", "uint8 int8 float8_e4m3fn",        0, 0) \
  X(fp8_e5m2, 3,  8, "fp8_e5m2", "fp8_e5m2 float8_e5m2",       "uint8 int8 float8_e5m2",          0, 0) \
  X(nvfp4,    4,  4, "nvfp4",    "nvfp4",                      "uint8",                          16, 8)
// clang-format on

SLIMSERVE_NAMESPACE_BEGIN
// The cache's names stay in namespace attention (where they were born), so every engine's code
// keeps compiling; the files live in kv/ because the page movers use them too.
namespace attention {

/// Element format of the cached K/V pages (values: the ABI's, from the list).
enum class KvDtype : std::uint8_t {
#define SLIMSERVE_KV_ENUMERATOR(name, value, ...) name = value,
  SLIMSERVE_KV_FORMAT_LIST(SLIMSERVE_KV_ENUMERATOR)
#undef SLIMSERVE_KV_ENUMERATOR
};

/// Where a format's scales live.
enum class KvScaleGeometry : std::uint8_t {
  none,             ///< no scale needed (the 16-bit formats: scale 1, or a per-tensor scale)
  per_tensor,       ///< at least a per-tensor scale (or per token-head, KvScaleMode)
  per_block,        ///< a scale per `scale_block` elements inside the head vector, plus per tensor
};

/// The kernel families that touch pages. A format's trait lists those that take it: the
/// dispatch tables instantiate a family only for the formats that list it, and the family's
/// host preflight refuses the others by name (require_kernel, kv_cache_view.hpp). A new
/// format thus starts with none and gains them as its arithmetic lands.
enum class KvKernel : std::uint8_t {
  append = 1,           ///< append_kv (quantize-and-append, both destination forms)
  dequantize = 2,       ///< dequantize_pages
  decode = 4,           ///< the CUDA-core decode (DecodeWrapper)
  paged_attention = 8,  ///< tensor-core paged attention: decode, prefill, fused prefill
};
using KvKernelSet = std::uint8_t;
inline constexpr KvKernelSet all_kv_kernels = 1 | 2 | 4 | 8;
constexpr std::string_view to_string(KvKernel kernel) noexcept {
  switch (kernel) {
    case KvKernel::append: return "append_kv";
    case KvKernel::dequantize: return "dequantize_pages";
    case KvKernel::decode: return "decode";
    case KvKernel::paged_attention: return "paged attention";
  }
  return "unknown";
}

/// The trait of one format; one specialization per entry of SLIMSERVE_KV_FORMAT_LIST.
///   storage          the element (or code-pair) type the kernels are instantiated on
///   dtype            its KvDtype
///   bits             bits per element
///   scales           KvScaleGeometry: what scales the cache must carry
///   per_token_scales whether KvScaleMode::per_token (one float per token-head) is allowed
///   scale_block      elements per in-vector scale (per_block formats; else 0)
///   scale_bits       bits of one in-vector scale (per_block formats; else 0)
///   mma_input        the tensor-core operand type the codes widen to
///   computes_in_storage_type  queries must be the storage type (`storage_activation`): the
///                    codes are the mma operands as stored; else either activation type
///   kernels          the KvKernel families that take it (a KvKernelSet)
/// and the register conversions the kernels call (`widen`, `quantize`: a 32-bit word of
/// codes <-> floats, exactly the bits of the scalar conversions).
template <class Storage>
struct KvFormat;

/// BF16 and FP16: stored as computed, two to a register word.
template <half_format T>
struct KvHalfFormat {
  using storage = T;
  static constexpr int bits = 16;
  static constexpr KvScaleGeometry scales = KvScaleGeometry::none;
  static constexpr bool per_token_scales = false;  // amax / max_finite ~ 3e38: q.k overflows FP32
  static constexpr int scale_block = 0;
  static constexpr int scale_bits = 0;
  using mma_input = T;
  static constexpr bool computes_in_storage_type = true;
  static constexpr ActivationDtype storage_activation =
      std::same_as<T, bf16> ? ActivationDtype::bf16 : ActivationDtype::fp16;
  static constexpr KvKernelSet kernels = all_kv_kernels;
  static constexpr int word_elements = 2;
  using wide_word = f32x2;
  SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE static f32x2 widen(std::uint32_t word) { return to_float2<T>(word); }
  SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE static std::uint32_t quantize(f32x2 v) { return from_float2<T>(v); }
};
/// FP8: one byte a code, a scale required (per tensor or per token-head), widened exactly to fp16.
template <fp8_format T>
struct KvFp8Format {
  using storage = T;
  static constexpr int bits = 8;
  static constexpr KvScaleGeometry scales = KvScaleGeometry::per_tensor;
  static constexpr bool per_token_scales = true;
  static constexpr int scale_block = 0;
  static constexpr int scale_bits = 0;
  using mma_input = fp16;
  static constexpr bool computes_in_storage_type = false;
  static constexpr ActivationDtype storage_activation = ActivationDtype::fp16;  // unused
  static constexpr KvKernelSet kernels = all_kv_kernels;
  static constexpr int word_elements = 4;
  using wide_word = f32x4;
  SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE static f32x4 widen(std::uint32_t word) { return to_float4<T>(word); }
  SLIMSERVE_HOST_DEVICE SLIMSERVE_FORCEINLINE static std::uint32_t quantize(f32x4 v) { return from_float4<T>(v); }
};

template <> struct KvFormat<bf16> : KvHalfFormat<bf16> { static constexpr KvDtype dtype = KvDtype::bf16; };
template <> struct KvFormat<fp16> : KvHalfFormat<fp16> { static constexpr KvDtype dtype = KvDtype::fp16; };
template <> struct KvFormat<fp8_e4m3> : KvFp8Format<fp8_e4m3> { static constexpr KvDtype dtype = KvDtype::fp8_e4m3; };
template <> struct KvFormat<fp8_e5m2> : KvFp8Format<fp8_e5m2> { static constexpr KvDtype dtype = KvDtype::fp8_e5m2; };
/// NVFP4 (formats/nvfp4.hpp): E2M1 codes two to a byte, an E4M3 scale per 16 elements after
/// the codes of each head vector, and a per-tensor FP32 scale (required, a device pointer).
/// Its codes widen exactly to fp16 (e2m1 x e4m3 has at most 6 significant bits and |x| <= 2688).
template <>
struct KvFormat<nvfp4> {
  using storage = nvfp4;
  static constexpr KvDtype dtype = KvDtype::nvfp4;
  static constexpr int bits = 4;
  static constexpr KvScaleGeometry scales = KvScaleGeometry::per_block;
  static constexpr bool per_token_scales = false;  // the block scales already follow each vector
  static constexpr int scale_block = nvfp4_block_elements;
  static constexpr int scale_bits = 8;
  using scale_format = fp8_e4m3;
  using mma_input = fp16;
  static constexpr bool computes_in_storage_type = false;
  static constexpr ActivationDtype storage_activation = ActivationDtype::fp16;  // unused
  // Written (kv_store_nvfp4.cuh), read back (dequantize_nvfp4_pages_kernel), read by the
  // CUDA-core decode (decode_kernel.cuh: one scale block per lane, decoded in FP32) and by the
  // tensor-core paged attention (nvfp4_fragments.cuh), its fused prefill included (the chunk
  // staged as FP16 in the NVFP4 fragment order and written by the append's store; chunk_kv.cuh).
  static constexpr KvKernelSet kernels = all_kv_kernels;
  static constexpr int word_elements = 8;   // a 32-bit word holds 8 codes
};

/// f.template operator()<Storage>() for every format of the list, in ABI order.
template <class F>
constexpr void for_each_kv_format(F&& f) {
#define SLIMSERVE_KV_VISIT(name, ...) f.template operator()<::slimserve::name>();
  SLIMSERVE_KV_FORMAT_LIST(SLIMSERVE_KV_VISIT)
#undef SLIMSERVE_KV_VISIT
}
#define SLIMSERVE_KV_COUNT(...) +1
inline constexpr int kv_format_count = 0 SLIMSERVE_KV_FORMAT_LIST(SLIMSERVE_KV_COUNT);
#undef SLIMSERVE_KV_COUNT

/// A format's trait as run-time data, for host code holding a KvDtype.
struct KvFormatInfo {
  KvDtype dtype;
  std::string_view name;
  int bits;
  KvScaleGeometry scales;
  bool per_token_scales;
  int scale_block;
  int scale_bits;
  bool computes_in_storage_type;
  ActivationDtype storage_activation;
  KvKernelSet kernels;
};
/// The list as a table indexed by ABI value.
inline constexpr KvFormatInfo kv_formats[] = {
#define SLIMSERVE_KV_INFO(name, value, ...)                                                          \
  KvFormatInfo{KvDtype::name, #name, KvFormat<::slimserve::name>::bits, KvFormat<::slimserve::name>::scales, \
               KvFormat<::slimserve::name>::per_token_scales, KvFormat<::slimserve::name>::scale_block,     \
               KvFormat<::slimserve::name>::scale_bits,                                              \
               KvFormat<::slimserve::name>::computes_in_storage_type,                                \
               KvFormat<::slimserve::name>::storage_activation, KvFormat<::slimserve::name>::kernels},
    SLIMSERVE_KV_FORMAT_LIST(SLIMSERVE_KV_INFO)
#undef SLIMSERVE_KV_INFO
};
static_assert(sizeof(kv_formats) / sizeof(kv_formats[0]) == kv_format_count);
#define SLIMSERVE_KV_CHECK_BITS(name, value, list_bits, py, aliases, tensors, list_scale_block, list_scale_bits) \
  static_assert(KvFormat<::slimserve::name>::bits == list_bits &&                                   \
                    static_cast<int>(KvFormat<::slimserve::name>::dtype) == value &&                \
                    KvFormat<::slimserve::name>::scale_block == list_scale_block &&                 \
                    KvFormat<::slimserve::name>::scale_bits == list_scale_bits,                     \
                "SLIMSERVE_KV_FORMAT_LIST and the KvFormat trait of " #name " disagree");
SLIMSERVE_KV_FORMAT_LIST(SLIMSERVE_KV_CHECK_BITS)
#undef SLIMSERVE_KV_CHECK_BITS

/// Range check for values that cross a boundary as integers (C ABI, Python, casts).
constexpr bool is_valid(KvDtype dtype) noexcept {
  for (const KvFormatInfo& f : kv_formats) {
    if (f.dtype == dtype) return true;
  }
  return false;
}
/// The trait of a valid dtype (is_valid first; an invalid one gives the first format's).
constexpr const KvFormatInfo& kv_format_info(KvDtype dtype) noexcept {
  for (const KvFormatInfo& f : kv_formats) {
    if (f.dtype == dtype) return f;
  }
  return kv_formats[0];
}
constexpr std::string_view to_string(KvDtype dtype) noexcept {
  return is_valid(dtype) ? kv_format_info(dtype).name : "unknown";
}
/// "bf16, fp16, fp8_e4m3, fp8_e5m2" for error messages.
constexpr std::string_view kv_format_names() noexcept {
  return ""
#define SLIMSERVE_KV_NAME(name, value, ...) ", " #name
      SLIMSERVE_KV_FORMAT_LIST(SLIMSERVE_KV_NAME) + 2;
#undef SLIMSERVE_KV_NAME
}

constexpr int bits_per_element(KvDtype dtype) noexcept { return kv_format_info(dtype).bits; }
/// Bytes of one head vector: its codes, then its in-vector (per-block) scales.
constexpr std::int64_t head_vector_bytes(const KvFormatInfo& f, std::int64_t head_dim) noexcept {
  const std::int64_t scales = f.scale_block > 0 ? head_dim / f.scale_block * f.scale_bits / 8 : 0;
  return head_dim * f.bits / 8 + scales;
}
constexpr std::int64_t head_vector_bytes(KvDtype dtype, std::int64_t head_dim) noexcept {
  return head_vector_bytes(kv_format_info(dtype), head_dim);
}
/// Bytes of one element of a byte-sized format (0 for a sub-byte one, whose geometry is
/// head_vector_bytes: callers that mean bytes of a page use that).
constexpr int element_bytes(KvDtype dtype) noexcept { return bits_per_element(dtype) / 8; }
/// Bytes of one element of a page array's storage type: the element for byte-sized formats,
/// one byte for a sub-byte format (its page arrays are bytes: codes, then block scales).
/// Page strides count these (PagedKVCacheView::page_stride).
constexpr int storage_bytes(KvDtype dtype) noexcept { return bits_per_element(dtype) >= 8 ? bits_per_element(dtype) / 8 : 1; }
/// Whether the format's trait lists the kernel family.
constexpr bool has_kernel(KvDtype dtype, KvKernel kernel) noexcept {
  return (kv_format_info(dtype).kernels & static_cast<KvKernelSet>(kernel)) != 0;
}
/// The same for a storage type (the dispatch tables' compile-time gate).
template <class Storage>
constexpr bool format_has_kernel(KvKernel kernel) noexcept {
  return (KvFormat<Storage>::kernels & static_cast<KvKernelSet>(kernel)) != 0;
}
/// The format must be given a scale (KvScaleMode::none is refused).
constexpr bool requires_scale(KvDtype dtype) noexcept {
  return kv_format_info(dtype).scales != KvScaleGeometry::none;
}
/// One float per token-head (KvScaleMode::per_token) is allowed.
constexpr bool allows_per_token_scales(KvDtype dtype) noexcept { return kv_format_info(dtype).per_token_scales; }
/// FP8 codes (the kernels' FP8 paths); kept for the callers that mean exactly that.
constexpr bool is_fp8(KvDtype dtype) noexcept { return bits_per_element(dtype) == 8; }

/// The KvDtype of a storage type (the dispatch tables' key).
template <class Storage>
inline constexpr KvDtype kv_dtype_v = KvFormat<Storage>::dtype;

}  // namespace attention
SLIMSERVE_NAMESPACE_END
