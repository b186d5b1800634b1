// destroy_process_group: finish what was sent, agree with the peers that nobody sends any
// more, and say which messages arrived but were never received instead of losing them.

#include <map>
#include <ostream>
#include <set>
#include <tuple>
#include <sstream>

#include "engine/engine.hpp"

namespace shmdist::engine {
namespace {

using GroupAndTag = std::tuple<std::uint32_t, std::uint32_t, int>;  // group id, sig, tag

// "tags 1, 2" on the world group; "tag 3 on group #2 {0, 1}" on others, group by group.
template <class GroupText>
std::string list_tags(const std::set<GroupAndTag>& tags, GroupText&& group_text) {
  std::string s;
  for (auto it = tags.begin(); it != tags.end();) {
    const auto [group, sig, first_tag] = *it;
    auto end = it;
    std::size_t n = 0;
    while (end != tags.end() && std::get<0>(*end) == group && std::get<1>(*end) == sig)
      ++end, ++n;
    if (!s.empty()) s.append("; ");
    s.append(n == 1 ? "tag " : "tags ");
    for (auto t = it; t != end; ++t) {
      if (t != it) s.append(", ");
      s.append(std::to_string(std::get<2>(*t)));
    }
    if (group != 0) s.append(" on ").append(group_text(group, sig));
    it = end;
  }
  return s;
}

}  // namespace

struct Engine::Tally {
  struct Peer {
    std::size_t messages = 0;
    std::size_t incomplete = 0;
    std::uint64_t bytes = 0;
    std::set<GroupAndTag> tags;
    std::size_t receives = 0;  // posted receives that never matched
    std::set<GroupAndTag> receive_tags;
  };
  std::map<int, Peer> by_peer;  // -1: posted any-source receives
};

void Engine::finalize(std::ostream& report) {
  if (finalized_) return;
  finalized_ = true;
  const std::string problem = drain();
  const Tally tally = tally_unfinished();
  fail_all_pending(std::make_exception_ptr(
      NotInitialized("the process group was destroyed while this operation was pending")));
  write_report(report, tally, problem);
}

// Queued sends go out, this rank is marked finalized, every peer finalizes (or ends), and what
// is still in the rings comes in. Returns what went wrong, empty if nothing did.
std::string Engine::drain() {
  const auto deadline = Clock::now() + timeout_;
  const WaitFocus focus{kBlockedDestroy, -1, nullptr, {}, 0};
  std::string problem;
  try {
    // 1. Queued sends go out first (peers drain their rings while they wait, in any call).
    if (!block_until([&] { return sending_to_.empty(); }, focus, deadline - Clock::now()))
      problem = "timed out finishing this rank's pending sends";
  } catch (const Error& e) {
    problem = e.what();
  }
  peers_->mark_finalized();
  if (!problem.empty()) return problem;
  try {
    // 2. Everyone else finalizes (or ends): after that nothing new can arrive.
    auto all_quiet = [&] {
      for (int p : all_peers_)
        if (peers_->peer_state(p).status == transport::PeerStatus::Running) return false;
      return true;
    };
    if (!block_until(all_quiet, focus, deadline - Clock::now()))
      problem = "timed out waiting for the other ranks to call destroy_process_group";
    // 3. Take in what is still in the rings.
    while (progress(-1, true)) {
    }
  } catch (const Error& e) {
    problem = e.what();
  }
  return problem;
}

// The user's messages that arrived and were never received, and the user's receives that
// never matched, by peer (internal traffic is the library's business, not the report's).
Engine::Tally Engine::tally_unfinished() const {
  Tally tally;
  for (const Unexpected& u : unexpected_) {
    if (u.env.key.channel != transport::kUserChannel) continue;
    Tally::Peer& t = tally.by_peer[u.env.src];
    ++t.messages;
    t.incomplete += !u.complete;
    t.bytes += u.env.nbytes;
    t.tags.insert({u.env.key.group_id, u.env.key.group_sig, u.env.key.tag});
  }
  for (const Operation& op : posted_) {
    if (op.key.channel != transport::kUserChannel) continue;
    Tally::Peer& t = tally.by_peer[op.peer];
    ++t.receives;
    t.receive_tags.insert({op.key.group_id, op.key.group_sig, op.key.tag});
  }
  return tally;
}

void Engine::write_report(std::ostream& report, const Tally& tally,
                          const std::string& problem) const {
  // Composed first and written with one call: ranks share stderr, and separate writes of
  // pieces of a line would interleave with other ranks' reports mid-line.
  std::ostringstream text;
  const std::string me = "shmdist: rank " + std::to_string(rank()) + ": ";
  auto group_name = [this](std::uint32_t id, std::uint32_t sig) {
    return group_text_for(id, sig);
  };
  for (const auto& [peer, t] : tally.by_peer) {
    if (t.messages) {
      text << me << t.messages << (t.messages == 1 ? " message" : " messages") << " from rank "
           << peer << (t.messages == 1 ? " arrived and was" : " arrived and were")
           << " never received (" << list_tags(t.tags, group_name) << ", " << t.bytes << " bytes"
           << (t.incomplete ? ", " + std::to_string(t.incomplete) + " incomplete" : "")
           << ")\n";
    }
    if (t.receives) {
      text << me << t.receives << " posted receive" << (t.receives == 1 ? "" : "s")
           << (peer < 0 ? " from any source" : " from rank " + std::to_string(peer))
           << " never matched a message (" << list_tags(t.receive_tags, group_name) << ")\n";
    }
  }
  if (!problem.empty()) text << me << "destroy_process_group: " << problem << "\n";
  const std::string lines = text.str();
  if (!lines.empty()) report.write(lines.data(), static_cast<std::streamsize>(lines.size()));
  report.flush();
}

void Engine::abandon(Clock::duration flush_limit, bool mark, std::ostream& report) {
  if (finalized_) return;
  finalized_ = true;
  try {
    if (flush_limit > Clock::duration::zero()) {
      const WaitFocus focus{kBlockedDestroy, -1, nullptr, {}, 0};
      block_until([&] { return sending_to_.empty(); }, focus, flush_limit);
    }
  } catch (const Error&) {
    // The job failed meanwhile: nothing more to deliver.
  }
  if (mark) peers_->mark_finalized();
  const std::size_t unsent = fail_all_pending(std::make_exception_ptr(
      NotInitialized("the process ended without destroy_process_group while this operation "
                     "was pending")));
  if (unsent) {
    const std::string line = "shmdist: rank " + std::to_string(rank()) + ": " +
                             std::to_string(unsent) + (unsent == 1 ? " send" : " sends") +
                             " not delivered: the process ended without destroy_process_group "
                             "before the receiver took the data\n";
    report.write(line.data(), static_cast<std::streamsize>(line.size()));
    report.flush();
  }
}

}  // namespace shmdist::engine
