#pragma once
/// \file
/// \brief How the wgmma MLA kernel's FP8 widening rounds the latent (plain C++, so host-side
/// references can model the same rounding): each token's group scales split as
/// scale_g = 2^e x m_g, e the exponent of the token's largest scale clamped to
/// [mla_min_token_exponent, mla_max_token_exponent], and the tile holds
/// fp16(code x fp16(m_g)); 2^e is applied in FP32 to S and P. The range keeps the P copy,
/// P x 2^e x 2^8, in fp16's normal range (2^-14 .. 2^15 for P = 1).

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN
namespace attention::kernels {

inline constexpr int mla_min_token_exponent = -22;
inline constexpr int mla_max_token_exponent = 7;

}  // namespace attention::kernels
SLIMSERVE_NAMESPACE_END
