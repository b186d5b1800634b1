// The hang report: what every rank is doing and waiting for, whether it makes progress, how
// full the rings are, and the wait-for cycle when the ranks deadlock ("rank 0 waits for rank 1,
// rank 1 waits for rank 0"). "Deadlock" is said only when every rank of the cycle is blocked
// and nothing of theirs moved between two snapshots; a stream in flight is "making progress".
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "job/progress.hpp"
#include "segment/segment.hpp"

namespace shmdist::job {

struct RankSnapshot {
  int rank = -1;
  int pid = 0;
  std::uint32_t state = 0;   // segment::RankState
  std::uint32_t op = 0;      // segment::BlockedOp, 0 = not blocked
  int peer = -1;
  std::uint32_t group = 0;
  int tag = 0;
  std::uint64_t bytes = 0;
  std::uint32_t pending_ops = 0;
  std::int64_t blocked_ms = -1;  // how long it has been blocked; -1 if not blocked or unknown
};

// Reads a consistent copy of each rank's blocked-on record (seqlock; retried if torn).
std::vector<RankSnapshot> snapshot_ranks(const segment::Segment& seg);
// now - since in milliseconds, from a rank-written since_ns: -1 for a value that cannot be a
// time in the past (0, negative, in the future), saturated instead of overflowing.
std::int64_t elapsed_ms(std::int64_t now_ns, std::int64_t since_ns);
// The first cycle in the wait-for graph (edges: a rank blocked on one specific peer),
// as the list of ranks in order, or nullopt.
std::optional<std::vector<int>> find_wait_cycle(const std::vector<RankSnapshot>& ranks);

// What a launcher knows beyond the segment: the real pid of each rank (the segment's is
// written by the rank, and 0 before it joins), and how the ranks that ended did end.
struct JobView {
  std::vector<int> pids;           // by rank; 0 = unknown (use the segment's)
  std::vector<std::string> ended;  // by rank; "" while it runs, else "exited with code 3" etc.
  const ProgressTracker* tracker = nullptr;  // for "no progress for N ms"
};

// Prints the report. It takes two snapshots `settle` apart to tell moving ranks from stuck
// ones (the caller's thread sleeps for that long).
void print_hang_report(const segment::Segment& seg, std::ostream& out, const std::string& who,
                       const char* why, const JobView* view = nullptr,
                       std::chrono::milliseconds settle = std::chrono::milliseconds(250));

}  // namespace shmdist::job
