# cmake -P script: every dynamic symbol the C library defines is a slimserve_* function under
# the version node SLIMSERVE_C_1 (no C++ symbol leaks out).
find_program(READELF readelf REQUIRED)
execute_process(COMMAND ${READELF} --dyn-syms --wide "${LIBRARY}" OUTPUT_VARIABLE _symbols
                RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "readelf failed on ${LIBRARY}")
endif()
string(REPLACE "\n" ";" _lines "${_symbols}")
set(_exported 0)
foreach(_line IN LISTS _lines)
  # Defined (section index not UND), global or weak, default visibility.
  if(_line MATCHES "^ *[0-9]+: [0-9a-f]+ +[0-9]+ +(FUNC|OBJECT) +(GLOBAL|WEAK) +DEFAULT +[0-9]+ +([^ ]+)")
    set(_name "${CMAKE_MATCH_3}")
    if(NOT _name MATCHES "^slimserve_[a-z0-9_]+@@SLIMSERVE_C_1$")
      message(FATAL_ERROR "unexpected export: ${_name}")
    endif()
    math(EXPR _exported "${_exported} + 1")
  endif()
endforeach()
if(_exported LESS 40)
  message(FATAL_ERROR "only ${_exported} slimserve_* exports found")
endif()
message(STATUS "${_exported} exports, all slimserve_*@@SLIMSERVE_C_1")
