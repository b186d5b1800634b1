# Warnings on everywhere; SHMDIST_WERROR makes them errors. Sanitizer flags for the whole tree.
add_library(shmdist_warnings INTERFACE)
target_compile_options(shmdist_warnings INTERFACE -Wall -Wextra -Wshadow -Wnon-virtual-dtor
                       -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wpedantic
                       -Wimplicit-fallthrough)
if(SHMDIST_WERROR)
  target_compile_options(shmdist_warnings INTERFACE -Werror)
endif()

if(SHMDIST_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
elseif(SHMDIST_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
  # GCC warns that ThreadSanitizer does not model std::atomic_thread_fence. Our seq_cst fences
  # order two store-buffering handshakes, the doorbell's (wait/doorbell.hpp) and the ready
  # hints' (ShmTransport::notify_after_publishing, clear_hint_if_empty), and release/acquire
  # fences order the blocked-on seqlock (set_blocked, job::snapshot_ranks). Every access those
  # fences order is atomic, and every data hand-off is a release/acquire pair on an atomic,
  # which TSan does check; what it cannot check is a missed wake-up or a torn snapshot, which
  # the stress tests look for. So the warning is expected.
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-Wno-tsan SHMDIST_HAVE_WNO_TSAN)
  if(SHMDIST_HAVE_WNO_TSAN)
    add_compile_options(-Wno-tsan)
  endif()
elseif(NOT SHMDIST_SANITIZE STREQUAL "")
  message(FATAL_ERROR "SHMDIST_SANITIZE must be '', 'address' or 'thread', not '${SHMDIST_SANITIZE}'")
endif()
