// The job-wide state in a segment: recording the first failure, aborting the job, and the
// words users read about it. Shared by ranks (which detect vanished peers) and launchers
// (which see exit statuses).
#pragma once

#include <cstdint>
#include <string>

#include "segment/segment.hpp"

namespace shmdist::segment {

// "SIGKILL" for 9, "signal 77" for unknown numbers.
std::string signal_name(int sig);
// "exited with code 3", "was killed by signal 9 (SIGKILL)", ...
std::string describe_end(EndKind kind, int code);
// "rank 3 (pid 1234) was killed by signal 9 (SIGKILL)", from the rank's control block.
std::string describe_rank_end(const Segment& seg, int rank);
// The PeerFailure text for an aborted job, naming the first failed rank and how it ended.
std::string describe_job_failure(const Segment& seg);

// Records how `rank` ended in its control block (launchers call this for every exit).
void record_rank_end(const Segment& seg, int rank, EndKind kind, int code);
// Makes `rank` the job's failed rank unless an earlier failure is recorded, marks the job
// aborted and wakes every rank. Returns true if this call recorded the first failure.
// rank -1: aborts the job without naming a rank (launcher timeout, signal, shared identity);
// the abort is then the first failure unless a rank's was recorded before (failed_rank
// becomes kAbortedFirst, and a rank that ends afterwards is not named as the cause). A record that
// only says the rank is gone (Vanished) takes the exact end from the rank's control block
// when the launcher has written it there, and is completed by a later call that says how.
// A rank with a recorded root cause (record_failure_cause) whose end is unknown is replaced
// by that cause; one that exited non-zero or threw is kept, and describe_job_failure names
// the cause after it; a signal is its own root cause.
bool record_job_failure(const Segment& seg, int rank, EndKind kind, int code);
// Records (once) that `rank` raises PeerFailure because `cause` finalized or exited: a later
// failure of `rank` is blamed on, or described with, `cause` (RankControl::failed_because).
void record_failure_cause(const Segment& seg, int rank, int cause);
// The rank at the end of `rank`'s "failed because" chain (`rank` itself if none).
int root_cause(const Segment& seg, int rank);
// Aborts the job without a failed rank (a launcher's --timeout, a failed start) and wakes
// every rank; their blocked calls throw PeerFailure saying why.
void record_job_abort(const Segment& seg, AbortReason reason);
// Wakes every rank's doorbell unconditionally (abort, launcher timeout).
void wake_all(const Segment& seg);

std::int64_t wall_clock_ns();

}  // namespace shmdist::segment
