// The calibration kernels compiled into an object of the default build, so the SASS report
// reads their sm_90a code next to the library's (tests/perf/CMakeLists.txt).
#include "calibration_kernels.cuh"
