// ShmPeers: peer health and this rank's published state in the job's segment.

#include "transport/shm_peers.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <shmdist/errors.hpp>

#include "base/process_alive.hpp"
#include "segment/doorbells.hpp"
#include "segment/job_state.hpp"
#include "wait/fence.hpp"

namespace shmdist::transport {

using segment::RankControl;
using segment::RankState;

ShmPeers::ShmPeers(std::shared_ptr<segment::Segment> segment, int rank, bool supervised,
                   std::chrono::milliseconds liveness_interval)
    : segment_(std::move(segment)),
      rank_(rank),
      supervised_(supervised || (segment_->header().flags & segment::kThreadMode)),
      world_(segment_->world_size()),
      own_(&segment_->rank_control(rank)),
      notifier_(segment::notifier_of(*segment_, wait::register_asymmetric_fences())),
      pidfds_(world_, -1),
      dead_(world_, false),
      liveness_interval_(liveness_interval) {
  for (int peer = 0; peer < world_; ++peer)
    if (peer != rank_) peers_.push_back(peer);
}

ShmPeers::~ShmPeers() {
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
}

PeerState ShmPeers::peer_state(int peer) {
  const RankControl& rc = segment_->rank_control(peer);
  const auto state = static_cast<RankState>(rc.state.load(std::memory_order_acquire));
  if (state == RankState::Finalized) return {PeerStatus::Finalized, true, {}};
  if (state == RankState::Ended) {
    const bool clean = rc.end_kind.load(std::memory_order_acquire) ==
                           static_cast<std::uint32_t>(segment::EndKind::Exited) &&
                       rc.end_code.load(std::memory_order_relaxed) == 0;
    return {PeerStatus::Gone, clean, segment::describe_rank_end(*segment_, peer)};
  }
  if (state == RankState::Running && !supervised_ && !peer_alive(peer))
    return {PeerStatus::Gone, false,
            "rank " + std::to_string(segment_->rank_name(peer)) + " (pid " +
                std::to_string(rc.pid.load()) +
                ") is gone without finalizing (exit status unknown here)"};
  return {PeerStatus::Running, false, {}};
}

// Without a supervising launcher, a rank watches its peers' processes itself: a pidfd per
// peer (no pid reuse, and it also reports a zombie nobody reaped; base/process_alive.hpp),
// polled all at once at most every liveness_interval_; where there are no pidfds, the
// one-shot check of /proc. Peers whose pid is not published yet count as alive.
bool ShmPeers::peer_alive(int peer) {
  const auto now = std::chrono::steady_clock::now();
  if (now >= next_liveness_check_) {
    next_liveness_check_ = now + liveness_interval_;
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int p = 0; p < world_; ++p) {
      if (p == rank_ || dead_[p]) continue;
      if (pidfds_[p] < 0) {
        const int pid = segment_->rank_control(p).pid.load(std::memory_order_relaxed);
        if (pid <= 0) continue;
        pidfds_[p] = detail::open_pidfd(pid);
        if (pidfds_[p] < 0) {
          // No such process (reaped), or no pidfds here: the one-shot check then.
          if (errno == ESRCH || !detail::process_alive_by_proc(pid)) dead_[p] = true;
          continue;
        }
      }
      fds.push_back({pidfds_[p], POLLIN, 0});
      who.push_back(p);
    }
    if (!fds.empty() && ::poll(fds.data(), fds.size(), 0) > 0)
      for (std::size_t i = 0; i < fds.size(); ++i)
        if (fds[i].revents & (POLLIN | POLLHUP)) dead_[who[i]] = true;
  }
  return !dead_[peer];
}

void ShmPeers::check_job() {
  const auto& h = segment_->header();
  if (h.job_state.load(std::memory_order_acquire) !=
      static_cast<std::uint32_t>(segment::JobState::Aborted))
    return;
  throw PeerFailure(segment::describe_job_failure(*segment_));
}

void ShmPeers::report_failure(int peer) {
  segment::record_job_failure(*segment_, peer, segment::EndKind::Vanished, 0);
}

void ShmPeers::note_failure_cause(int peer) {
  segment::record_failure_cause(*segment_, rank_, peer);
}

// A seqlock: the odd version, then (release fence) the fields, then the even version with
// release; the launcher reads version (acquire), fields, fence (acquire), version again, and
// retries if they differ or are odd, so it never uses a half-written record.
void ShmPeers::set_blocked(const BlockedInfo& info) {
  auto& b = own_->blocked;
  const std::uint32_t v = b.version.load(std::memory_order_relaxed);
  b.version.store(v + 1, std::memory_order_relaxed);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  b.op.store(info.op, std::memory_order_relaxed);
  b.peer.store(info.peer, std::memory_order_relaxed);
  b.group.store(info.group, std::memory_order_relaxed);
  b.tag.store(info.tag, std::memory_order_relaxed);
  b.bytes.store(info.bytes, std::memory_order_relaxed);
  b.pending_ops.store(info.pending_ops, std::memory_order_relaxed);
  b.since_ns.store(segment::wall_clock_ns(), std::memory_order_relaxed);
  b.version.store(v + 2, std::memory_order_release);
}

void ShmPeers::clear_blocked() {
  auto& b = own_->blocked;
  if (b.op.load(std::memory_order_relaxed) == 0) return;
  const std::uint32_t v = b.version.load(std::memory_order_relaxed);
  b.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  b.op.store(0, std::memory_order_relaxed);
  b.version.store(v + 2, std::memory_order_release);
}

void ShmPeers::mark_finalized() {
  own_->state.store(static_cast<std::uint32_t>(RankState::Finalized), std::memory_order_release);
  // Peers blocked on us (waiting for a message, or for everyone to finalize) must look again.
  // The notifier half of the doorbell protocol after that release store (wait/notifier.hpp).
  notifier_.notify(peers_);
}

}  // namespace shmdist::transport
