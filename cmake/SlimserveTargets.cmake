# Helpers shared by slimserve's own targets (never applied to consumers).

# Warnings for a target of the project itself; errors when SLIMSERVE_WERROR is on.
function(slimserve_project_flags target)
  set(_cxx_warnings -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion)
  if(SLIMSERVE_WERROR)
    list(APPEND _cxx_warnings -Werror)
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${_cxx_warnings}>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall>)
  if(SLIMSERVE_WERROR)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
endfunction()

# Sanitizer flags for CPU-side targets (emulated kernels, host code, tests).
function(slimserve_sanitize target)
  if(SLIMSERVE_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${SLIMSERVE_SANITIZE}
                                             -fno-omit-frame-pointer -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=${SLIMSERVE_SANITIZE})
  endif()
endfunction()

# Compiles CUDA sources as plain C++ against the CPU emulator: a wrapper .cpp per source that
# #includes it (a source file's LANGUAGE is per directory, so the .cu itself cannot be reused).
function(slimserve_emulated_sources out_var)
  set(_wrappers)
  foreach(_source IN LISTS ARGN)
    get_filename_component(_abs "${_source}" ABSOLUTE)
    file(RELATIVE_PATH _rel "${PROJECT_SOURCE_DIR}" "${_abs}")
    string(MAKE_C_IDENTIFIER "${_rel}" _id)
    set(_wrapper "${CMAKE_CURRENT_BINARY_DIR}/emulated/${_id}.cpp")
    file(CONFIGURE OUTPUT "${_wrapper}"
         CONTENT "// Generated: ${_rel} compiled as C++ for the CPU kernel emulator.\n#include \"${_abs}\"\n")
    list(APPEND _wrappers "${_wrapper}")
  endforeach()
  if(SLIMSERVE_TEST_VEHICLE_OPT)
    set_source_files_properties(${_wrappers} PROPERTIES COMPILE_OPTIONS "${SLIMSERVE_TEST_VEHICLE_OPT}")
  endif()
  set(${out_var} ${_wrappers} PARENT_SCOPE)
endfunction()
