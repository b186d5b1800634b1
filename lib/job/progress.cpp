#include "job/progress.hpp"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "job/diagnosis.hpp"

namespace shmdist::job {

ProcState process_state(int pid) {
  if (pid <= 0) return ProcState::Unknown;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!in || !std::getline(in, text)) return ProcState::Gone;
  // "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return ProcState::Unknown;
  switch (text[close + 2]) {
    case 'T':
    case 't': return ProcState::Stopped;
    case 'Z':
    case 'X': return ProcState::Gone;
    default: return ProcState::Running;
  }
}

namespace {
std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}
}  // namespace

// Relaxed loads suffice: the signature is compared for change only, never used to read data;
// a value seen late is seen at the next sample.
ProgressSample sample_progress(const segment::Segment& seg, const std::vector<int>& pids) {
  const int n = seg.world_size();
  ProgressSample s;
  s.signature.resize(n);
  s.proc.resize(n);
  for (int r = 0; r < n; ++r) {
    const auto& rc = seg.rank_control(r);
    std::uint64_t h = rc.state.load(std::memory_order_relaxed);
    h = mix(h, rc.blocked.version.load(std::memory_order_relaxed));
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      h = mix(h, seg.ring_control(p, r).tail.load(std::memory_order_relaxed));
      h = mix(h, seg.ring_control(r, p).head_hint.load(std::memory_order_relaxed));
      // Single-copy offers: r claims and completes those into it, posts those out of it.
      h = mix(h, seg.ring_control(p, r).offer_state.load(std::memory_order_relaxed));
      h = mix(h, seg.ring_control(r, p).offer_state.load(std::memory_order_relaxed));
    }
    s.signature[r] = h;
    const int pid = r < static_cast<int>(pids.size()) && pids[r] > 0
                        ? pids[r]
                        : rc.pid.load(std::memory_order_relaxed);
    s.proc[r] = process_state(pid);
  }
  return s;
}

void ProgressTracker::observe(const ProgressSample& sample, Clock::time_point now) {
  const std::size_t n = sample.signature.size();
  if (changed_at_.size() != n) {
    changed_at_.assign(n, now);
    moved_.assign(n, false);
    last_ = sample;
    observations_ = 1;
    return;
  }
  for (std::size_t r = 0; r < n; ++r) {
    moved_[r] = sample.signature[r] != last_.signature[r];
    if (moved_[r]) changed_at_[r] = now;
  }
  last_ = sample;
  ++observations_;
}

bool ProgressTracker::moved_last(int rank) const {
  return rank >= 0 && rank < static_cast<int>(moved_.size()) && moved_[rank];
}

ProgressTracker::Clock::duration ProgressTracker::still_for(int rank, Clock::time_point now) const {
  if (observations_ < 2 || rank < 0 || rank >= static_cast<int>(changed_at_.size())) return {};
  return now - changed_at_[rank];
}

ProcState ProgressTracker::proc(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(last_.proc.size())) return ProcState::Unknown;
  return last_.proc[rank];
}

std::string hang_verdict(const segment::Segment& seg, const ProgressTracker& tracker,
                         const std::vector<bool>& ended, std::chrono::steady_clock::time_point now,
                         std::chrono::milliseconds after) {
  if (after.count() <= 0 || !tracker.observed_twice()) return {};
  const auto ranks = snapshot_ranks(seg);
  const int n = static_cast<int>(ranks.size());
  auto still = [&](int r) { return tracker.still_for(r, now) >= after; };
  auto gone = [&](int r) {
    const auto st = static_cast<segment::RankState>(ranks[r].state);
    return (r < static_cast<int>(ended.size()) && ended[r]) ||
           st == segment::RankState::Finalized || st == segment::RankState::Ended ||
           tracker.proc(r) == ProcState::Gone;
  };
  if (auto cycle = find_wait_cycle(ranks)) {
    bool stuck = true;
    for (int r : *cycle) stuck &= still(r) && !gone(r);
    if (stuck) return "every rank of a wait-for cycle is blocked with no progress";
  }
  // Every rank of the job waits (blocked, stopped or never joined), nothing moves.
  int waiting = 0, live = 0;
  for (int r = 0; r < n; ++r) {
    if (gone(r)) continue;
    ++live;
    const bool stopped = tracker.proc(r) == ProcState::Stopped;
    const bool blocked = ranks[r].op != 0 &&
                         ranks[r].state == static_cast<std::uint32_t>(segment::RankState::Running);
    const bool unjoined = ranks[r].state == static_cast<std::uint32_t>(segment::RankState::Empty);
    if (!(stopped || blocked || unjoined) || !still(r)) return {};
    waiting += stopped || blocked;
  }
  if (live == 0 || waiting == 0) return {};
  return "every rank still running is blocked, stopped or not joined, with no progress";
}

}  // namespace shmdist::job
