# cmake -DFILE=<source> "-DALLOWED=base;job" -P check_front_end.cmake
# A front end (launcher/shmrun.cpp) includes the public headers (<shmdist/...>) and, of lib/,
# only the folders in ALLOWED: this fails naming every other `#include "<folder>/..."` in FILE.
cmake_minimum_required(VERSION 3.20)
file(STRINGS ${FILE} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
set(bad "")
foreach(line IN LISTS lines)
  if(line MATCHES "\"([^/\"]+)/")
    if(NOT CMAKE_MATCH_1 IN_LIST ALLOWED)
      string(APPEND bad "\n  ${line}")
    endif()
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "${FILE} reaches below the layers it may use (${ALLOWED}, and the public "
                      "headers <shmdist/...>):${bad}\nUse a public header, or what base/ or job/ "
                      "offer (docs/layout.md).")
endif()
message(STATUS "${FILE}: includes only <shmdist/...> and ${ALLOWED}")
