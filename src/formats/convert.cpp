// Bulk host conversions (see slimserve/formats/convert.hpp).
#include "slimserve/formats/convert.hpp"

#include <algorithm>
#include <thread>
#include <type_traits>
#include <vector>

#include "slimserve/formats/detail/bulk_codec.hpp"
#include "slimserve/formats/scale.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace {

/// Runs body(begin, end) over [0, n) in contiguous chunks, on up to options.max_threads
/// threads (the calling thread takes the first chunk).
template <class Body>
void parallel_chunks(std::size_t n, const ConvertOptions& options, Body body) {
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const unsigned limit = options.max_threads == 0 ? hardware : options.max_threads;
  const std::size_t per_thread = std::max<std::size_t>(options.min_elements_per_thread, 1);
  const auto threads = static_cast<unsigned>(
      std::clamp<std::size_t>(n / per_thread, 1, std::max(1u, limit)));
  if (threads <= 1) {
    body(std::size_t{0}, n);
    return;
  }
  // Chunk edges on 64-element boundaries so threads never share a cache line of output.
  const std::size_t chunk = (n / threads + 63) / 64 * 64;
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  for (unsigned t = 1; t < threads; ++t) {
    const std::size_t begin = std::min(n, t * chunk);
    const std::size_t end = std::min(n, begin + chunk);
    if (begin < end) workers.emplace_back(body, begin, end);
  }
  body(std::size_t{0}, std::min(n, chunk));
  for (std::thread& worker : workers) worker.join();
}

/// Elementwise conversions for the bulk loops: the branch-free codec where the scalar one
/// would branch (FP16 and FP8); BF16 is a shift or an add already.
template <class T>
SLIMSERVE_FORCEINLINE float load_float(T x) {
  if constexpr (std::is_same_v<T, fp16> || fp8_format<T>) {
    return detail::decode_branchless<typename format_traits<T>::layout>(x.bits);
  } else {
    return to_float(x);
  }
}
template <class Out>
SLIMSERVE_FORCEINLINE Out store_float(float x) {
  using detail::Overflow;
  using Storage = decltype(Out::bits);
  if constexpr (std::is_same_v<Out, fp16>) {
    return Out{static_cast<Storage>(
        detail::encode_rne_branchless<detail::Fp16Layout, Overflow::to_infinity>(x))};
  } else if constexpr (fp8_format<Out>) {
    return Out{static_cast<Storage>(
        detail::encode_rne_branchless<typename format_traits<Out>::layout, Overflow::saturate>(x))};
  } else {
    return from_float<Out>(x);
  }
}

template <class In, class Out>
void quantize_range(const In* __restrict src, Out* __restrict dst, float scale, std::size_t begin,
                    std::size_t end) {
  if (scale == 1.0f) {  // x / 1 == x exactly: skip the division
    for (std::size_t i = begin; i < end; ++i) dst[i] = store_float<Out>(load_float(src[i]));
  } else {
    for (std::size_t i = begin; i < end; ++i) dst[i] = store_float<Out>(load_float(src[i]) / scale);
  }
}

template <class In>
void dequantize_range(const In* __restrict src, float* __restrict dst, float scale,
                      std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) dst[i] = load_float(src[i]) * scale;
}

Status check_sizes(std::size_t src, std::size_t dst) {
  if (src != dst) {
    return make_status(StatusCode::invalid_argument, "source has ", src,
                       " elements but destination has ", dst);
  }
  return {};
}

}  // namespace

template <quantize_source In, quantize_target Out>
Status quantize(std::span<const In> src, std::span<Out> dst, float scale,
                const ConvertOptions& options) {
  SLIMSERVE_RETURN_IF_ERROR(check_sizes(src.size(), dst.size()));
  SLIMSERVE_RETURN_IF_ERROR(validate_scale(scale));
  parallel_chunks(src.size(), options, [&](std::size_t begin, std::size_t end) {
    quantize_range(src.data(), dst.data(), scale, begin, end);
  });
  return {};
}

template <float_format In>
Status dequantize(std::span<const In> src, std::span<float> dst, float scale,
                  const ConvertOptions& options) {
  SLIMSERVE_RETURN_IF_ERROR(check_sizes(src.size(), dst.size()));
  SLIMSERVE_RETURN_IF_ERROR(validate_scale(scale));
  parallel_chunks(src.size(), options, [&](std::size_t begin, std::size_t end) {
    dequantize_range(src.data(), dst.data(), scale, begin, end);
  });
  return {};
}

#define SLIMSERVE_INSTANTIATE_QUANTIZE(In, Out) \
  template Status quantize<In, Out>(std::span<const In>, std::span<Out>, float, const ConvertOptions&);
SLIMSERVE_INSTANTIATE_QUANTIZE(float, fp8_e4m3)
SLIMSERVE_INSTANTIATE_QUANTIZE(float, fp8_e5m2)
SLIMSERVE_INSTANTIATE_QUANTIZE(float, bf16)
SLIMSERVE_INSTANTIATE_QUANTIZE(float, fp16)
SLIMSERVE_INSTANTIATE_QUANTIZE(bf16, fp8_e4m3)
SLIMSERVE_INSTANTIATE_QUANTIZE(bf16, fp8_e5m2)
SLIMSERVE_INSTANTIATE_QUANTIZE(bf16, bf16)
SLIMSERVE_INSTANTIATE_QUANTIZE(bf16, fp16)
SLIMSERVE_INSTANTIATE_QUANTIZE(fp16, fp8_e4m3)
SLIMSERVE_INSTANTIATE_QUANTIZE(fp16, fp8_e5m2)
SLIMSERVE_INSTANTIATE_QUANTIZE(fp16, bf16)
SLIMSERVE_INSTANTIATE_QUANTIZE(fp16, fp16)
#undef SLIMSERVE_INSTANTIATE_QUANTIZE
template Status dequantize<fp8_e4m3>(std::span<const fp8_e4m3>, std::span<float>, float, const ConvertOptions&);
template Status dequantize<fp8_e5m2>(std::span<const fp8_e5m2>, std::span<float>, float, const ConvertOptions&);
template Status dequantize<bf16>(std::span<const bf16>, std::span<float>, float, const ConvertOptions&);
template Status dequantize<fp16>(std::span<const fp16>, std::span<float>, float, const ConvertOptions&);

SLIMSERVE_NAMESPACE_END
