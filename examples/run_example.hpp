// The two ways the larger examples run, in one place:
//   shmrun -n 4 examples/NAME               ranks started by the launcher: this process is one
//   examples/NAME --ranks 4 [--threads]      the example starts its own ranks (launch())
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <shmdist/shmdist.hpp>

namespace example {

// `simulate` runs on every rank and says whether its result is right; `ranks_ok` (if given)
// says whether the example can run on that many ranks, printing why not.
inline int run(const char* name, int argc, char** argv, bool (*simulate)(shmdist::ProcessGroup&),
               bool (*ranks_ok)(int ranks) = nullptr) {
  namespace dist = shmdist;
  int ranks = 4;
  bool threads = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads")) threads = true;
    else {
      std::fprintf(stderr, "usage: %s [--ranks N] [--threads]   (or: shmrun -n N %s)\n", argv[0],
                   argv[0]);
      return 2;
    }
  }
  if (std::getenv("SHMDIST_SEGMENT_FD")) {  // started by shmrun: this process is one rank
    dist::ProcessGroup pg;                   // joins the job from the launcher's environment
    if (ranks_ok && !ranks_ok(pg.get_world_size())) return 2;
    const bool ok = simulate(pg);
    pg.destroy();
    return ok ? 0 : 1;
  }
  if (ranks_ok && !ranks_ok(ranks)) return 2;
  dist::LaunchOptions options;
  options.mode = threads ? dist::LaunchOptions::Mode::Threads : dist::LaunchOptions::Mode::Processes;
  const auto outcomes = dist::launch(ranks, [simulate](dist::ProcessGroup& pg) {
    if (!simulate(pg)) throw dist::Error("the distributed result differs");
  }, options);
  int failed = 0;
  for (const auto& o : outcomes) {
    if (o.ok()) continue;
    std::fprintf(stderr, "%s: rank %d failed: %s\n", name, o.rank, o.error.c_str());
    ++failed;
  }
  return failed ? 1 : 0;
}

}  // namespace example
