#include "transport/routing_transport.hpp"

#include <shmdist/errors.hpp>

#include <algorithm>

namespace shmdist::transport {

RoutingTransport::RoutingTransport(int rank, std::vector<int> local_members,
                                   std::vector<std::string> hosts, std::unique_ptr<Transport> local,
                                   std::unique_ptr<RemoteTransport> remote)
    : rank_(rank),
      world_(static_cast<int>(hosts.size())),
      global_of_(std::move(local_members)),
      local_of_(world_, -1),
      hosts_(std::move(hosts)),
      local_(std::move(local)),
      remote_(std::move(remote)) {
  for (std::size_t l = 0; l < global_of_.size(); ++l) local_of_[global_of_[l]] = static_cast<int>(l);
  if (local_of_[rank_] < 0 || local_->world_size() != static_cast<int>(global_of_.size()) ||
      local_->rank() != local_of_[rank_] || remote_->world_size() != world_)
    throw SetupError("rank " + std::to_string(rank_) +
                     ": the host's segment and the MPI job disagree on who is where (local rank " +
                     std::to_string(local_->rank()) + " of " + std::to_string(local_->world_size()) +
                     ", MPI world " + std::to_string(remote_->world_size()) + ")");
  has_local_peers_ = global_of_.size() > 1;
  has_remote_peers_ = global_of_.size() < static_cast<std::size_t>(world_);
}

InboundSink* RoutingTransport::Globalize::on_message_start(const Envelope& env) {
  Envelope g = env;
  g.src = global_of_[env.src];
  return inner_.on_message_start(g);
}

void RoutingTransport::Globalize::on_message_complete(InboundSink* sink, const Envelope& env) {
  Envelope g = env;
  g.src = global_of_[env.src];
  inner_.on_message_complete(sink, g);
}

bool RoutingTransport::poll_local(InboundHandler& handler, int preferred, bool full_scan) {
  if (!has_local_peers_) return false;
  Globalize g(handler, global_of_);
  return local_->poll(g, preferred >= 0 ? local(preferred) : -1, full_scan);
}

bool RoutingTransport::poll_remote(InboundHandler& handler, int preferred, bool full_scan) {
  if (!has_remote_peers_) return false;
  return remote_->poll(handler, preferred >= 0 && local(preferred) < 0 ? preferred : -1, full_scan);
}

bool RoutingTransport::remote_due(bool preferred_remote, bool full_scan) {
  if (!has_remote_peers_) return false;
  if (preferred_remote || full_scan || remote_skip_left_ == 0 || remote_->payload_arriving())
    return true;
  --remote_skip_left_;
  return false;
}

void RoutingTransport::remote_looked(bool moved, bool local_wait) {
  const unsigned cap =
      local_wait && !remote_->transfers_in_flight() ? kMaxRemoteSkipLocalWait : kMaxRemoteSkip;
  remote_skip_ = moved ? 0 : std::clamp(remote_skip_ * 2, 1u, cap);
  remote_skip_left_ = remote_skip_;
}

void RoutingTransport::bound_skip() {
  remote_skip_ = std::min(remote_skip_, kMaxRemoteSkip);
  remote_skip_left_ = std::min(remote_skip_left_, kMaxRemoteSkip);
}

bool RoutingTransport::poll(InboundHandler& handler, int preferred, bool full_scan) {
  // A preferred local peer keeps its fast path: the local transport looks at it first.
  const int pref_local = preferred >= 0 && local(preferred) >= 0 ? preferred : -1;
  const int pref_remote = preferred >= 0 && local(preferred) < 0 ? preferred : -1;
  // Only a wait for a local peer may skip the remote side longer (see "Cost").
  if (pref_local < 0) bound_skip();
  if (!remote_due(pref_remote >= 0, full_scan)) return poll_local(handler, pref_local, full_scan);
  remote_first_ = !remote_first_;
  bool moved_remote = false;
  bool moved_local = false;
  if (remote_first_) {
    moved_remote = poll_remote(handler, pref_remote, full_scan);
    moved_local = poll_local(handler, pref_local, full_scan);
  } else {
    moved_local = poll_local(handler, pref_local, full_scan);
    moved_remote = poll_remote(handler, pref_remote, full_scan);
  }
  remote_looked(moved_remote, pref_local >= 0);
  return moved_local || moved_remote;
}

DirectResult RoutingTransport::receive_direct(int src, const Expectation& want) {
  const int l = local(src);
  return l >= 0 ? local_->receive_direct(l, want) : remote_->receive_direct(src, want);
}

int RoutingTransport::receive_direct_any(const Expectation& want, DirectResult& result) {
  bound_skip();
  const bool look_remote = remote_due(false, false);
  if (look_remote) remote_first_ = !remote_first_;
  for (int pass = 0; pass < 2; ++pass) {
    const bool remote = (pass == 0) == remote_first_;
    if (remote ? !look_remote : !has_local_peers_) continue;
    const int src = remote ? remote_->receive_direct_any(want, result)
                           : local_->receive_direct_any(want, result);
    if (remote) remote_looked(result != DirectResult::Empty, false);
    if (result == DirectResult::Received) return remote ? src : global_of_[src];
    if (result == DirectResult::Other) return -1;
  }
  result = DirectResult::Empty;
  return -1;
}

bool RoutingTransport::send_some(int dst, OutboundMessage& msg) {
  const int l = local(dst);
  if (l >= 0) return local_->send_some(l, msg);
  // A message to a remote peer often brings a reply: look at MPI on the next calls again.
  if (!msg.started) remote_skip_ = remote_skip_left_ = 0;
  return remote_->send_some(dst, msg);
}

// Single copy exists only between shared-memory peers; the remote side has no offers.
void RoutingTransport::release_outbound(int dst, OutboundMessage& msg) {
  const int l = local(dst);
  if (l >= 0) local_->release_outbound(l, msg);
}

bool RoutingTransport::release_inbound(int src) {
  const int l = local(src);
  return l >= 0 ? local_->release_inbound(l) : remote_->release_inbound(src);
}

void RoutingTransport::abandon_inbound(int src, std::shared_ptr<void> memory) {
  const int l = local(src);
  if (l >= 0) local_->abandon_inbound(l, std::move(memory));
  else remote_->abandon_inbound(src, std::move(memory));
}

void RoutingTransport::flush() {
  local_->flush();
  if (has_remote_peers_) remote_->flush();
}

bool RoutingTransport::inbound_in_progress(int src) const {
  const int l = local(src);
  return l >= 0 ? local_->inbound_in_progress(l) : remote_->inbound_in_progress(src);
}

bool RoutingTransport::inbound_pending(int src) const {
  const int l = local(src);
  return l >= 0 ? local_->inbound_pending(l) : remote_->inbound_pending(src);
}

// ---- waking and peers (slow paths) ------------------------------------------------------

void RoutingWaker::sleep(std::uint32_t token, std::chrono::nanoseconds timeout) {
  if (routing_.has_remote_peers()) timeout = std::min(timeout, routing_.remote().poll_interval());
  local_->sleep(token, timeout);
}

// A sleeper looks at MPI on every wake-up. Reset here, not in sleep(): sleep() runs without
// the engine's lock (threads of one rank sleep at once), disarm() with it.
void RoutingWaker::disarm() {
  local_->disarm();
  routing_.woke();
}

PeerState RoutingPeers::peer_state(int peer) {
  const int l = routing_.local(peer);
  if (l < 0) {
    // A remote rank that dies ends the whole job through mpirun (Open MPI's error handling
    // names the rank and its host), so all there is to know here is whether it finalized.
    if (routing_.remote().peer_finalized(peer)) return {PeerStatus::Finalized, true, {}};
    return {PeerStatus::Running, false, {}};
  }
  PeerState st = local_->peer_state(l);
  // The local peers name ranks by their global rank (Segment::name_ranks); add the host.
  if (!st.how.empty()) st.how = "on host '" + routing_.host(peer) + "': " + st.how;
  return st;
}

void RoutingPeers::report_failure(int peer) {
  // A remote peer's failure is mpirun's to report.
  if (const int l = routing_.local(peer); l >= 0) local_->report_failure(l);
}

void RoutingPeers::note_failure_cause(int peer) {
  // A segment records causes among its own ranks; a remote peer's end is mpirun's to report.
  if (const int l = routing_.local(peer); l >= 0) local_->note_failure_cause(l);
}

void RoutingPeers::mark_finalized() {
  local_->mark_finalized();
  routing_.remote().send_finalized();
}

Link make_routing_link(int rank, std::vector<int> local_members, std::vector<std::string> hosts,
                       Link local, std::unique_ptr<RemoteTransport> remote) {
  auto routing = std::make_unique<RoutingTransport>(rank, std::move(local_members),
                                                    std::move(hosts), std::move(local.bytes),
                                                    std::move(remote));
  Link link;
  link.peers = std::make_shared<RoutingPeers>(std::move(local.peers), *routing);
  link.waker = std::make_shared<RoutingWaker>(std::move(local.waker), *routing);
  link.bytes = std::move(routing);
  return link;
}

}  // namespace shmdist::transport
