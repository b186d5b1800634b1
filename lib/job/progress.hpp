// Watching a job for progress without its help: each rank's own writes to the segment (its
// state, its blocked-on record's version, the tails of the rings it consumes and the heads of
// the rings it produces) form a signature; a rank whose signature does not change makes no
// progress. Also whether its process is stopped (SIGSTOP, /proc/<pid>/stat state T).
//
// The watchdog (JobSupervisor, launch()) decides from this when a job hangs: every rank of a
// wait-for cycle, or every rank of the job, blocked (or stopped, or not joined) with no
// progress for a configured time.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "segment/segment.hpp"

namespace shmdist::job {

enum class ProcState { Unknown, Running, Stopped, Gone };
// The state of `pid` from /proc/<pid>/stat (R/S/D running, T/t stopped, Z/X or absent gone).
ProcState process_state(int pid);

struct ProgressSample {
  std::vector<std::uint64_t> signature;  // by rank
  std::vector<ProcState> proc;           // by rank
};

// pids: by rank, 0 = take the pid the rank published in the segment.
ProgressSample sample_progress(const segment::Segment& seg, const std::vector<int>& pids);

class ProgressTracker {
 public:
  using Clock = std::chrono::steady_clock;
  void observe(const ProgressSample& sample, Clock::time_point now);
  bool observed_twice() const { return observations_ >= 2; }
  // Whether the rank's signature changed at the last observation.
  bool moved_last(int rank) const;
  // How long the rank's signature has not changed (zero before two observations).
  Clock::duration still_for(int rank, Clock::time_point now) const;
  ProcState proc(int rank) const;
  int world() const { return static_cast<int>(last_.signature.size()); }

 private:
  ProgressSample last_;
  std::vector<Clock::time_point> changed_at_;
  std::vector<bool> moved_;
  long observations_ = 0;
};

// The watchdog's verdict: empty if the job does not look hung, else why it does ("ranks 0, 1
// wait for each other"). `pids` as for sample_progress; ended ranks have `ended[r]` true.
std::string hang_verdict(const segment::Segment& seg, const ProgressTracker& tracker,
                         const std::vector<bool>& ended, std::chrono::steady_clock::time_point now,
                         std::chrono::milliseconds after);

}  // namespace shmdist::job
