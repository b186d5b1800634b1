#include "job/diagnosis.hpp"

#include <cstdio>
#include <functional>
#include <limits>
#include <sstream>
#include <thread>

#include "segment/job_state.hpp"

namespace shmdist::job {

std::vector<RankSnapshot> snapshot_ranks(const segment::Segment& seg) {
  std::vector<RankSnapshot> out;
  const std::int64_t now = segment::wall_clock_ns();
  for (int r = 0; r < seg.world_size(); ++r) {
    const auto& rc = seg.rank_control(r);
    const auto& b = rc.blocked;
    RankSnapshot s;
    s.rank = r;
    s.pid = rc.pid.load(std::memory_order_relaxed);
    s.state = rc.state.load(std::memory_order_acquire);
    for (int attempt = 0; attempt < 100; ++attempt) {
      const std::uint32_t v1 = b.version.load(std::memory_order_acquire);
      if (v1 & 1) continue;
      s.op = b.op.load(std::memory_order_relaxed);
      s.peer = b.peer.load(std::memory_order_relaxed);
      s.group = b.group.load(std::memory_order_relaxed);
      s.tag = b.tag.load(std::memory_order_relaxed);
      s.bytes = b.bytes.load(std::memory_order_relaxed);
      s.pending_ops = b.pending_ops.load(std::memory_order_relaxed);
      const std::int64_t since = b.since_ns.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (b.version.load(std::memory_order_relaxed) == v1) {
        s.blocked_ms = s.op ? elapsed_ms(now, since) : -1;
        break;
      }
    }
    out.push_back(s);
  }
  return out;
}

std::int64_t elapsed_ms(std::int64_t now_ns, std::int64_t since_ns) {
  // since_ns is written by a rank: anything is possible. A time not in the past is unknown;
  // the subtraction cannot overflow then (both positive, since <= now).
  if (since_ns <= 0 || since_ns > now_ns) return -1;
  return (now_ns - since_ns) / 1'000'000;
}

std::optional<std::vector<int>> find_wait_cycle(const std::vector<RankSnapshot>& ranks) {
  const int n = static_cast<int>(ranks.size());
  auto next = [&](int r) -> int {
    const RankSnapshot& s = ranks[r];
    const bool running = s.state == static_cast<std::uint32_t>(segment::RankState::Running);
    return running && s.op != 0 && s.peer >= 0 && s.peer < n ? s.peer : -1;
  };
  // Each rank has at most one outgoing edge: follow it, colouring ranks by the walk that
  // first reached them; meeting our own walk again closes a cycle.
  std::vector<int> walk_of(n, -1);
  for (int start = 0; start < n; ++start) {
    int r = start;
    while (r >= 0 && walk_of[r] < 0) {
      walk_of[r] = start;
      r = next(r);
    }
    if (r >= 0 && walk_of[r] == start) {
      std::vector<int> cycle{r};
      for (int x = next(r); x != r; x = next(x)) cycle.push_back(x);
      return cycle;
    }
  }
  return std::nullopt;
}

namespace {
const char* state_name(std::uint32_t state) {
  switch (static_cast<segment::RankState>(state)) {
    case segment::RankState::Empty: return "not joined";
    case segment::RankState::Running: return "running";
    case segment::RankState::Finalized: return "finalized";
    case segment::RankState::Ended: return "ended";
  }
  return "?";
}

std::string human_bytes(std::uint64_t b) {
  char buf[32];
  if (b >= (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / (1u << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}
}  // namespace

namespace {

std::string list_ranks(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

struct RankLine {
  const char* state = "?";
  std::string progress;
};

}  // namespace

void print_hang_report(const segment::Segment& seg, std::ostream& report, const std::string& who,
                       const char* why, const JobView* view, std::chrono::milliseconds settle) {
  // Composed first, written with one call: stderr is unbuffered and shared with the ranks, so
  // piecewise writes would interleave with their output (and readers would see half a line).
  std::ostringstream out;
  const int n = seg.world_size();
  std::vector<int> pids(n, 0);
  if (view)
    for (int r = 0; r < n && r < static_cast<int>(view->pids.size()); ++r) pids[r] = view->pids[r];
  // Two snapshots `settle` apart: a rank whose own writes changed in between is moving.
  ProgressTracker fresh;
  fresh.observe(sample_progress(seg, pids), ProgressTracker::Clock::now());
  std::this_thread::sleep_for(settle);
  fresh.observe(sample_progress(seg, pids), ProgressTracker::Clock::now());
  const auto now = ProgressTracker::Clock::now();
  const auto ranks = snapshot_ranks(seg);

  std::vector<RankLine> lines(n);
  std::vector<int> stopped, unjoined, moving, exited;
  for (int r = 0; r < n; ++r) {
    const RankSnapshot& s = ranks[r];
    const bool ended_by_launcher =
        view && r < static_cast<int>(view->ended.size()) && !view->ended[r].empty();
    RankLine& l = lines[r];
    l.state = state_name(s.state);
    const ProcState proc = fresh.proc(r);
    if (ended_by_launcher || proc == ProcState::Gone) {
      if (s.state != static_cast<std::uint32_t>(segment::RankState::Finalized)) l.state = "exited";
      l.progress = "-";
      exited.push_back(r);
    } else if (proc == ProcState::Stopped) {
      l.state = "stopped";
      l.progress = "none (stopped)";
      stopped.push_back(r);
    } else if (fresh.moved_last(r)) {
      l.progress = "moving";
      moving.push_back(r);
    } else {
      l.progress = "none";
      if (view && view->tracker) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            view->tracker->still_for(r, now))
                            .count();
        if (ms > 0) l.progress = "none for " + std::to_string(ms) + " ms";
      }
    }
    if (s.state == static_cast<std::uint32_t>(segment::RankState::Empty) && !ended_by_launcher &&
        proc != ProcState::Gone)
      unjoined.push_back(r);
  }

  char line[320];
  out << who << ": state of the job (" << why << "):\n";
  std::snprintf(line, sizeof line, "  %-5s %-8s %-11s %-22s %-5s %-6s %-6s %-10s %-8s %-9s %s\n",
                "rank", "pid", "state", "blocked in", "peer", "group", "tag", "bytes", "pending",
                "for", "progress");
  out << line;
  for (const RankSnapshot& s : ranks) {
    const std::string peer = s.op == 0 ? "-" : s.peer < 0 ? "any" : std::to_string(s.peer);
    const std::string since =
        s.op == 0 ? "-" : s.blocked_ms < 0 ? "?" : std::to_string(s.blocked_ms) + " ms";
    const int pid = pids[s.rank] > 0 ? pids[s.rank] : s.pid;
    std::snprintf(line, sizeof line, "  %-5d %-8d %-11s %-22s %-5s %-6s %-6s %-10s %-8u %-9s %s\n",
                  s.rank, pid, lines[s.rank].state,
                  s.op ? segment::blocked_op_name(s.op) : "- (not in a blocking call)",
                  peer.c_str(), s.op ? std::to_string(s.group).c_str() : "-",
                  s.op ? std::to_string(s.tag).c_str() : "-",
                  s.op ? human_bytes(s.bytes).c_str() : "-", s.pending_ops, since.c_str(),
                  lines[s.rank].progress.c_str());
    out << line;
  }
  bool any_ring = false;
  for (int src = 0; src < n; ++src) {
    for (int dst = 0; dst < n; ++dst) {
      if (src == dst) continue;
      const auto& rc = seg.ring_control(src, dst);
      const std::uint64_t head = rc.head_hint.load(std::memory_order_relaxed);
      const std::uint64_t tail = rc.tail.load(std::memory_order_relaxed);
      if (head <= tail) continue;
      if (!any_ring) out << "  rings holding unread data:\n";
      any_ring = true;
      out << "    " << src << " -> " << dst << ": " << human_bytes(head - tail) << " of "
          << human_bytes(seg.ring_size()) << "\n";
    }
  }
  if (!any_ring) out << "  rings: all empty\n";
  for (int r : stopped)
    out << "  stopped: rank " << r << " (pid " << (pids[r] > 0 ? pids[r] : ranks[r].pid)
        << ") is stopped (SIGSTOP or a debugger); send it SIGCONT\n";
  for (int r : unjoined)
    out << "  not joined: rank " << r
        << (pids[r] > 0 ? " (pid " + std::to_string(pids[r]) + ")" : std::string())
        << " never called init_process_group\n";
  for (int r : exited) {
    std::string how = view && r < static_cast<int>(view->ended.size()) ? view->ended[r] : "";
    out << "  exited: rank " << r << " " << (how.empty() ? "has ended" : how) << "\n";
  }
  if (!moving.empty()) out << "  making progress: " << list_ranks(moving) << "\n";
  if (auto cycle = find_wait_cycle(ranks)) {
    bool stuck = true;
    for (int r : *cycle) stuck &= !fresh.moved_last(r);
    out << (stuck ? "  deadlock: " : "  wait-for cycle, but data is moving (not a deadlock): ");
    for (std::size_t i = 0; i < cycle->size(); ++i) {
      const int r = (*cycle)[i];
      const int p = (*cycle)[(i + 1) % cycle->size()];
      out << (i ? ", " : "") << "rank " << r << " waits for rank " << p << " ("
          << segment::blocked_op_name(ranks[r].op) << ")";
    }
    out << "\n";
  }
  const std::string text = out.str();
  report.write(text.data(), static_cast<std::streamsize>(text.size()));
  report.flush();
}

}  // namespace shmdist::job
