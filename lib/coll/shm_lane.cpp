// ShmLane: the round protocol (orderings explained in shm_lane.hpp).

#include "coll/shm_lane.hpp"

#include <algorithm>

#include "segment/doorbells.hpp"
#include "wait/fence.hpp"

namespace shmdist::coll {

ShmLane::ShmLane(std::shared_ptr<segment::Segment> segment, int rank, int cpus)
    : seg_(std::move(segment)),
      rank_(rank),
      world_(seg_->world_size()),
      slot_size_(seg_->geometry().coll_slot_size),
      cpus_(std::max(1, cpus)) {
  for (int r = 0; r < world_; ++r)
    for (int parity = 0; parity < 2; ++parity) slots_.push_back(seg_->coll_slot(r, parity));
  for (int r = 0; r < world_; ++r)
    if (r != rank_) peers_.push_back(r);
  notifier_ = segment::notifier_of(*seg_, wait::register_asymmetric_fences());
  // A rank joining a job starts where its own flags are (0 in a fresh segment). Relaxed: only
  // this rank ever stores them.
  round_ = std::max(head(rank_, 0).round.load(std::memory_order_relaxed),
                    head(rank_, 1).round.load(std::memory_order_relaxed));
}

void ShmLane::awaited(std::vector<int>& out) const {
  for (int j = 0; j < world_; ++j)
    if (j != rank_ && head(j, round_ & 1).round.load(std::memory_order_acquire) < round_)
      out.push_back(j);
}

// The notifier half of the doorbell protocol (wait/notifier.hpp), after the release store of
// the round flag that the peers' progress loops re-check after arming.
void ShmLane::wake_peers() { notifier_.notify(peers_); }

}  // namespace shmdist::coll
