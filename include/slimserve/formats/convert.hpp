#pragma once
/// \file
/// \brief Bulk host conversions for checkpoint-sized arrays: quantize float/BF16/FP16 to
/// FP8/BF16/FP16 with a scale, and dequantize back to float.
///
///   quantize:   dst[i] = from_float<Out>(to_float(src[i]) / scale)
///   dequantize: dst[i] = to_float(src[i]) * scale
///
/// Each element gets exactly the bits of the scalar conversions (float_formats.hpp); the loops
/// are branch-free per element so the compiler vectorizes them, and arrays above
/// `ConvertOptions::min_elements_per_thread` are split over std::threads. Checks happen before
/// anything is written: sizes must match and the scale must be finite and > 0.

#include <concepts>
#include <cstddef>
#include <span>

#include "slimserve/config.hpp"
#include "slimserve/formats/float_formats.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN

struct ConvertOptions {
  /// Most threads to use; 0 = std::thread::hardware_concurrency().
  unsigned max_threads = 0;
  /// Arrays shorter than this per thread stay on fewer threads (threads cost ~10 us each).
  std::size_t min_elements_per_thread = std::size_t{1} << 20;
};

/// Wide inputs a quantizer reads.
template <class T>
concept quantize_source = std::same_as<T, float> || std::same_as<T, bf16> || std::same_as<T, fp16>;
/// Formats a quantizer writes.
template <class T>
concept quantize_target = float_format<T>;

/// dst[i] = from_float<Out>(to_float(src[i]) / scale); src and dst must be the same length.
template <quantize_source In, quantize_target Out>
Status quantize(std::span<const In> src, std::span<Out> dst, float scale = 1.0f,
                const ConvertOptions& options = {});

/// dst[i] = to_float(src[i]) * scale; src and dst must be the same length.
template <float_format In>
Status dequantize(std::span<const In> src, std::span<float> dst, float scale = 1.0f,
                  const ConvertOptions& options = {});

// Instantiated in the library for every supported pair.
#define SLIMSERVE_DECLARE_QUANTIZE(In, Out)                                               \
  extern template Status quantize<In, Out>(std::span<const In>, std::span<Out>, float, \
                                           const ConvertOptions&);
SLIMSERVE_DECLARE_QUANTIZE(float, fp8_e4m3)
SLIMSERVE_DECLARE_QUANTIZE(float, fp8_e5m2)
SLIMSERVE_DECLARE_QUANTIZE(float, bf16)
SLIMSERVE_DECLARE_QUANTIZE(float, fp16)
SLIMSERVE_DECLARE_QUANTIZE(bf16, fp8_e4m3)
SLIMSERVE_DECLARE_QUANTIZE(bf16, fp8_e5m2)
SLIMSERVE_DECLARE_QUANTIZE(bf16, bf16)
SLIMSERVE_DECLARE_QUANTIZE(bf16, fp16)
SLIMSERVE_DECLARE_QUANTIZE(fp16, fp8_e4m3)
SLIMSERVE_DECLARE_QUANTIZE(fp16, fp8_e5m2)
SLIMSERVE_DECLARE_QUANTIZE(fp16, bf16)
SLIMSERVE_DECLARE_QUANTIZE(fp16, fp16)
#undef SLIMSERVE_DECLARE_QUANTIZE
extern template Status dequantize<fp8_e4m3>(std::span<const fp8_e4m3>, std::span<float>, float,
                                            const ConvertOptions&);
extern template Status dequantize<fp8_e5m2>(std::span<const fp8_e5m2>, std::span<float>, float,
                                            const ConvertOptions&);
extern template Status dequantize<bf16>(std::span<const bf16>, std::span<float>, float,
                                        const ConvertOptions&);
extern template Status dequantize<fp16>(std::span<const fp16>, std::span<float>, float,
                                        const ConvertOptions&);

SLIMSERVE_NAMESPACE_END
