# Project-only options: on when slimserve is the top-level project, off when an engine pulls it
# in with add_subdirectory, so consumers get no tests, flags or sanitizers forced on them.
include(CMakeDependentOption)

set(_slimserve_top_level ${PROJECT_IS_TOP_LEVEL})

option(SLIMSERVE_BUILD_TESTS "Build slimserve's tests" ${_slimserve_top_level})
option(SLIMSERVE_BUILD_EXAMPLES "Build slimserve's examples" ${_slimserve_top_level})
option(SLIMSERVE_BUILD_BENCHMARKS "Build slimserve's benchmarks" ${_slimserve_top_level})
# The CPU-emulated build of every kernel (slimserve::emulated). On for the top-level project
# (tests, demo and benchmarks link it); an engine using add_subdirectory turns it on to run its
# own tests without a GPU. Forced on when anything of slimserve's own needs it.
option(SLIMSERVE_BUILD_EMULATED "Build slimserve::emulated, every kernel on the CPU emulator"
       ${_slimserve_top_level})
if(SLIMSERVE_BUILD_TESTS OR SLIMSERVE_BUILD_EXAMPLES OR SLIMSERVE_BUILD_BENCHMARKS)
  set(SLIMSERVE_BUILD_EMULATED ON)
endif()
option(SLIMSERVE_BUILD_C_API
  "Build the C ABI shared libraries (slimserve_c, and slimserve_c_emulated with the emulated build)"
  ${_slimserve_top_level})
cmake_dependent_option(SLIMSERVE_BUILD_GPU_TESTS
  "Also build the kernel tests with nvcc (they report skipped without a GPU)" ON
  "SLIMSERVE_BUILD_TESTS" OFF)
cmake_dependent_option(SLIMSERVE_BUILD_PACKAGE_TEST
  "Test the installed package with an out-of-tree consumer" ON "SLIMSERVE_BUILD_TESTS" OFF)
option(SLIMSERVE_WERROR "Treat warnings as errors in slimserve's own targets" ${_slimserve_top_level})
# The emulated kernel units and the CPU tests are test vehicles: at -O1 they compile in about a
# third of -O3's time (a paged attention unit: 18 s vs 53 s of CPU) and the tests still run in
# seconds, so CI spends its time testing rather than optimizing test code. Only the top-level
# build's Release configuration uses it; an engine's build of slimserve::emulated keeps its flags.
set(SLIMSERVE_TEST_VEHICLE_OPT "$<$<AND:$<CONFIG:Release>,$<BOOL:${_slimserve_top_level}>>:-O1>"
    CACHE STRING "Extra optimization flag for the emulated kernel units and the CPU tests (empty: none)")
set(SLIMSERVE_SANITIZE "" CACHE STRING
    "Sanitizers for the CPU-emulated and host targets: '', 'address,undefined' or 'thread'")
set_property(CACHE SLIMSERVE_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")
set(SLIMSERVE_GPU_TEST_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" CACHE STRING
    "CUDA architectures for the GPU test binaries (default: CMAKE_CUDA_ARCHITECTURES)")
