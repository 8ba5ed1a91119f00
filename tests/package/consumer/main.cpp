// Host side of the consumer: plain C++20, no CUDA compiler and no CUDA headers needed, even
// for the kv façade that schedules device work (tag check, device tag array, page tables).
#include <cstdio>

#include <slimserve/attention/decode.hpp>
#include <slimserve/int4/gemm.hpp>
#include <slimserve/kv/device_page_table.hpp>
#include <slimserve/kv/tag_check.hpp>
#include <slimserve/version.hpp>

int consumer_kernel_check();  // kernels.cu

int main() {
  const auto linked = slimserve::linked_version();
  if (linked.major != slimserve::version.major || linked.minor != slimserve::version.minor) {
    std::printf("header/library version mismatch\n");
    return 1;
  }
  // A host-only call into the library: preflight refuses a tag check without a tag array.
  const slimserve::Status refused = slimserve::kv::can_implement(slimserve::kv::TagCheckArguments{});
  if (refused.code() != slimserve::StatusCode::invalid_argument) {
    std::printf("tag-check preflight accepted empty arguments\n");
    return 1;
  }
  std::printf("slimserve %d.%d.%d found; GPUs: %d; kernel headers compiled: %d\n", linked.major,
              linked.minor, linked.patch, slimserve::rt::device_count(), consumer_kernel_check());
  return 0;
}
