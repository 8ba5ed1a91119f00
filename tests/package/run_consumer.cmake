# cmake -P script: installs slimserve (MODE=install) or points the consumer at the source tree
# (MODE=subdirectory), then configures, builds and runs the consumer. Fails on any error.
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
  set(_mode_args "-DCMAKE_PREFIX_PATH=${PREFIX}")
else()
  set(_mode_args "-DSLIMSERVE_SOURCE_DIR=${SLIMSERVE_SOURCE_DIR}")
endif()
run_step(${CMAKE_COMMAND} -S "${CONSUMER}" -B "${WORK}" -G "${GENERATOR}"
         -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS}" ${_mode_args})
run_step(${CMAKE_COMMAND} --build "${WORK}" --parallel 2)
run_step("${WORK}/consumer")
