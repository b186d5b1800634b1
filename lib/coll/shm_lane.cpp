// ShmLane: the round protocol (orderings explained in shm_lane.hpp).

#include "coll/shm_lane.hpp"

#include <algorithm>

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
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    segment::RankControl& rc = seg_->rank_control(r);
    doorbells_.push_back({&rc.doorbell_seq, &rc.armed, &rc.heavy_fences});
  }
  asymmetric_fences_ = wait::register_asymmetric_fences();
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

// F_n of the doorbell protocol: light (a compiler barrier) only when this process registered
// for membarrier and every peer arms with a heavy fence (wait/fence.hpp has the argument),
// else a full seq_cst fence.
void ShmLane::wake_peers() {
  bool light = asymmetric_fences_;
  for (std::size_t i = 0; light && i < doorbells_.size(); ++i)
    light = doorbells_[i].heavy->load(std::memory_order_relaxed) != 0;
  wait::notifier_fence(light);
  for (const wait::DoorbellWords& words : doorbells_) wait::wake_if_armed(words);
}

}  // namespace shmdist::coll
