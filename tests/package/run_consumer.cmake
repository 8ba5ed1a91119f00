# cmake -P script: installs slimserve (MODE=install) or points the consumer at the source tree
# (MODE=subdirectory), then configures, builds and runs the consumer: the GPU build's host and
# kernel sides, and the emulated build (C++ engine loop, C ABI test). Fails on any error.
function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "step failed (${_rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK}")
if(MODE STREQUAL "install")
  file(REMOVE_RECURSE "${PREFIX}")
  run_step(${CMAKE_COMMAND} --install "${SLIMSERVE_BINARY_DIR}" --prefix "${PREFIX}")
  set(_mode_args "-DCMAKE_PREFIX_PATH=${PREFIX}" "-DCMAKE_BUILD_TYPE=Release")
else()
  # This build only proves that the sources compile for the consumer's architecture (its kernels
  # never run here): cicc's optimizer is two thirds of nvcc's time and checks nothing the front
  # end does not, so it is turned off. No build type either, so no -O for the host compiler: the
  # optimized host code is the release build's to check (155 -> 121 s of CPU for this test).
  set(_mode_args "-DSLIMSERVE_SOURCE_DIR=${SLIMSERVE_SOURCE_DIR}" "-DCMAKE_CUDA_FLAGS=-Xcicc -O0"
                 "-DCMAKE_BUILD_TYPE=")
endif()
run_step(${CMAKE_COMMAND} -S "${CONSUMER}" -B "${WORK}" -G "${GENERATOR}"
         "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS}" ${_mode_args}
         "-DENGINE_LOOP_SOURCE=${ENGINE_LOOP_SOURCE}" "-DC_API_TEST_SOURCE=${C_API_TEST_SOURCE}")
if(MODE STREQUAL "install")
  run_step(${CMAKE_COMMAND} --build "${WORK}" --parallel 2)
  run_step("${WORK}/consumer")
  # slimserve::emulated and the emulated C ABI: the engine loop and the C test on the CPU.
  run_step("${WORK}/consumer_emulated")
  run_step("${WORK}/consumer_c")
else()
  # Under add_subdirectory the emulated targets are configured (the switch and the aliases
  # resolve) but only the GPU consumer is built: building the emulated library a second time
  # would add minutes to CI and prove nothing the installed-package run does not.
  run_step(${CMAKE_COMMAND} --build "${WORK}" --parallel 2 --target consumer)
  run_step("${WORK}/consumer")
endif()
