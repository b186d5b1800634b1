// ShmLane: the round protocol (orderings explained in shm_lane.hpp).

#include "coll/shm_lane.hpp"

#include <atomic>

#include "wait/doorbell.hpp"

namespace shmdist::coll {

ShmLane::ShmLane(std::shared_ptr<segment::Segment> segment, int rank)
    : seg_(std::move(segment)),
      rank_(rank),
      world_(seg_->world_size()),
      slot_size_(seg_->geometry().coll_slot_size) {
  for (int r = 0; r < world_; ++r) ctl_.push_back(&seg_->coll_control(r));
  // A rank joining a job starts where its own counters are (0 in a fresh segment).
  round_ = ctl_[rank_]->arrived.load(std::memory_order_relaxed);
}

void ShmLane::publish() {
  ++round_;
  arrived_scan_ = 0;
  ctl_[rank_]->arrived.store(round_, std::memory_order_release);
  wake_peers();
}

bool ShmLane::all_arrived() {
  for (; arrived_scan_ < world_; ++arrived_scan_) {
    if (arrived_scan_ == rank_) continue;
    if (ctl_[arrived_scan_]->arrived.load(std::memory_order_acquire) < round_) return false;
  }
  return true;
}

void ShmLane::awaited(std::vector<int>& out) const {
  for (int j = 0; j < world_; ++j)
    if (j != rank_ && ctl_[j]->arrived.load(std::memory_order_acquire) < round_) out.push_back(j);
}

void ShmLane::wake_peers() {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // F_n of the doorbell protocol
  for (int j = 0; j < world_; ++j) {
    if (j == rank_) continue;
    segment::RankControl& rc = seg_->rank_control(j);
    wait::wake_if_armed({&rc.doorbell_seq, &rc.armed});
  }
}

}  // namespace shmdist::coll
