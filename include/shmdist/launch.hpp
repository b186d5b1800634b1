// Starting a job from inside a program (simulators, tests, benchmarks), without shmrun:
// n ranks as forked processes or as threads of the calling process, each running `fn`
// with its own ProcessGroup. Same fail-fast and cleanup rules as shmrun.
#pragma once

#include <chrono>
#include <optional>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <shmdist/process_group.hpp>

namespace shmdist {

struct LaunchOptions {
  enum class Mode { Processes, Threads };
  Mode mode = Mode::Processes;
  std::uint64_t ring_size = 0;  // bytes per ring; 0 picks the default for the world size
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  // each group's timeout
  std::chrono::milliseconds job_timeout{0};  // > 0: abort the job after this long
  std::chrono::milliseconds grace{2000};     // processes: SIGTERM, then SIGKILL after this
  // Print the hang report (once per stall, without stopping the job) when every rank of a
  // wait-for cycle, or of the job, has been blocked with no progress this long. 0: never.
  // Unset: SHMDIST_HANG_REPORT, else 30 s.
  std::optional<std::chrono::milliseconds> hang_report;
};

struct RankOutcome {
  int rank = -1;
  int exit_code = 0;  // processes: exit status (0 when fn returned); threads: 0, or 1 if it threw
  int signal = 0;     // processes: the signal that ended it, else 0
  std::string error;  // what fn threw ("shmdist::PeerFailure: ..."), empty if it returned
  bool ok() const { return exit_code == 0 && signal == 0 && error.empty(); }
};

// Runs fn(pg) on n ranks and waits for all of them. A rank whose fn throws (or whose process
// dies) fails the job: every call blocked in the other ranks throws PeerFailure, and remaining
// processes are stopped after a grace period. Returns one outcome per rank, in rank order.
std::vector<RankOutcome> launch(int n, const std::function<void(ProcessGroup&)>& fn,
                                const LaunchOptions& options = {});

}  // namespace shmdist
