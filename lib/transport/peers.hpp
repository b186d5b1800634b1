// What this rank knows of its peers' health, and what it publishes of its own state for
// peers and the launcher: the hang record (what a blocked call waits for) and "finalized".
// Kept apart from the Transport (transport.hpp, bytes only): a network transport has no
// meaning for most of it, and the shared-memory implementation (ShmPeers, shm_peers.hpp) is
// backed by the job's segment (rank states, exit records, the job's abort flag), not by the
// rings. The engine calls these only on slow paths (a wait that found nothing, a timeout,
// destroy), never per message.
#pragma once

#include <cstdint>
#include <string>

namespace shmdist::transport {

// How a peer stands, as far as this rank knows.
enum class PeerStatus { Running, Finalized, Gone };

struct PeerState {
  PeerStatus status = PeerStatus::Running;
  bool clean = false;  // Gone after exiting with code 0 (sends nothing more, but no failure)
  std::string how;     // for Gone: "rank 2 (pid 7) was killed by signal 9 (SIGKILL)", ...
};

// What a blocked call waits for, published for hang reports.
struct BlockedInfo {
  std::uint32_t op = 0;  // segment::BlockedOp codes (segment/layout.hpp)
  int peer = -1;
  std::uint32_t group = 0;
  int tag = 0;
  std::uint64_t bytes = 0;
  std::uint32_t pending_ops = 0;
};

class Peers {
 public:
  virtual ~Peers() = default;

  // Peer health and job state (ranks as the engine numbers them). check_job() throws
  // PeerFailure if the job was aborted.
  virtual PeerState peer_state(int peer) = 0;
  virtual void check_job() = 0;
  // Records that `peer` vanished and aborts the job, so every rank of the job learns it.
  virtual void report_failure(int peer) = 0;
  // Records that this rank is about to raise PeerFailure because `peer` finalized or exited
  // (which aborts nothing by itself): if this rank then fails, the job's failure names `peer`,
  // the root cause, after this rank's exit code or exception, or alone when this rank's end
  // is unknown; a signal is named alone (segment::record_job_failure). The first cause counts.
  virtual void note_failure_cause(int /*peer*/) {}
  // The rank `peer` stands for in error texts: its global rank when the job is one host's
  // ranks of a job across hosts (segment::Segment::name_ranks), else `peer`.
  virtual int rank_name(int peer) const { return peer; }

  // Hang state: what this rank's blocked call waits for (read by the launcher's diagnosis).
  virtual void set_blocked(const BlockedInfo& info) = 0;
  virtual void clear_blocked() = 0;
  // This rank will send nothing more (destroy_process_group); peers waiting on it look again.
  virtual void mark_finalized() = 0;
};

}  // namespace shmdist::transport
