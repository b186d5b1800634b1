// Tries to attach a named shmdist segment through the one named-object path
// (segment/named_object.hpp), as whatever user runs it (the permission test runs it as
// 'nobody' against a segment root created with mode 0600).
//
//   attach_named NAME
//
// Output and exit code: "ATTACHED" (0), "ABSENT" (4: no such name), or
// "ERROR type=T what=..." (3) when attaching was refused.
#include <cerrno>
#include <cstring>
#include <string>

#include <shmdist/errors.hpp>

#include "report.hpp"
#include "segment/named_object.hpp"

using namespace shmdist::programs;

int main(int argc, char** argv) {
  if (argc != 2) {
    emit_err("usage: attach_named NAME");
    return 2;
  }
  return run_main([&] {
    emit("WHO uid=" + std::to_string(getuid()) + " gid=" + std::to_string(getgid()));
    const auto obj =
        shmdist::segment::open_named_object(argv[1], 0, "start the job under another identity");
    if (!obj.invalid.empty()) throw shmdist::SetupError(obj.invalid);
    if (!obj.segment) {  // no such name, or not complete yet
      emit("ABSENT");
      return 4;
    }
    emit("ATTACHED world=" + std::to_string(obj.segment->world_size()));
    return 0;
  });
}
