# cmake -P script: every fenced code block in DOC that follows a line
#   <!-- snippet: path/relative/to/the/repository -->
# must appear verbatim in that file, so documentation quotes only code that compiles and runs.
file(READ "${DOC}" _doc)
# CMake lists split on ';', which code is full of: compare with a stand-in.
string(REPLACE ";" "<semicolon>" _doc "${_doc}")
string(REGEX MATCHALL "<!-- snippet: [^ ]+ -->\n```[a-z]*\n[^`]*```" _blocks "${_doc}")
list(LENGTH _blocks _count)
if(_count EQUAL 0)
  message(FATAL_ERROR "${DOC}: no snippets found")
endif()
foreach(_block IN LISTS _blocks)
  string(REGEX MATCH "<!-- snippet: ([^ ]+) -->" _ "${_block}")
  set(_source "${ROOT}/${CMAKE_MATCH_1}")
  string(REGEX REPLACE "^<!-- snippet: [^ ]+ -->\n```[a-z]*\n" "" _code "${_block}")
  string(REGEX REPLACE "```$" "" _code "${_code}")
  file(READ "${_source}" _text)
  string(REPLACE ";" "<semicolon>" _text "${_text}")
  string(FIND "${_text}" "${_code}" _at)
  if(_at EQUAL -1)
    message(FATAL_ERROR "${DOC}: a snippet is not in ${_source}:\n${_code}")
  endif()
endforeach()
message(STATUS "${DOC}: ${_count} snippets found in their sources")
