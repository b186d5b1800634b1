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

bool ShmLane::can_write() const {
  const std::uint64_t next = round_ + 1;
  if (next <= 2) return true;
  for (int j = 0; j < world_; ++j)
    if (j != rank_ && ctl_[j]->released.load(std::memory_order_acquire) < next - 2) return false;
  return true;
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

void ShmLane::release() {
  ctl_[rank_]->released.store(round_, std::memory_order_release);
  wake_peers();
}

void ShmLane::awaited(std::vector<int>& out, bool writing) const {
  for (int j = 0; j < world_; ++j) {
    if (j == rank_) continue;
    const bool waiting = writing ? round_ + 1 > 2 && ctl_[j]->released.load(std::memory_order_acquire) < round_ - 1
                                 : ctl_[j]->arrived.load(std::memory_order_acquire) < round_;
    if (waiting) out.push_back(j);
  }
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
