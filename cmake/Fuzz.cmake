# SHMDIST_FUZZ: instrument the whole tree for libFuzzer (coverage) with AddressSanitizer and
# UndefinedBehaviorSanitizer, and build the targets in tests/fuzz. Needs clang; scripts/fuzz
# configures a separate build directory this way and runs the targets.
if(NOT SHMDIST_FUZZ)
  return()
endif()
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "SHMDIST_FUZZ=ON needs clang (libFuzzer): configure with "
                      "-DCMAKE_CXX_COMPILER=clang++, or use scripts/fuzz")
endif()
if(NOT SHMDIST_SANITIZE STREQUAL "")
  message(FATAL_ERROR "SHMDIST_FUZZ=ON brings its own sanitizers: leave SHMDIST_SANITIZE empty")
endif()
add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                    -fno-omit-frame-pointer -g)
add_link_options(-fsanitize=address,undefined)
