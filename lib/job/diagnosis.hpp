// The hang report: what every rank is doing and waiting for, how full the rings are, and the
// wait-for cycle when the ranks deadlock ("rank 0 waits for rank 1, rank 1 waits for rank 0").
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

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
  double blocked_seconds = 0;
};

// Reads a consistent copy of each rank's blocked-on record (seqlock; retried if torn).
std::vector<RankSnapshot> snapshot_ranks(const segment::Segment& seg);
// The first cycle in the wait-for graph (edges: a rank blocked on one specific peer),
// as the list of ranks in order, or nullopt.
std::optional<std::vector<int>> find_wait_cycle(const std::vector<RankSnapshot>& ranks);
void print_hang_report(const segment::Segment& seg, std::ostream& out, const std::string& who,
                       const char* why);

}  // namespace shmdist::job
