// The waiter, out of line: what a blocked call publishes for hang reports, deciding when a
// wait cannot succeed (dead or finalized peers, aborted job, deadline), with error texts that
// say what was awaited and what to do, and waking this rank's sleepers. The loop itself is
// in waiter.hpp.

#include "engine/waiter.hpp"
#include "engine/group_name.hpp"

#include <shmdist/errors.hpp>

#include <algorithm>

namespace shmdist::engine {
namespace {
// "ranks 1, 3 have" / "rank 2 has" (global ranks, as `peers` names them).
std::string awaited_text(const WaitSubject& subject, const transport::Peers& peers) {
  std::vector<int> awaited;
  subject.awaited_peers(awaited);
  if (awaited.empty()) return "no member is missing, yet it has";
  std::string text = awaited.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < awaited.size(); ++i)
    text += (i ? ", " : "") + std::to_string(peers.rank_name(awaited[i]));
  return text + (awaited.size() == 1 ? " has" : " have");
}
}  // namespace

void Waiter::wake_sleepers() {
  if (sleepers_ > 0) waker_->wake_sleepers();
}

void Waiter::publish_blocked(const WaitFocus& focus, std::size_t pending_ops) {
  transport::BlockedInfo info;
  info.op = focus.op;
  info.peer = focus.peer;
  info.group = focus.key.group_id;
  info.tag = focus.key.tag;
  info.bytes = focus.bytes;
  info.pending_ops = static_cast<std::uint32_t>(pending_ops);
  peers_->set_blocked(info);
}

std::string Waiter::describe(const WaitFocus& focus) const {
  if (focus.subject)
    return focus.subject->describe() + " on rank " + std::to_string(peers_->rank_name(rank()));
  std::string what = blocked_op_name(focus.op);
  if (focus.peer >= 0)
    what += (focus.op == kBlockedSend ? " to rank " : " from rank ") +
            std::to_string(peers_->rank_name(focus.peer));
  else if (focus.op == kBlockedRecv)
    what += " from any source";
  if (focus.op == kBlockedSend || focus.op == kBlockedRecv || focus.op == kBlockedWait) {
    what += " (tag " + std::to_string(focus.key.tag) + ", ";
    what += group_label(focus.key.group_id);
    what += ")";
  }
  return what + " on rank " + std::to_string(peers_->rank_name(rank()));
}

[[noreturn]] void Waiter::throw_timeout(const WaitFocus& focus, Clock::duration waited) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
  std::string hint;
  if (focus.op == kBlockedRecv)
    hint = focus.peer >= 0 ? "; check that rank " +
                                 std::to_string(peers_->rank_name(focus.peer)) +
                                 " sends to this rank with the same tag and group"
                           : "; check that some rank sends to this rank with the same tag and group";
  else if (focus.op == kBlockedSend)
    hint = "; the receiver has not taken the data (is it receiving, or stuck elsewhere?)";
  else if (focus.subject)
    hint = "; " + awaited_text(*focus.subject, *peers_) +
           " not arrived (every member must call the same collectives in the same order)";
  throw Timeout(describe(focus) + " timed out after " + std::to_string(ms) + " ms" + hint +
                ". Raise InitOptions::timeout if the peer is just slow.");
}

// Any peer that ended abnormally aborts the whole job (fail-fast, as mpirun and torchrun do),
// whether the caller needs that peer or not. `what` names the caller's wait, for the text.
template <class What>
void Waiter::fail_on_abnormal_end(What&& what) {
  peers_->check_job();
  for (int p : all_peers_) {
    transport::PeerState st = peers_->peer_state(p);
    if (st.status == transport::PeerStatus::Gone && !st.clean) {
      peers_->report_failure(p);
      peers_->check_job();
      throw PeerFailure("peer failure: " + st.how + "; " + what() + " cannot complete");
    }
  }
}

void Waiter::check_peers(const std::string& waiting_for) {
  if (health_hook_) health_hook_();
  fail_on_abnormal_end([&] { return waiting_for + " on rank " + std::to_string(rank()); });
}

// Throws when the awaited event can no longer happen.
void Waiter::check_failures(const WaitFocus& focus) {
  if (health_hook_) health_hook_();
  fail_on_abnormal_end([&] { return describe(focus); });
  // A peer that finalized (or exited cleanly) sends nothing more: a receive that only it
  // could satisfy, with nothing of its left in the ring, can never complete.
  auto silent = [&](int p) {
    const auto st = peers_->peer_state(p);
    return st.status != transport::PeerStatus::Running && !transport_->inbound_in_progress(p) &&
           !transport_->inbound_pending(p);
  };
  const bool receiving =
      focus.op == kBlockedRecv || focus.op == kBlockedWait || focus.op == kBlockedBarrier;
  if (receiving && focus.peer >= 0 && focus.peer != rank() && silent(focus.peer)) {
    peers_->note_failure_cause(focus.peer);
    throw PeerFailure("rank " + std::to_string(focus.peer) +
                      " has finalized (destroy_process_group) or exited, and will send nothing "
                      "more; " + describe(focus) + " can never complete");
  }
  if (receiving && focus.peer < 0 && focus.candidates) {
    // Every candidate is silent, so any of them could be blamed: the lowest rank, so that
    // the recorded cause does not depend on the order of the candidate list.
    bool any_alive = false;
    int lowest_silent = -1;
    for (int p : *focus.candidates) {
      if (p == rank()) continue;
      if (!silent(p)) any_alive = true;
      else if (lowest_silent < 0 || p < lowest_silent) lowest_silent = p;
    }
    if (!any_alive) {
      if (lowest_silent >= 0) peers_->note_failure_cause(lowest_silent);
      throw PeerFailure("every rank that could send has finalized or exited; " + describe(focus) +
                        " can never complete");
    }
  }
  if (focus.subject) {
    // The list of awaited peers is read before silent() reads their state, so a peer may
    // have done its part between the two (published its last round on the world lane, saw
    // ours, returned and called destroy_process_group): ask the subject again, AFTER the state
    // reads, and fail only for a silent peer it still waits for. Why that second look sees
    // the part a finalized peer did: its release store of its lane round flag
    // (ShmLane::publish) is sequenced before its release store of Finalized (ShmPeers::
    // mark_finalized; from another thread of the peer, the engine lock orders the two). Our
    // acquire load of that state in silent() read Finalized, so it synchronizes with that
    // store; the flag store therefore happens before our second awaited_peers(), whose
    // acquire load of the flag (ShmLane::awaited) must return it or a later value
    // (write-read coherence). Ended is stored (release, record_rank_end) by whoever saw the
    // rank end, after all its stores. A message the call waits for needs no second look:
    // silent() reads the ring (a record's stamp, acquire) after the state, the same way.
    // Before, a barrier whose peer went through its last round and finalized between our
    // two reads failed with a false PeerFailure just before destroy.
    std::vector<int> awaited;
    focus.subject->awaited_peers(awaited);
    std::vector<int> gone;
    for (int p : awaited)
      if (p != rank() && silent(p)) gone.push_back(p);
    if (!gone.empty()) {
      std::vector<int> still;
      focus.subject->awaited_peers(still);
      for (int p : gone)
        if (std::find(still.begin(), still.end(), p) != still.end()) {
          peers_->note_failure_cause(p);
          throw PeerFailure("rank " + std::to_string(p) +
                            " has finalized (destroy_process_group) or exited without taking "
                            "part; " + describe(focus) + " can never complete");
        }
    }
  }
  if (focus.op == kBlockedSend && focus.peer >= 0) {
    const auto st = peers_->peer_state(focus.peer);
    if (st.status == transport::PeerStatus::Gone) {
      peers_->note_failure_cause(focus.peer);
      throw PeerFailure(st.how + " without receiving; " + describe(focus) + " cannot complete");
    }
  }
}

}  // namespace shmdist::engine
