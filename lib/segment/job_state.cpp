#include "segment/job_state.hpp"

#include <signal.h>
#include <string.h>
#include <time.h>

#include "wait/doorbell.hpp"

namespace shmdist::segment {

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describe_end(EndKind kind, int code) {
  switch (kind) {
    case EndKind::Exited:
      return "exited with code " + std::to_string(code);
    case EndKind::Signaled:
      return "was killed by signal " + std::to_string(code) + " (" + signal_name(code) + ")";
    case EndKind::Vanished:
      return "is gone without finalizing (its exit status is unknown to this rank)";
    case EndKind::Threw:
      return "threw an exception";
    case EndKind::Finalized:
      return "finalized (destroy_process_group) or exited while its peers still needed it";
    case EndKind::None:
      break;
  }
  return "ended";
}

namespace {
// Whether a failure record says how the rank ended (an exit code, a signal, an exception),
// rather than only that it is gone.
bool says_how(EndKind kind) {
  return kind == EndKind::Exited || kind == EndKind::Signaled || kind == EndKind::Threw ||
         kind == EndKind::Finalized;
}

// How `rank` ended, from its control block, for a root cause found through failed_because.
void end_of(const Segment& seg, int rank, EndKind& kind, int& code) {
  const RankControl& rc = seg.rank_control(rank);
  kind = static_cast<EndKind>(rc.end_kind.load(std::memory_order_acquire));
  code = rc.end_code.load(std::memory_order_relaxed);  // ordered by the acquire above
  // A clean exit is no failure of its own: say that the rank left while it was needed.
  if (says_how(kind) && !(kind == EndKind::Exited && code == 0)) return;
  code = 0;
  const auto state = static_cast<RankState>(rc.state.load(std::memory_order_acquire));
  kind = state == RankState::Finalized || kind == EndKind::Exited ? EndKind::Finalized
                                                                  : EndKind::Vanished;
}

// "rank R (pid P)", R the global rank.
std::string who_is(const Segment& seg, int rank) {
  std::string who = "rank " + std::to_string(seg.rank_name(rank));
  if (const int pid = seg.rank_control(rank).pid.load(std::memory_order_relaxed); pid > 0)
    who += " (pid " + std::to_string(pid) + ")";
  return who;
}
}  // namespace

std::string describe_rank_end(const Segment& seg, int rank) {
  const RankControl& rc = seg.rank_control(rank);
  const auto kind = static_cast<EndKind>(rc.end_kind.load(std::memory_order_acquire));
  return who_is(seg, rank) + " " + describe_end(kind, rc.end_code.load(std::memory_order_relaxed));
}

std::string describe_job_failure(const Segment& seg) {
  const SegmentHeader& h = seg.header();
  const int rank = h.failed_rank.load(std::memory_order_acquire);
  if (rank < 0 || rank >= seg.world_size()) {
    switch (static_cast<AbortReason>(h.abort_reason.load(std::memory_order_acquire))) {
      case AbortReason::Timeout:
        return std::string("the job was stopped by its launcher because its time limit (") +
               (h.flags & kStartedByLaunch ? "LaunchOptions::job_timeout" : "shmrun --timeout") +
               ") expired; stopping this call";
      case AbortReason::Startup:
        return "the job was aborted while it started (a rank could not be launched)";
      case AbortReason::SharedIdentity:
        return "the job was aborted because a second job was started with the same identity "
               "while its ranks met (a second rank 0, or two processes for one rank), so some "
               "ranks here may be that job's. Give each job its own identity (its own MASTER_PORT for "
               "torchrun-style variables, or start it with shmrun) and start both again";
      case AbortReason::None:
        break;
    }
    return "the job was aborted by its launcher; stopping this call";
  }
  const auto kind = static_cast<EndKind>(h.failed_kind.load(std::memory_order_acquire));
  const int code = h.failed_code.load(std::memory_order_relaxed);
  std::string what = who_is(seg, rank) + " " + describe_end(kind, code);
  // A rank that exited non-zero or threw after raising PeerFailure because a peer finalized or
  // exited: its own end may be that PeerFailure's consequence or a failure of its own (it
  // caught it and went on); nobody can tell which, so both are named, the cause last.
  // (record_job_failure replaced a rank with an unknown end by its cause; a signal is its own.)
  if (kind == EndKind::Exited || kind == EndKind::Threw) {
    if (const int root = root_cause(seg, rank); root != rank) {
      EndKind root_kind{};
      int root_code = 0;
      end_of(seg, root, root_kind, root_code);
      what += " after " + who_is(seg, root) + " " + describe_end(root_kind, root_code);
    }
  }
  return "peer failure: " + what + "; the job is aborted, so this call cannot complete";
}

void record_rank_end(const Segment& seg, int rank, EndKind kind, int code) {
  RankControl& rc = seg.rank_control(rank);
  rc.end_code.store(code, std::memory_order_relaxed);
  rc.end_kind.store(static_cast<std::uint32_t>(kind), std::memory_order_release);
  // A rank that finalized and then exited cleanly stays "finalized": it owes nothing.
  std::uint32_t finalized = static_cast<std::uint32_t>(RankState::Finalized);
  const bool clean = kind == EndKind::Exited && code == 0;
  if (!(clean && rc.state.load(std::memory_order_acquire) == finalized))
    rc.state.store(static_cast<std::uint32_t>(RankState::Ended), std::memory_order_release);
  wake_all(seg);
}

void record_failure_cause(const Segment& seg, int rank, int cause) {
  if (cause < 0 || cause >= seg.world_size() || cause == rank) return;
  int none = 0;
  // Once: the first cause stands. What readers (root_cause, acquire) rely on is the value
  // alone: end_of then reads the cause's end with its own acquire loads, paired with the
  // release stores of the cause (mark_finalized) or of its launcher (record_rank_end), and
  // says "gone" if nothing is written there yet. Release here adds only this: when this rank
  // saw that end in the cause's control block, the reader sees it too; when it learned of it
  // through a pidfd or kill(), there is no store to pair with, and nothing depends on one.
  seg.rank_control(rank).failed_because.compare_exchange_strong(
      none, cause + 1, std::memory_order_release, std::memory_order_relaxed);
}

int root_cause(const Segment& seg, int rank) {
  // Follow "failed because" from rank to rank; at most world_size steps (no cycle can trap us).
  for (int steps = 0; rank >= 0 && rank < seg.world_size() && steps < seg.world_size();
       ++steps) {
    const int because =
        seg.rank_control(rank).failed_because.load(std::memory_order_acquire) - 1;
    if (because < 0 || because >= seg.world_size() || because == rank) break;
    rank = because;
  }
  return rank;
}

bool record_job_failure(const Segment& seg, int rank, EndKind kind, int code) {
  SegmentHeader& h = seg.header();
  bool first = false;
  if (rank < 0) {
    // An abort without a rank is the job's first cause too, if no rank failed before it: a
    // rank that ends because of it (it raised PeerFailure and exited) must not take its place
    // when a peer sees that end first. (A rank that saw the holder of a shared identity vanish
    // after it had aborted the job used to name that rank, "gone without finalizing".)
    // Release: describe_job_failure's acquire load of failed_rank that reads kAbortedFirst
    // also sees abort_reason, which record_job_abort set (or acquired) before this call.
    int expected = -1;
    first = h.failed_rank.compare_exchange_strong(expected, kAbortedFirst,
                                                  std::memory_order_acq_rel);
  } else if (rank < seg.world_size()) {
    // A rank that saw a peer vanish knows less than the launcher, which may already have
    // written how the peer ended into its control block: use that.
    if (!says_how(kind)) {
      const RankControl& rc = seg.rank_control(rank);
      const auto known = static_cast<EndKind>(rc.end_kind.load(std::memory_order_acquire));
      if (says_how(known)) {
        kind = known;
        code = rc.end_code.load(std::memory_order_relaxed);
      }
    }
    // A rank that raised PeerFailure because a peer finalized or exited first, and whose own
    // end is unknown, is not the root cause: name the peer, and how it ended, so that every
    // survivor names the rank whose end started it. A rank whose end is known keeps it: a
    // signal is its own root cause; an exit code or exception is described with the cause
    // after it (describe_job_failure).
    if (!says_how(kind)) {
      if (const int root = root_cause(seg, rank); root != rank) {
        rank = root;
        end_of(seg, rank, kind, code);
      }
    }
    int expected = -1;
    first = h.failed_rank.compare_exchange_strong(expected, rank, std::memory_order_acq_rel);
    // The first record wins, but one that only said "gone" is completed when the launcher
    // learns how that same rank ended (readers load kind with acquire, then code).
    const auto recorded = static_cast<EndKind>(h.failed_kind.load(std::memory_order_acquire));
    const bool refine = !first && expected == rank && says_how(kind) && !says_how(recorded);
    if (first || refine) {
      h.failed_code.store(code, std::memory_order_relaxed);
      h.failed_kind.store(static_cast<std::uint32_t>(kind), std::memory_order_release);
    }
  }
  // Release: whoever sees Aborted also sees the failure fields written above.
  h.job_state.store(static_cast<std::uint32_t>(JobState::Aborted), std::memory_order_release);
  wake_all(seg);
  return first;
}

void record_job_abort(const Segment& seg, AbortReason reason) {
  SegmentHeader& h = seg.header();
  // The first reason stands, as the first failure does (a launcher's time limit on a job
  // already aborted for a shared identity changes neither its words nor the exception).
  // record_job_failure's release operations below publish it to readers that acquire
  // failed_rank or job_state. acq_rel / acquire: an abort that lost this race acquires the
  // winner's reason here, so its own release below (it may set failed_rank first) publishes
  // that reason too.
  auto none = static_cast<std::uint32_t>(AbortReason::None);
  h.abort_reason.compare_exchange_strong(none, static_cast<std::uint32_t>(reason),
                                         std::memory_order_acq_rel, std::memory_order_acquire);
  record_job_failure(seg, -1, EndKind::None, 0);
}

void wake_all(const Segment& seg) {
  for (int r = 0; r < seg.world_size(); ++r) wait::wake(seg.rank_control(r).doorbell_seq);
}

std::int64_t wall_clock_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace shmdist::segment
