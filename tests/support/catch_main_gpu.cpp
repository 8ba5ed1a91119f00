// Catch2 main for the GPU test binaries: with no GPU present the binary exits 77, which CTest
// reports as "skipped" (SKIP_RETURN_CODE), never as passed.
#include <cstdio>

#include "slimserve/runtime/memory.hpp"
#include "support/catch_session.hpp"

int main(int argc, char* argv[]) {
  if (slimserve::rt::device_count() == 0) {
    std::puts("SLIMSERVE_SKIP: no CUDA device on this machine; GPU test skipped");
    return 77;
  }
  return slimserve_test::run_catch_session(argc, argv);
}
