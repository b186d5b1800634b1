#include "bootstrap/rendezvous.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "base/config.hpp"
#include "base/env.hpp"
#include "base/process_alive.hpp"
#include "bootstrap/identity_claim.hpp"
#include "bootstrap/rendezvous_object.hpp"
#include "segment/job_state.hpp"
#include "segment/segment.hpp"

namespace shmdist::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t fnv1a64(const std::string& s) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::string mpi_job_id() {
  if (auto id = env::get("OMPI_MCA_ess_base_jobid")) return "ompi:" + *id;
  if (auto id = env::get("PMIX_NAMESPACE")) return "pmix:" + *id;
  return "ompi-parent:" + std::to_string(getppid());
}

std::string pmi_job_id() {
  if (auto id = env::get("PMI_KVSNAME")) return "pmi:" + *id;
  if (auto id = env::get("PMIX_NAMESPACE")) return "pmix:" + *id;
  return "pmi-parent:" + std::to_string(getppid());
}

std::string rendezvous_name(const std::string& job_id, int world_size, const std::string& shm_tag) {
  char hash[40];
  std::snprintf(hash, sizeof hash, "rv-%016llx",
                static_cast<unsigned long long>(
                    fnv1a64(job_id + "/" + std::to_string(world_size))));
  return shm_object_name(shm_tag, hash);
}

std::string rendezvous_name(const std::string& job_id, int world_size) {
  return rendezvous_name(job_id, world_size,
                         config::from_environment({"SHMDIST_SHM_TAG"}).shm_tag);
}

namespace {

constexpr const char* kRemedy =
    "give this job another identity (MASTER_ADDR/MASTER_PORT for torchrun-style jobs)";

// Marks the segment's job aborted because a second job has its identity: every rank in it
// fails (those still meeting with SetupError, those already past with PeerFailure), so that
// no rank ever runs with ranks of the other job. record_job_abort's release store of the job
// state publishes the reason to every rank's acquire load of it.
// Ranks still waiting for their rank 0 learn of it from the contest mark.
void abort_shared_identity(const segment::Segment& seg, const std::string& name) {
  segment::record_job_abort(seg, segment::AbortReason::SharedIdentity);
  mark_contested(name);
}

std::string shared_identity_error(const std::string& job_id, int world, const std::string& what) {
  return what + ": two jobs were started with the job identity '" + job_id + "' (world size " +
         std::to_string(world) +
         "), and a rank cannot tell whose ranks it meets, so both stop. Give each job its own "
         "identity (its own MASTER_PORT for torchrun-style variables, or start it with "
         "shmrun) and start it again.";
}

// Whether the last contest over `name` concerns a rendezvous of this process that may have
// waited since `began_ns`: it came after that, and within the last `timeout` (the longest any
// rank of a job waits for the others). An older mark cannot be about a job forming now: its
// ranks would have given up waiting. (A process started before an unrelated contest, that
// rendezvouses for the first time long after it, used to fail at once.)
bool contest_concerns(const std::string& name, std::int64_t began_ns,
                      std::chrono::milliseconds timeout) {
  const std::int64_t at = contested_at(name);
  const std::int64_t window_start =
      contest_clock_ns() - std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  return at != 0 && at >= std::max(began_ns, window_start);
}

// Rank 0, holding the identity's claim: creates a fresh segment under `name`. Whatever is
// under the name already was left by an earlier job of this identity (nobody else can hold
// the claim, and only its holder creates): it is replaced. Returns it with its object held
// open.
NamedObject create_claimed(const std::string& name, int world, std::uint64_t ring_size,
                           const std::string& job_id, Clock::time_point deadline) {
  for (;;) {
    NamedObject obj = create_named_object(name, world, ring_size);
    if (obj.fd >= 0) {
      // Created. If a rank of an earlier job removed the name in the instant before we
      // locked the object, start over with a fresh one.
      if (still_named(obj.fd, name)) return obj;
      continue;
    }
    // Refuses (throws) another user's object and another shmdist version's segment.
    NamedObject old = open_named_object(name, world, kRemedy);
    if (old.segment) {
      remove_name_of(old.fd, name,
                     "replacing the stale segment '" + name + "' left by an earlier job with "
                     "the identity '" + job_id + "' (no live rank 0 holds that identity any "
                     "more)");
      continue;
    }
    // Incomplete or invalid: replaced once nobody holds its creation lock.
    if (old.fd >= 0 && remove_if_abandoned(old.fd, name)) continue;
    if (old.fd < 0) continue;  // gone meanwhile
    if (Clock::now() >= deadline)
      throw SetupError("rank 0 could not create the segment '" + name + "' of the job '" +
                       job_id + "' within the timeout" +
                       (old.invalid.empty() ? std::string() : " (" + old.invalid + ")") +
                       "; " + kRemedy);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Any other rank: waits for the segment created by the process that holds the identity's
// claim, and returns it with its object held open. `who` names this rank in texts.
NamedObject join_claimed(const std::string& name, int rank, const std::string& who, int world,
                         const std::string& job_id, Clock::time_point deadline,
                         std::int64_t began_ns, std::chrono::milliseconds timeout,
                         std::int64_t arrived_ns, const std::function<void()>& check) {
  auto next_check = Clock::now();
  for (;;) {
    if (check && Clock::now() >= next_check) {
      check();
      next_check = Clock::now() + std::chrono::milliseconds(50);
    }
    // Refuses (throws) another user's object and another shmdist version's segment.
    NamedObject obj = open_named_object(name, world, kRemedy);
    const ClaimHolder holder = claim_holder(name, job_id);
    const bool claimed = holder.pid > 0 && obj.segment &&
                         static_cast<int>(obj.segment->header().creator_pid) == holder.pid;
    if (claimed) {
      // Our slot already taken by another process: two processes are this rank of this
      // identity, so two jobs share it. The job being formed may hold ranks of both.
      const auto& rc = obj.segment->rank_control(rank);
      if (rc.state.load(std::memory_order_acquire) != 0) {
        const int pid = rc.pid.load(std::memory_order_relaxed);
        abort_shared_identity(*obj.segment, name);
        remove_name_of(obj.fd, name);
        throw SetupError(shared_identity_error(
            job_id, world,
            who + " of the job '" + job_id + "' is already taken by the live process " +
                (pid > 0 ? std::to_string(pid) : std::string("(starting)")) +
                " in the segment of rank 0 (pid " + std::to_string(holder.pid) + ")"));
      }
      return obj;
    }
    if (holder.started) {
      mark_contested(name);  // our own rank 0, if it claims the identity later, must not wait
      // If that job formed while we were already waiting, it may hold the rank meant for us
      // (another job's process took our slot): its holder then aborts it (identity_claim.hpp).
      report_late_arrival(name, job_id, arrived_ns);
      throw SetupError(shared_identity_error(
          job_id, world,
          who + " cannot join the job '" + job_id + "': a job with that identity, whose rank "
          "0 is process " + std::to_string(holder.pid) + ", is already running with all " +
          std::to_string(world) + " of its ranks (it is aborted too if it formed while this "
          "rank was already waiting to join)"));
    }
    // A contest while we waited: our rank 0 may have lost it (and will never come).
    if (contest_concerns(name, began_ns, timeout))
      throw SetupError(shared_identity_error(
          job_id, world,
          who + " waited for its rank 0 while a second job with the identity '" + job_id +
              "' was found"));
    if (Clock::now() >= deadline)
      throw SetupError(
          who + " could not join the job '" + job_id + "' on segment '" + name +
          "' within the timeout: " +
          (holder.pid > 0 ? "its rank 0 (pid " + std::to_string(holder.pid) +
                                ") holds the job identity but has no segment ready"
                          : std::string("no rank 0 holds the job identity (is rank 0 running, "
                                        "with the same identity and world size?)")) +
          (obj.invalid.empty() ? std::string() : " (" + obj.invalid + ")") + "; " + kRemedy);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

int dead_participant(const segment::Segment& seg, int self, int& pid) {
  for (int r = 0; r < seg.world_size(); ++r) {
    if (r == self) continue;
    const auto& rc = seg.rank_control(r);
    if (rc.state.load(std::memory_order_acquire) == 0) continue;
    pid = rc.pid.load(std::memory_order_relaxed);
    if (pid > 0 && !process_alive(pid)) return r;
  }
  pid = seg.header().creator_pid;
  if (pid != getpid() && !process_alive(pid)) return -1;
  return -2;
}

JoinedWorld join_by_rendezvous(int rank, int world, const std::string& job_id,
                               const InitOptions& options, const config::Config& config,
                               const TransportWrap& wrap, const std::vector<int>& global_of,
                               const std::function<void()>& check) {
  const std::string name = rendezvous_name(job_id, world, config.shm_tag);
  const std::uint64_t ring_size = config.ring_size.value_or(segment::default_ring_size(world));
  const auto deadline = Clock::now() + options.timeout;
  // When this rank began to join (the clock of the claim's reports, identity_claim.hpp).
  const std::int64_t arrived_ns = contest_clock_ns();
  // A contest over our identity since this process started concerns us (rendezvous_object.hpp),
  // unless it came before this process's previous rendezvous ended or longer than the timeout
  // ago (contest_concerns).
  static std::atomic<std::int64_t> last_rendezvous_end{0};
  const std::int64_t began_ns =
      std::max(process_start_ns(), last_rendezvous_end.load(std::memory_order_relaxed));
  struct NoteEnd {
    // Relaxed: the value stands alone (nothing else is published with it).
    ~NoteEnd() { last_rendezvous_end.store(contest_clock_ns(), std::memory_order_relaxed); }
  } note_end;
  // Texts name global ranks (a job across hosts numbers a host's ranks from 0 here).
  auto rank_text = [&](int r) {
    return "rank " + std::to_string(r >= 0 && r < static_cast<int>(global_of.size())
                                        ? global_of[r]
                                        : r);
  };
  // Rank 0 claims the identity for as long as its group lives (see identity_claim.hpp);
  // the others join only the segment of the claim's holder.
  std::shared_ptr<IdentityClaim> claim;
  NamedObject obj;
  if (rank == 0) {
    try {
      claim = IdentityClaim::take(name, job_id, world, arrived_ns);
    } catch (const SetupError&) {
      mark_contested(name);  // our other ranks must not wait for us
      throw;
    }
    obj = create_claimed(name, world, ring_size, job_id, deadline);
  } else {
    obj = join_claimed(name, rank, rank_text(rank), world, job_id, deadline, began_ns,
                       options.timeout, arrived_ns, check);
  }
  auto seg = obj.segment;
  if (!global_of.empty()) seg->name_ranks(global_of);
  JoinedWorld joined;
  try {
    joined = attach_world(seg, rank, options.timeout, config, /*supervised=*/false, wrap);
  } catch (const SetupError&) {
    // Another process took our slot between join_claimed's look and our claim of it: two
    // processes are this rank of this identity (see join_claimed).
    if (static_cast<int>(seg->rank_control(rank).pid.load(std::memory_order_relaxed)) !=
            getpid() &&
        seg->rank_control(rank).state.load(std::memory_order_acquire) != 0) {
      abort_shared_identity(*seg, name);
      remove_name_of(obj.fd, name);
      throw SetupError(shared_identity_error(
          job_id, world, rank_text(rank) + " of the job '" + job_id +
                             "' was taken by another process at the same moment"));
    }
    throw;
  }
  if (claim) joined.after_destroy = [claim] { claim->release(); };
  // Wait for the full set, watching those who joined: a rank that dies now fails the job
  // at once (no launcher would tell us). The name goes as soon as everyone has attached,
  // or as soon as the job cannot start any more.
  auto& attached = seg->header().attached;
  auto aborted = [&] {
    return seg->header().job_state.load(std::memory_order_acquire) ==
           static_cast<std::uint32_t>(segment::JobState::Aborted);
  };
  // Rank 0: a second rank 0 of this identity told us it exists, or a contest over it was
  // marked since this process started (and within the timeout) (a rank of ours may have failed on it: it would never
  // come). Some ranks that joined (or will) may be the other job's: abort ours, before any
  // rank of it runs a call.
  auto check_collision = [&](bool look_at_mark) {
    if (!claim) return;
    if (!claim->collision_reported() &&
        !(look_at_mark && contest_concerns(name, began_ns, options.timeout)))
      return;
    abort_shared_identity(*seg, name);
    remove_name_of(obj.fd, name);
    throw SetupError(shared_identity_error(
        job_id, world, "rank 0 of the job '" + job_id + "' (pid " + std::to_string(getpid()) +
                           ") learned that another job with its identity was started"));
  };
  auto throw_aborted = [&] {
    remove_name_of(obj.fd, name);
    const std::string why = segment::describe_job_failure(*seg);
    if (seg->header().abort_reason.load(std::memory_order_acquire) ==
        static_cast<std::uint32_t>(segment::AbortReason::SharedIdentity))
      throw SetupError(rank_text(rank) + " of the job '" + job_id + "': " + why);
    throw PeerFailure(why);
  };
  auto next_check = Clock::now();
  while (attached.load(std::memory_order_acquire) < static_cast<std::uint32_t>(world)) {
    const auto now = Clock::now();
    if (aborted()) throw_aborted();
    check_collision(/*look_at_mark=*/now >= next_check);
    if (now >= next_check) {
      next_check = now + std::chrono::milliseconds(50);
      if (check) {
        try {
          check();
        } catch (...) {
          remove_name_of(obj.fd, name);
          throw;
        }
      }
      int pid = 0;
      const int dead = dead_participant(*seg, rank, pid);
      // A rank that ended once everyone had joined is the transport's business, not ours.
      if (dead != -2 && attached.load(std::memory_order_acquire) < std::uint32_t(world)) {
        // A rank that aborted the job (a shared identity) and then exited: the abort is
        // why, not its end. It stored the abort before it exited; the exit, seen here
        // through the kernel (pidfd or kill), comes after every store the process made.
        if (aborted()) throw_aborted();
        if (dead >= 0) segment::record_job_failure(*seg, dead, segment::EndKind::Vanished, 0);
        remove_name_of(obj.fd, name);
        throw PeerFailure(
            (dead >= 0 ? rank_text(dead) + " (pid " + std::to_string(pid) + ")"
                       : "the process that created the segment (pid " + std::to_string(pid) +
                             ")") +
            " of the job '" + job_id + "' died during the rendezvous, when " +
            std::to_string(attached.load()) + " of " + std::to_string(world) +
            " ranks had joined; the job cannot start. Start all its ranks again.");
      }
    }
    if (now >= deadline) {
      remove_name_of(obj.fd, name);
      throw SetupError("only " + std::to_string(attached.load()) + " of " + std::to_string(world) +
                       " ranks joined the job '" + job_id + "' within the timeout of " +
                       std::to_string(options.timeout.count()) +
                       " ms; check that every rank was started with the same world size");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (claim) {
    check_collision(true);  // the last word of a contest that came while we met
    claim->mark_started();  // before the name goes: a rank arriving later fails at once
    clear_contested(name, began_ns);  // a contest before our claim concerns no one now
    // Later ranks' probes would otherwise fill the claim's listen queues for good. A report
    // from a rank that was already waiting while we formed aborts the job: it cannot be told
    // from a job that took another job's rank (identity_claim.hpp). Ranks see the abort at
    // their next wait (PeerFailure naming the shared identity).
    joined.health_hook = [claim, seg, name] {
      if (claim->drain()) abort_shared_identity(*seg, name);
    };
  }
  remove_name_of(obj.fd, name);  // every rank tries; the first one removes it
  seg->close_fd();
  return joined;
}

}  // namespace shmdist::detail
