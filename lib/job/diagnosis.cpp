#include "job/diagnosis.hpp"

#include <cstdio>
#include <functional>

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
        s.blocked_seconds = s.op ? static_cast<double>(now - since) / 1e9 : 0;
        break;
      }
    }
    out.push_back(s);
  }
  return out;
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

void print_hang_report(const segment::Segment& seg, std::ostream& out, const std::string& who,
                       const char* why) {
  const auto ranks = snapshot_ranks(seg);
  char line[256];
  out << who << ": state of the job (" << why << "):\n";
  std::snprintf(line, sizeof line, "  %-5s %-8s %-11s %-22s %-5s %-6s %-6s %-10s %-8s %s\n",
                "rank", "pid", "state", "blocked in", "peer", "group", "tag", "bytes", "pending",
                "for");
  out << line;
  for (const RankSnapshot& s : ranks) {
    const std::string peer = s.op == 0 ? "-" : s.peer < 0 ? "any" : std::to_string(s.peer);
    std::snprintf(line, sizeof line, "  %-5d %-8d %-11s %-22s %-5s %-6s %-6s %-10s %-8u %s\n",
                  s.rank, s.pid, state_name(s.state),
                  s.op ? segment::blocked_op_name(s.op) : "- (not in a blocking call)",
                  peer.c_str(), s.op ? std::to_string(s.group).c_str() : "-",
                  s.op ? std::to_string(s.tag).c_str() : "-",
                  s.op ? human_bytes(s.bytes).c_str() : "-", s.pending_ops,
                  s.op ? (std::to_string(static_cast<long long>(s.blocked_seconds * 1000)) + " ms")
                             .c_str()
                       : "-");
    out << line;
  }
  bool any_ring = false;
  for (int src = 0; src < seg.world_size(); ++src) {
    for (int dst = 0; dst < seg.world_size(); ++dst) {
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
  if (auto cycle = find_wait_cycle(ranks)) {
    out << "  deadlock: ";
    for (std::size_t i = 0; i < cycle->size(); ++i) {
      const int r = (*cycle)[i];
      const int p = (*cycle)[(i + 1) % cycle->size()];
      out << (i ? ", " : "") << "rank " << r << " waits for rank " << p << " ("
          << segment::blocked_op_name(ranks[r].op) << ")";
    }
    out << "\n";
  }
  out.flush();
}

}  // namespace shmdist::job
