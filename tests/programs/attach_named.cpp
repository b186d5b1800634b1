// Tries to attach a named shmdist segment, as whatever user runs it (the permission test
// runs it as 'nobody' against a segment root created with mode 0600).
//
//   attach_named NAME
//
// Output and exit code: "ATTACHED" (0), "ABSENT" (4: no such name), or
// "ERROR type=T what=..." (3) when attaching was refused.
#include <cerrno>
#include <cstring>
#include <string>

#include "report.hpp"
#include "segment/segment.hpp"

using namespace shmdist::programs;

int main(int argc, char** argv) {
  if (argc != 2) {
    emit_err("usage: attach_named NAME");
    return 2;
  }
  return run_main([&] {
    emit("WHO uid=" + std::to_string(getuid()) + " gid=" + std::to_string(getgid()));
    const auto seg = shmdist::segment::Segment::attach_name(argv[1], 0);
    if (!seg.valid()) {
      emit("ABSENT");
      return 4;
    }
    emit("ATTACHED world=" + std::to_string(seg.world_size()));
    return 0;
  });
}
