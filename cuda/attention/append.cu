// Façade of the cache writers/readers: fused quantize-append and page dequantization.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "append_launchers.cuh"
#include "kernel_tables.cuh"
#include "slimserve/attention/append.hpp"
#include "slimserve/attention/dequantize.hpp"
#include "slimserve/detail/preflight.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {
namespace {

using preflight::aligned16;

Status null_argument_status(const char* names) {
  return make_status(StatusCode::invalid_argument, names, " must be non-null");
}

/// The head dims a format's writers and readers are built for: head vectors of whole 4-byte
/// words (validate_cache_view refuses the others: NVFP4 at head_dim 96).
template <class KvT, int HeadDim>
constexpr bool whole_word_vectors = head_vector_bytes(kv_dtype_v<KvT>, HeadDim) % 4 == 0;

// ---- append table: (stored type, input type, head_dim) -> launcher --------------------------
using detail::AppendLauncher;
struct AppendKernelEntry {
  KvDtype kv_dtype;
  ActivationDtype input_dtype;
  std::int32_t head_dim;
  AppendLauncher launch;
};

template <class KvT, class InT, int HeadDim>
Status launch_append(const kernels::AppendParams& params, dim3 grid, dim3 block, cudaStream_t stream) {
  return rt::launch(kernels::append_kernel<KvT, InT, HeadDim>, rt::LaunchConfig{grid, block, 0, stream},
                    params);
}
/// Every (stored type, input type) pair at every head_dim of the paged cache.
const auto& append_table() {
  static const auto table = [] {
    std::array<AppendKernelEntry, 2 * kv_format_count * PagedHeadDims::size> entries{};
    std::size_t count = 0;
    auto add_inputs = [&]<class KvT>() {
      if constexpr (format_has_kernel<KvT>(KvKernel::append)) {
        PagedHeadDims::for_each([&]<int HeadDim>() {
          if constexpr (whole_word_vectors<KvT, HeadDim>) {
            entries[count++] = {detail::kv_dtype_of<KvT>::value, ActivationDtype::bf16, HeadDim, &launch_append<KvT, bf16, HeadDim>};
            entries[count++] = {detail::kv_dtype_of<KvT>::value, ActivationDtype::fp16, HeadDim, &launch_append<KvT, fp16, HeadDim>};
          }
        });
      }
    };
    for_each_kv_format(add_inputs);
    return entries;
  }();
  return table;
}

// ---- dequantize table: (stored type, head_dim) -> launcher ----------------------------------
using DequantizeLauncher = Status (*)(const kernels::DequantizeParams&, dim3, cudaStream_t);
struct DequantizeKernelEntry {
  KvDtype kv_dtype;
  std::int32_t head_dim;
  DequantizeLauncher launch;
};
template <class KvT, int HeadDim>
Status launch_dequantize(const kernels::DequantizeParams& params, dim3 grid, cudaStream_t stream) {
  return rt::launch(kernels::dequantize_pages_kernel<KvT, HeadDim>,
                    rt::LaunchConfig{grid, dim3(128), 0, stream}, params);
}
/// Every stored type at every head_dim of the paged cache.
const auto& dequantize_table() {
  static const auto table = [] {
    std::array<DequantizeKernelEntry, kv_format_count * PagedHeadDims::size> entries{};
    std::size_t count = 0;
    auto add = [&]<class KvT>() {
      if constexpr (format_has_kernel<KvT>(KvKernel::dequantize)) {
        PagedHeadDims::for_each([&]<int HeadDim>() {
          if constexpr (whole_word_vectors<KvT, HeadDim>) {
            entries[count++] = {detail::kv_dtype_of<KvT>::value, HeadDim, &launch_dequantize<KvT, HeadDim>};
          }
        });
      }
    };
    for_each_kv_format(add);
    return entries;
  }();
  return table;
}

}  // namespace

Status can_implement(const AppendArguments& a) {
  SLIMSERVE_RETURN_IF_ERROR(validate_cache_view(a.cache));
  SLIMSERVE_RETURN_IF_ERROR(require_kernel(a.cache.dtype, KvKernel::append));
  // Any page_stride of whole pages: a combined K/V allocation [num_pages, 2, page] is written
  // in place (per-token scale arrays stay packed).
  if (a.cache.page_stride != 0 &&
      (a.cache.page_stride < packed_page_elements(a.cache) || a.cache.page_stride % 8 != 0)) {
    return make_status(StatusCode::invalid_argument, "append_kv: page_stride ", a.cache.page_stride,
                       " must be 0 (packed) or a multiple of 8 elements of at least one page (",
                       packed_page_elements(a.cache), ")");
  }
  if (!PagedHeadDims::contains(a.cache.head_dim)) {
    return make_status(StatusCode::unsupported, "append_kv supports head_dim ", PagedHeadDims::describe(),
                       ", got ", a.cache.head_dim);
  }
  if (!is_valid(a.rotation)) {
    return make_status(StatusCode::invalid_argument, "append_kv: unknown rotation ", static_cast<int>(a.rotation),
                       " (none, keys or keys_and_values)");
  }
  if (a.rotation != KvRotation::none && !RotationHeadDims::contains(a.cache.head_dim)) {
    return make_status(StatusCode::unsupported, "append_kv: rotation ", to_string(a.rotation), " needs head_dim ",
                       RotationHeadDims::describe(), " (a Walsh-Hadamard transform of a power-of-two length), got ",
                       a.cache.head_dim);
  }
  if (!is_valid(a.input_dtype)) {
    return make_status(StatusCode::invalid_argument, "unknown activation dtype ",
                       static_cast<int>(a.input_dtype));
  }
  if (a.num_tokens < 0) {
    return make_status(StatusCode::invalid_argument, "num_tokens ", a.num_tokens, " < 0");
  }
  const std::int64_t row_elements = static_cast<std::int64_t>(a.cache.num_kv_heads) * a.cache.head_dim;
  SLIMSERVE_RETURN_IF_ERROR(preflight::check_row_stride(a.k_row_stride, "append_kv", "k_row_stride", row_elements,
                                                       "num_kv_heads x head_dim"));
  SLIMSERVE_RETURN_IF_ERROR(preflight::check_row_stride(a.v_row_stride, "append_kv", "v_row_stride", row_elements,
                                                       "num_kv_heads x head_dim"));
  if (a.slot_mapping != nullptr) {
    if (a.token_request != nullptr || a.token_position != nullptr || a.append_indptr != nullptr) {
      return make_status(StatusCode::invalid_argument,
                         "give one form of destinations: slot_mapping, token_request and token_position, or append_indptr");
    }
    if (a.page_fills != nullptr) {  // a slot names a page but not the generation it is written under
      return make_status(StatusCode::invalid_argument,
                         "append_kv: page_fills needs a page table (its expected_tags); the slot_mapping form has none");
    }
    if (a.num_tokens == 0) return {};
    if (a.k_new == nullptr || a.v_new == nullptr) return null_argument_status("k_new and v_new");
    if (!aligned16(a.k_new) || !aligned16(a.v_new) || !aligned16(a.cache.k_pages) || !aligned16(a.cache.v_pages)) {
      return make_status(StatusCode::invalid_argument, "k_new, v_new and the K/V pages must be 16-byte aligned");
    }
    return {};
  }
  if (a.table.page_size != a.cache.page_size || a.table.batch_size < 0) {
    return make_status(StatusCode::invalid_argument, "page table page_size ", a.table.page_size,
                       " (batch_size ", a.table.batch_size, ") does not match the cache's ",
                       a.cache.page_size);
  }
  const bool explicit_form = a.token_request != nullptr || a.token_position != nullptr;
  if (explicit_form == (a.append_indptr != nullptr) ||
      (explicit_form && (a.token_request == nullptr || a.token_position == nullptr))) {
    return make_status(StatusCode::invalid_argument,
                       "give either token_request and token_position, or append_indptr");
  }
  if (a.num_tokens == 0 || a.table.batch_size == 0) return {};
  if (a.table.indptr == nullptr || a.table.indices == nullptr || a.table.last_page_len == nullptr ||
      a.k_new == nullptr || a.v_new == nullptr) {
    return make_status(StatusCode::invalid_argument, "page table arrays and k_new/v_new must be non-null");
  }
  if (!aligned16(a.k_new) || !aligned16(a.v_new) || !aligned16(a.cache.k_pages) || !aligned16(a.cache.v_pages)) {
    return make_status(StatusCode::invalid_argument, "k_new, v_new and the K/V pages must be 16-byte aligned");
  }
  if (a.page_fills != nullptr && a.table.expected_tags == nullptr) {
    return make_status(StatusCode::invalid_argument,
                       "append_kv: page_fills needs the table's expected_tags (the generation a fill belongs to)");
  }
  return {};
}

Status append_kv(const AppendArguments& a, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(can_implement(a));
  if (a.num_tokens == 0 || (a.slot_mapping == nullptr && a.table.batch_size == 0)) return {};
  AppendLauncher launch = nullptr;
  if (a.rotation != KvRotation::none) {
    launch = detail::rotated_append_launcher(a.cache.dtype, a.input_dtype, a.cache.head_dim, a.rotation);
  } else {
    for (const auto& entry : append_table()) {
      if (entry.kv_dtype == a.cache.dtype && entry.input_dtype == a.input_dtype && entry.head_dim == a.cache.head_dim) {
        launch = entry.launch;
      }
    }
  }
  if (launch == nullptr) {
    return make_status(StatusCode::unsupported, "no append kernel for ", to_string(a.cache.dtype),
                       " head_dim ", a.cache.head_dim, " rotation ", to_string(a.rotation));
  }
  kernels::AppendParams params{};
  detail::fill_paged_cache_fields(params, a.cache, a.table, a.request_status);
  params.page_size = a.cache.page_size;
  params.num_kv_heads = a.cache.num_kv_heads;
  params.batch_size = a.table.batch_size;
  params.k_new = a.k_new;
  params.v_new = a.v_new;
  const std::int64_t row_elements = static_cast<std::int64_t>(a.cache.num_kv_heads) * a.cache.head_dim;
  params.k_row_stride = a.k_row_stride != 0 ? a.k_row_stride : row_elements;
  params.v_row_stride = a.v_row_stride != 0 ? a.v_row_stride : row_elements;
  params.token_request = a.token_request;
  params.token_position = a.token_position;
  params.append_indptr = a.append_indptr;
  params.slot_mapping = a.slot_mapping;
  params.page_stride = a.cache.page_stride;
  params.num_tokens = a.num_tokens;
  params.expected_tags = a.table.expected_tags;
  params.page_fills = a.page_fills;
  // 128 threads: head_vector_lanes(head_dim) per head (kv_store.cuh), the rest on further
  // heads of the same token.
  constexpr int threads = 128;
  const int heads_per_block = threads / kernels::head_vector_lanes(a.cache.head_dim);
  const dim3 grid(static_cast<unsigned>(a.num_tokens),
                  static_cast<unsigned>((a.cache.num_kv_heads + heads_per_block - 1) / heads_per_block));
  SLIMSERVE_RETURN_IF_ERROR(launch(params, grid, dim3(threads), stream));
  if (a.page_fills == nullptr) return {};
  constexpr int fill_threads = 128;
  return rt::launch(kernels::record_append_fills_kernel<fill_threads>,
                    rt::LaunchConfig{dim3(static_cast<unsigned>((a.num_tokens + fill_threads - 1) / fill_threads)),
                                     dim3(fill_threads), 0, stream},
                    params);
}

Status dequantize_pages(const PagedKVCacheView& cache, const std::int32_t* page_ids,
                        std::int32_t num_listed, bf16* k_out, bf16* v_out, cudaStream_t stream) {
  SLIMSERVE_RETURN_IF_ERROR(validate_cache_view(cache));
  SLIMSERVE_RETURN_IF_ERROR(require_kernel(cache.dtype, KvKernel::dequantize));
  SLIMSERVE_RETURN_IF_ERROR(require_packed_pages(cache, "dequantize_pages"));
  if (!PagedHeadDims::contains(cache.head_dim)) {
    return make_status(StatusCode::unsupported, "dequantize_pages supports head_dim ",
                       PagedHeadDims::describe(), ", got ", cache.head_dim);
  }
  if (num_listed < 0) {
    return make_status(StatusCode::invalid_argument, "num_listed ", num_listed, " < 0");
  }
  if (num_listed == 0) return {};
  if (page_ids == nullptr || k_out == nullptr || v_out == nullptr) {
    return make_status(StatusCode::invalid_argument, "page_ids, k_out and v_out must be non-null");
  }
  if (!aligned16(cache.k_pages) || !aligned16(cache.v_pages)) {
    return make_status(StatusCode::invalid_argument, "the K/V pages must be 16-byte aligned");
  }
  kernels::DequantizeParams params{cache.k_pages, cache.v_pages, cache.k_scale, cache.v_scale,
                                   cache.k_token_scales, cache.v_token_scales, cache.num_pages,
                                   cache.page_size, cache.num_kv_heads, cache.layout, cache.scale_mode,
                                   page_ids, k_out, v_out};
  for (const auto& entry : dequantize_table()) {
    if (entry.kv_dtype == cache.dtype && entry.head_dim == cache.head_dim) {
      return entry.launch(params, dim3(static_cast<unsigned>(num_listed), 2), stream);
    }
  }
  return make_status(StatusCode::unsupported, "no dequantize kernel for ", to_string(cache.dtype),
                     " head_dim ", cache.head_dim);
}

}  // namespace attention
SLIMSERVE_NAMESPACE_END
