// The shared-memory Peers: peer health and this rank's published state, backed by the job's
// segment (rank states and pids, the launcher's exit records, the job's abort flag and
// failure record, this rank's hang record: segment/layout.hpp, segment/job_state.hpp).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "segment/segment.hpp"
#include "transport/peers.hpp"
#include "wait/notifier.hpp"
#include "wait/spin.hpp"

namespace shmdist::transport {

class ShmPeers final : public Peers {
 public:
  // `supervised`: a launcher (shmrun, launch()) records how every rank ends, so peers'
  // processes need not be watched; ranks of foreign launchers watch them themselves, polling
  // their processes at most once per `liveness_interval` (the job's health-check interval).
  // Thread mode counts as supervised (the launcher records how each thread-rank ended).
  ShmPeers(std::shared_ptr<segment::Segment> segment, int rank, bool supervised,
           std::chrono::milliseconds liveness_interval = wait::kDefaultHealthCheck);
  ~ShmPeers() override;
  ShmPeers(const ShmPeers&) = delete;
  ShmPeers& operator=(const ShmPeers&) = delete;

  PeerState peer_state(int peer) override;
  int rank_name(int peer) const override { return segment_->rank_name(peer); }
  void check_job() override;
  void report_failure(int peer) override;
  void note_failure_cause(int peer) override;
  void set_blocked(const BlockedInfo& info) override;
  void clear_blocked() override;
  void mark_finalized() override;

 private:
  bool peer_alive(int peer);

  std::shared_ptr<segment::Segment> segment_;
  int rank_;
  bool supervised_;
  int world_;
  segment::RankControl* own_;
  wait::Notifier notifier_;  // wakes peers blocked on us when we finalize
  std::vector<int> peers_;   // every rank but this one
  std::vector<int> pidfds_;  // by peer, opened lazily (unsupervised jobs only)
  std::vector<bool> dead_;   // by peer: its process is known to have ended
  std::chrono::milliseconds liveness_interval_;
  std::chrono::steady_clock::time_point next_liveness_check_{};
};

}  // namespace shmdist::transport
