// slimserve end-to-end demo, on the CPU kernel emulator (no GPU needed). Each section is one
// component, in the order an engine meets them: numeric formats and KV capacity; tagged KV
// pages (a stale page caught by the GPU tag check); an FP8 decode loop (append, tag check,
// attention); an MLA latent cache (Kimi K2-like capacity and a decode step); an INT4 W4A16
// GEMM and an INT4 mixture-of-experts layer.
#include <fmt/core.h>

#include "slimserve/version.hpp"

int demo_formats();
int demo_kv();
int demo_attention();
int demo_prefill();
int demo_mla();
int demo_int4();
int demo_int4_moe();

int main() {
  fmt::print("slimserve {}.{}.{} demo (kernels run on the CPU emulator)\n\n",
             slimserve::version.major, slimserve::version.minor, slimserve::version.patch);
  struct Section {
    const char* title;
    int (*run)();
  };
  const Section sections[] = {
      {"Numeric formats and KV capacity", demo_formats},
      {"Tagged KV pages", demo_kv},
      {"FP8 paged KV cache: decode loop", demo_attention},
      {"FP8 paged KV cache: chunked prefill, then decode (tensor-core kernel)", demo_prefill},
      {"MLA latent cache (Kimi K2-like): capacity and a decode step", demo_mla},
      {"INT4 weights: W4A16 GEMM", demo_int4},
      {"INT4 weights: mixture-of-experts layer", demo_int4_moe},
  };
  int failures = 0;
  for (const Section& section : sections) {
    fmt::print("=== {}\n", section.title);
    const int rc = section.run();
    if (rc != 0) {
      fmt::print("*** section failed (exit {})\n", rc);
      ++failures;
    }
    fmt::print("\n");
  }
  return failures == 0 ? 0 : 1;
}
