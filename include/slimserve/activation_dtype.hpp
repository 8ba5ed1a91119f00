#pragma once
/// \file
/// \brief The element type of activations, one enum for every component: attention's queries,
/// outputs and new K/V, and the INT4 GEMM's A, C, bias, scales and zeros.
///
/// `attention::ActivationDtype` and `int4::ActivationType` are aliases of this type, so code
/// written against either name keeps compiling and the two components accept each other's
/// values. Values that come from outside (a cast integer, a C or Python caller) are checked
/// with `is_valid` at every façade's preflight.

#include <cstdint>
#include <string_view>

#include "slimserve/config.hpp"

SLIMSERVE_NAMESPACE_BEGIN

enum class ActivationDtype : std::uint8_t { bf16, fp16 };

constexpr bool is_valid(ActivationDtype dtype) noexcept {
  return dtype == ActivationDtype::bf16 || dtype == ActivationDtype::fp16;
}

constexpr std::string_view to_string(ActivationDtype dtype) noexcept {
  switch (dtype) {
    case ActivationDtype::bf16: return "bf16";
    case ActivationDtype::fp16: return "fp16";
  }
  return "unknown";
}

SLIMSERVE_NAMESPACE_END
