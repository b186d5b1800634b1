// The shared-memory Waker: this rank's doorbell in the job's segment (wait/doorbell.hpp has
// the protocol and its memory orders). Peers ring it through their wait::Notifier after
// publishing records, ring space, offers' final states or round flags.
#pragma once

#include <algorithm>
#include <memory>

#include "segment/doorbells.hpp"
#include "segment/segment.hpp"
#include "transport/waker.hpp"
#include "wait/doorbell.hpp"

namespace shmdist::transport {

class ShmWaker final : public Waker {
 public:
  // `heavy`: arm() issues membarrier (this process registered for it, wait/fence.hpp).
  ShmWaker(std::shared_ptr<segment::Segment> segment, int rank, bool heavy)
      : segment_(std::move(segment)),
        world_(segment_->world_size()),
        doorbell_(segment::doorbell_of(segment_->rank_control(rank)), segment_->header().sleeping,
                  heavy) {}

  // Once this rank holds its slot (ShmTransport's constructor): see Doorbell::announce().
  void announce() { doorbell_.announce(); }

  // A statistic (SegmentHeader::sleeping), relaxed: see Doorbell.
  int awake_ranks() const override {
    const auto asleep = segment_->header().sleeping.load(std::memory_order_relaxed);
    return world_ - static_cast<int>(std::min<std::uint32_t>(asleep, world_));
  }
  std::uint32_t arm() override { return doorbell_.arm(); }
  void sleep(std::uint32_t token, std::chrono::nanoseconds timeout) override {
    doorbell_.sleep(token, timeout);
  }
  void disarm() override { doorbell_.disarm(); }
  void wake_sleepers() override { doorbell_.wake_own(); }

 private:
  std::shared_ptr<segment::Segment> segment_;
  int world_;
  wait::Doorbell doorbell_;
};

}  // namespace shmdist::transport
