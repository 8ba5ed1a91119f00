// Host side of the consumer: plain C++20, no CUDA compiler needed for these headers.
#include <cstdio>

#include <slimserve/version.hpp>

int consumer_kernel_check();  // kernels.cu

int main() {
  const auto linked = slimserve::linked_version();
  if (linked.major != slimserve::version.major || linked.minor != slimserve::version.minor) {
    std::printf("header/library version mismatch\n");
    return 1;
  }
  std::printf("slimserve %d.%d.%d found; kernel headers compiled: %d\n", linked.major,
              linked.minor, linked.patch, consumer_kernel_check());
  return 0;
}
