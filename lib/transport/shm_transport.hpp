// The shared-memory transport: one SPSC ring per ordered rank pair in the job's segment,
// a doorbell per rank, and ready hints so that idle peers cost an any-source scan nothing.
// It moves bytes only; the rank's doorbell is its ShmWaker and peer health its ShmPeers, which
// it creates (it uses both on single copy's slow paths) and make_shm_link hands the engine.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ring/ring.hpp"
#include "segment/segment.hpp"
#include "transport/frame.hpp"
#include "transport/link.hpp"
#include "transport/shm_peers.hpp"
#include "transport/shm_waker.hpp"
#include "transport/single_copy.hpp"
#include "transport/transport.hpp"
#include "wait/notifier.hpp"
#include "wait/spin.hpp"

namespace shmdist::transport {

class ShmTransport final : public Transport {
 public:
  // Joins `segment` as `rank` (marks it running with this process's pid). `supervised` and
  // `liveness_interval`: how its ShmPeers watches peers (shm_peers.hpp). Messages of at least
  // `single_copy_threshold` bytes are offered for a single copy (0: never; shm_offers.cpp).
  ShmTransport(std::shared_ptr<segment::Segment> segment, int rank, bool supervised,
               std::chrono::milliseconds liveness_interval = wait::kDefaultHealthCheck,
               std::uint64_t single_copy_threshold = 0);
  ~ShmTransport() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  bool poll(InboundHandler& handler, int preferred, bool full_scan) override;
  DirectResult receive_direct(int src, const Expectation& want) override;
  int receive_direct_any(const Expectation& want, DirectResult& result) override;
  bool send_some(int dst, OutboundMessage& msg) override;
  void release_outbound(int dst, OutboundMessage& msg) override;
  void flush() override;
  bool inbound_in_progress(int src) const override { return inbound_[src].in_message; }
  bool inbound_pending(int src) const override { return consumers_[src].peek() != nullptr; }

  // The largest record of a message that streams in several (tests check the ring's records).
  std::size_t stream_record() const { return stream_; }

  // This rank's doorbell and its view of peers (shared with the engine: make_shm_link).
  const std::shared_ptr<ShmWaker>& waker() const { return waker_; }
  const std::shared_ptr<ShmPeers>& peers() const { return peers_health_; }

 private:
  struct Inbound {
    InboundSink* sink = nullptr;
    Envelope env;
    std::uint64_t remaining = 0;
    bool in_message = false;
    bool dirty = false;             // consumed records whose space is not yet published
    std::uint32_t empty_polls = 0;  // consecutive hinted polls that found nothing
    std::string failure;            // a single copy from this source failed: its stream is over
  };

  void check_fresh_rings() const;
  bool drain(int src, InboundHandler& handler);
  void consume_record(int src, const ring::RecordHeader& rec, InboundHandler& handler);
  template <class Visit>
  bool visit_hinted(int skip, Visit&& visit);
  void note_empty_poll(int src);
  void clear_hint_if_empty(int src);
  void notify_receiver(int dst);
  void wake_if_sleeping(int peer);  // after publishing something `peer` may wait for
  // shm_offers.cpp: single copy (transport/single_copy.hpp).
  void take_offer(int src, const ring::RecordHeader& rec, const Envelope& env,
                  InboundHandler& handler);
  SingleCopy::Step advance_offer(int dst, OutboundMessage& msg);

  std::shared_ptr<segment::Segment> segment_;
  int rank_;
  int world_;
  segment::RankControl* controls_;  // every rank's control block (segment's array, by rank)
  segment::RankControl* own_;
  bool asymmetric_fences_;  // this process is registered for membarrier (wait/fence.hpp)
  std::shared_ptr<ShmWaker> waker_;         // this rank's doorbell
  std::shared_ptr<ShmPeers> peers_health_;  // single copy checks whether a peer is gone
  wait::Notifier notifier_;  // every rank's doorbell (wakes peers after publishing)
  std::vector<ring::RingProducer> producers_;  // by destination
  std::vector<ring::RingConsumer> consumers_;  // by source
  std::vector<Inbound> inbound_;               // by source
  std::vector<int> peers_;  // every rank but this one
  std::vector<int> dirty_sources_;
  std::size_t chunk_;   // largest record (header included) of a message sent in one record
  std::size_t stream_;  // largest record of a message streamed in several (<= chunk_)
  int cursor_ = 0;                             // where the next hinted scan starts
  SingleCopy single_copy_;
};

// The shared-memory transport of `rank` in `segment` with its waker and peers, for an engine
// (arguments as ShmTransport's).
Link make_shm_link(std::shared_ptr<segment::Segment> segment, int rank, bool supervised,
                   std::chrono::milliseconds liveness_interval = wait::kDefaultHealthCheck,
                   std::uint64_t single_copy_threshold = 0);

}  // namespace shmdist::transport
