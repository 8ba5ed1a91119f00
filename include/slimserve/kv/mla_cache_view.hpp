#pragma once
/// \file
/// \brief A non-owning view of a paged MLA latent cache (Kimi K2 / DeepSeek-V3 family):
/// geometry, token record layout, scales and capacity arithmetic.
///
/// Multi-head latent attention caches one compressed vector per token (the latent, 512 values)
/// plus its rotary part (64 values), shared by every query head. Pages are
/// [num_pages, page_size, token_bytes]: each token is one contiguous record.
///
///   BF16                          [512 x bf16 latent][64 x bf16 rope]                 1152 B
///   FP8 e4m3, per_token_group     [512 x e4m3 latent][4 x f32 scales][64 x bf16 rope]  656 B
///   FP8 e4m3, per_tensor          [512 x e4m3 latent][64 x bf16 rope]                  640 B
///   NVFP4, per_tensor             [256 B e2m1 codes][32 x e4m3 block scales][64 x bf16 rope]  416 B
///
/// per_token_group: one float scale per 128 latent values of each token (amax / 448), as
/// FlashMLA stores it; per_tensor: one calibrated float in device memory (read at execution
/// time, so a captured CUDA graph sees updates). NVFP4's latent is one NVFP4 head vector of
/// 512 (the KV cache's layout, kv_format.hpp: two codes a byte, element 2i in the low nibble,
/// then one E4M3 scale per 16 values computed at append time); its per_tensor float is the
/// tensor scale (the largest value stored is 6 x 448 x scale). The rope part is always BF16
/// and unscaled.
/// Scale convention as everywhere in slimserve: stored = RNE-saturate(real / scale),
/// real = stored * scale. Plain C++: usable by host code that never includes a CUDA header.

#include <cstdint>
#include <string_view>

#include "slimserve/config.hpp"
#include "slimserve/kv/kv_cache_view.hpp"
#include "slimserve/status.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention {

/// The shapes the MLA kernels support (DeepSeek-V3 / Kimi K2: kv_lora_rank 512, rope 64).
inline constexpr std::int32_t mla_latent_dim = 512;
inline constexpr std::int32_t mla_rope_dim = 64;
inline constexpr std::int32_t mla_qk_dim = mla_latent_dim + mla_rope_dim;  // 576
/// Latent values per FP8 group scale.
inline constexpr std::int32_t mla_scale_group = 128;
inline constexpr std::int32_t mla_scale_groups = mla_latent_dim / mla_scale_group;  // 4

enum class MlaScaleMode : std::uint8_t { none, per_tensor, per_token_group };

constexpr std::string_view to_string(MlaScaleMode mode) noexcept {
  switch (mode) {
    case MlaScaleMode::none: return "none";
    case MlaScaleMode::per_tensor: return "per_tensor";
    case MlaScaleMode::per_token_group: return "per_token_group";
  }
  return "unknown";
}

/// The (latent type, scale mode) pairs of an MLA cache: bf16 + none, fp8_e4m3 + per_tensor or
/// per_token_group, nvfp4 + per_tensor (its tensor scale; the block scales are in the record).
constexpr bool mla_format_supported(KvDtype dtype, MlaScaleMode mode) noexcept {
  switch (dtype) {
    case KvDtype::bf16: return mode == MlaScaleMode::none;
    case KvDtype::fp8_e4m3: return mode == MlaScaleMode::per_tensor || mode == MlaScaleMode::per_token_group;
    case KvDtype::nvfp4: return mode == MlaScaleMode::per_tensor;
    default: return false;
  }
}

/// Byte layout of one token record; every offset is a multiple of 16.
struct MlaTokenLayout {
  std::int32_t latent_offset = 0;
  std::int32_t scales_offset = 0;  ///< per_token_group only (else == rope_offset)
  std::int32_t rope_offset = 0;
  std::int32_t token_bytes = 0;
};

constexpr MlaTokenLayout mla_token_layout(KvDtype dtype, MlaScaleMode mode) noexcept {
  MlaTokenLayout l;
  l.latent_offset = 0;
  // The latent's codes and, for a block-scaled format (NVFP4), its in-vector block scales.
  l.scales_offset = static_cast<std::int32_t>(head_vector_bytes(dtype, mla_latent_dim));
  const std::int32_t scale_bytes =
      mode == MlaScaleMode::per_token_group ? mla_scale_groups * static_cast<std::int32_t>(sizeof(float)) : 0;
  l.rope_offset = l.scales_offset + scale_bytes;
  l.token_bytes = l.rope_offset + mla_rope_dim * 2;
  return l;
}
static_assert(mla_token_layout(KvDtype::fp8_e4m3, MlaScaleMode::per_token_group).token_bytes == 656,
              "FlashMLA's FP8 record: 512 + 16 + 128 bytes");
static_assert(mla_token_layout(KvDtype::bf16, MlaScaleMode::none).token_bytes == 1152);
static_assert(mla_token_layout(KvDtype::nvfp4, MlaScaleMode::per_tensor).token_bytes == 416,
              "256 code bytes + 32 block scales + 128 rope bytes");

struct MlaCacheView {
  void* pages = nullptr;                ///< [num_pages, page_size, token_bytes]
  const float* latent_scale = nullptr;  ///< per_tensor: one device float
  std::int32_t num_pages = 0;
  std::int32_t page_size = 0;
  std::int32_t latent_dim = mla_latent_dim;  ///< must be 512
  std::int32_t rope_dim = mla_rope_dim;      ///< must be 64
  KvDtype dtype = KvDtype::bf16;             ///< latent type: bf16, fp8_e4m3 or nvfp4
  MlaScaleMode scale_mode = MlaScaleMode::none;

  constexpr MlaTokenLayout token_layout() const noexcept { return mla_token_layout(dtype, scale_mode); }
  /// Bytes of the page array.
  constexpr std::int64_t bytes() const noexcept {
    return static_cast<std::int64_t>(num_pages) * page_size * token_layout().token_bytes;
  }
};

/// Bytes of one cached token (latent + scales + rope).
constexpr std::int64_t mla_bytes_per_token(KvDtype dtype, MlaScaleMode mode) noexcept {
  return mla_token_layout(dtype, mode).token_bytes;
}

/// Tokens of one layer that fit in `bytes` of cache (whole pages).
constexpr std::int64_t mla_tokens_in(std::int64_t bytes, KvDtype dtype, MlaScaleMode mode,
                                     std::int32_t page_size) noexcept {
  const std::int64_t page_bytes = mla_bytes_per_token(dtype, mode) * page_size;
  return bytes / page_bytes * page_size;
}

/// Pages of `page_size` tokens a model of `num_layers` MLA layers can hold in `bytes` (each
/// layer has its own page array; one page id addresses the same slot in every layer).
constexpr std::int64_t mla_pages_for_model(std::int64_t bytes, KvDtype dtype, MlaScaleMode mode,
                                           std::int32_t page_size, std::int32_t num_layers) noexcept {
  return bytes / (mla_bytes_per_token(dtype, mode) * page_size * num_layers);
}

/// Why (dtype, mode) is not an MLA cache format, by mla_format_supported's rule: unsupported
/// for a latent type MLA has no kernels for, invalid_argument for a scale mode the type does not
/// take (the one message the cache view and the decode problem both give).
Status check_mla_format(KvDtype dtype, MlaScaleMode mode);

/// Shape, type, scale and pointer checks of a view (the page contents are not read).
Status validate_mla_cache_view(const MlaCacheView& cache);

}  // namespace attention
SLIMSERVE_NAMESPACE_END
