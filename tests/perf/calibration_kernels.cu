// The calibration kernels compiled into an object of the default build, so the SASS report
// reads their sm_90a code next to the library's (tests/perf/CMakeLists.txt).
#include "calibration_kernels.cuh"

namespace slimserve_calibration {
// The wgmma loop at the three widths the shared-memory operand term separates.
template __global__ void ss_wgmma_loop_kernel<16>(float*, int);
template __global__ void ss_wgmma_loop_kernel<32>(float*, int);
template __global__ void ss_wgmma_loop_kernel<64>(float*, int);
}  // namespace slimserve_calibration
