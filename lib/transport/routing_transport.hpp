// A Transport chosen per peer: ranks on this host go to the shared-memory transport (which
// numbers them by local rank, their index in this host's segment), ranks on other hosts to
// the remote (MPI) transport (global ranks). The engine above sees one transport with global
// ranks; the global <-> local mapping lives here and nowhere else.
//
// Fairness: poll() and receive_direct_any() alternate which transport they look at first, so
// an any-source receive hears both. Order per (source, group, tag) holds because each source
// is served by exactly one transport, which keeps its own per-source order.
//
// Cost: looking at MPI is not free (MPI_Test/MPI_Testsome run Open MPI's progress engine:
// microseconds over TCP), while a rank talking to local peers makes a progress call every few
// hundred nanoseconds. So the remote side is looked at on every call only while it
// delivers; after a look that found nothing it is skipped for 1, 2, 4, ... up to
// kMaxRemoteSkip calls. It is looked at at once when the caller waits for a remote peer
// (`preferred`), on a full scan (before sleeping, at finalize), after a sleep and after
// starting a send to a remote peer (a reply is likely), so the remote side is never
// starved: an any-source receive hears a remote message within kMaxRemoteSkip + 1 calls.
// While a payload arrives (RemoteTransport::payload_arriving) it is looked at on every call:
// the payload moves only then, and each look waits for it a while anyway.
// A call waiting for a local peer (`preferred` on this host) while no remote send is in
// flight backs off further, up to kMaxRemoteSkipLocalWait calls: MPI buffers what arrives
// meanwhile, and a pair of local ranks in a ping-pong then almost never enters MPI (whose
// progress engine may yield the CPU when the node is oversubscribed). It still looks now and
// then, so that a remote sender whose large message needs this rank's MPI to progress is
// never blocked for good (sends must complete under unlimited buffering, API.md §3).
//
// Waiting (RoutingWaker): local peers ring the doorbell; remote ones cannot, so a sleeping
// rank with remote peers sleeps on the doorbell for at most the remote transport's poll
// interval (10 us, doubling per sleep to 10 ms while nothing arrives: PollBackoff) and polls
// MPI on every wake-up. Peers (RoutingPeers): local peers' health is the segment's, remote
// peers' is what the remote transport heard (a dying remote rank ends the job via mpirun).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/link.hpp"
#include "transport/mpi_transport.hpp"
#include "transport/transport.hpp"

namespace shmdist::transport {

class RoutingTransport final : public Transport {
 public:
  // `local_members`: the global ranks of this host, by local rank (ascending); `hosts`: every
  // rank's host identity, by global rank (for error texts). `local` serves local ranks,
  // `remote` the others.
  RoutingTransport(int rank, std::vector<int> local_members, std::vector<std::string> hosts,
                   std::unique_ptr<Transport> local, std::unique_ptr<RemoteTransport> remote);

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  bool poll(InboundHandler& handler, int preferred, bool full_scan) override;
  DirectResult receive_direct(int src, const Expectation& want) override;
  int receive_direct_any(const Expectation& want, DirectResult& result) override;
  bool send_some(int dst, OutboundMessage& msg) override;
  void release_outbound(int dst, OutboundMessage& msg) override;
  bool release_inbound(int src) override;
  void abandon_inbound(int src, std::shared_ptr<void> memory) override;
  void flush() override;
  bool inbound_in_progress(int src) const override;
  bool inbound_pending(int src) const override;

  // For RoutingWaker and RoutingPeers (slow paths).
  int local(int global) const { return local_of_[global]; }
  const std::string& host(int global) const { return hosts_[global]; }
  bool has_remote_peers() const { return has_remote_peers_; }
  RemoteTransport& remote() { return *remote_; }
  // A sleeper looks at MPI on every wake-up (RoutingWaker::disarm, under the engine's lock).
  void woke() { remote_skip_left_ = 0; }

 private:
  // Hands the engine local messages with their global source rank.
  class Globalize final : public InboundHandler {
   public:
    Globalize(InboundHandler& inner, const std::vector<int>& global_of)
        : inner_(inner), global_of_(global_of) {}
    InboundSink* on_message_start(const Envelope& env) override;
    void on_message_complete(InboundSink* sink, const Envelope& env) override;

   private:
    InboundHandler& inner_;
    const std::vector<int>& global_of_;
  };

  static constexpr unsigned kMaxRemoteSkip = 32;
  static constexpr unsigned kMaxRemoteSkipLocalWait = 1024;

  // Whether this call looks at the remote side (see "Cost" above); counts a skipped call.
  bool remote_due(bool preferred_remote, bool full_scan);
  // After a look at the remote side: whether it moved something sets the next skip, and
  // whether the caller waits for a local peer its bound.
  void remote_looked(bool moved, bool local_wait);
  // A call that does not wait for a local peer skips at most kMaxRemoteSkip calls.
  void bound_skip();
  bool poll_local(InboundHandler& handler, int preferred, bool full_scan);
  bool poll_remote(InboundHandler& handler, int preferred, bool full_scan);

  int rank_;
  int world_;
  std::vector<int> global_of_;  // by local rank
  std::vector<int> local_of_;   // by global rank; -1 on other hosts
  std::vector<std::string> hosts_;
  std::unique_ptr<Transport> local_;
  std::unique_ptr<RemoteTransport> remote_;
  bool has_local_peers_;
  bool has_remote_peers_;
  bool remote_first_ = false;
  unsigned remote_skip_ = 0;       // calls to skip after a look that found nothing
  unsigned remote_skip_left_ = 0;  // calls left to skip before the next look
};

// Sleeping across hosts: the local doorbell, each sleep bounded by the remote poll interval.
// `routing` must outlive it (make_routing_link: the Link destroys its transport last but
// uses it only through the engine, which is gone by then).
class RoutingWaker final : public Waker {
 public:
  RoutingWaker(std::shared_ptr<Waker> local, RoutingTransport& routing)
      : local_(std::move(local)), routing_(routing) {}
  int awake_ranks() const override { return local_->awake_ranks(); }
  std::uint32_t arm() override { return local_->arm(); }
  void sleep(std::uint32_t token, std::chrono::nanoseconds timeout) override;
  void disarm() override;
  void wake_sleepers() override { local_->wake_sleepers(); }

 private:
  std::shared_ptr<Waker> local_;
  RoutingTransport& routing_;
};

// Peers across hosts, by global rank: local ones through the segment, remote ones through
// what the remote transport heard.
class RoutingPeers final : public Peers {
 public:
  RoutingPeers(std::shared_ptr<Peers> local, RoutingTransport& routing)
      : local_(std::move(local)), routing_(routing) {}
  PeerState peer_state(int peer) override;
  void check_job() override { local_->check_job(); }
  void report_failure(int peer) override;
  void note_failure_cause(int peer) override;
  void set_blocked(const BlockedInfo& info) override { local_->set_blocked(info); }
  void clear_blocked() override { local_->clear_blocked(); }
  void mark_finalized() override;

 private:
  std::shared_ptr<Peers> local_;
  RoutingTransport& routing_;
};

// The link of a rank of a job across hosts: `local` is this host's shared-memory link (local
// ranks), `remote` serves the others (arguments as RoutingTransport's).
Link make_routing_link(int rank, std::vector<int> local_members, std::vector<std::string> hosts,
                       Link local, std::unique_ptr<RemoteTransport> remote);

}  // namespace shmdist::transport
