#include "pg/rendezvous.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "pg/config.hpp"
#include "pg/env.hpp"
#include "pg/process_alive.hpp"
#include "pg/rendezvous_object.hpp"
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

// A segment is stale when no live job can still be using its name: everyone already
// attached (the name should be gone), its creator died, or our rank's slot belongs to a
// dead process. Throws if a live process holds our rank: two jobs share one identity.
bool is_stale(const segment::Segment& seg, int rank, const std::string& job_id) {
  const auto& h = seg.header();
  if (h.attached.load(std::memory_order_acquire) >= h.world_size) return true;
  if (!process_alive(h.creator_pid)) return true;
  const auto& rc = seg.rank_control(rank);
  if (rc.state.load(std::memory_order_acquire) != 0) {
    const int pid = rc.pid.load(std::memory_order_relaxed);
    if (!process_alive(pid)) return true;
    throw SetupError("rank " + std::to_string(rank) + " of the job '" + job_id +
                     "' is already taken by the live process " + std::to_string(pid) +
                     ": two jobs use the same identity. Give each job its own MASTER_PORT.");
  }
  return false;
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

// Finds or creates the job's segment. Returns it with its object held open.
NamedObject find_or_create(const std::string& name, int rank, int world, std::uint64_t ring_size,
                           const std::string& job_id, Clock::time_point deadline) {
  for (;;) {
    NamedObject obj = create_named_object(name, world, ring_size);
    if (obj.fd >= 0) {
      // Created. If a joiner took our object for abandoned in the instant before we locked
      // it, its name is gone (or already someone else's): start over with a fresh one.
      if (still_named(obj.fd, name)) return obj;
      continue;
    }
    obj = open_named_object(name, world, kRemedy);
    if (obj.segment) {
      if (!is_stale(*obj.segment, rank, job_id)) return obj;
      remove_name_of(obj.fd, name, "replacing the stale segment '" + name +
                                        "' left by a crashed job");
      continue;
    }
    // Incomplete or invalid (its creator died before finishing it): replaced once nobody
    // holds its creation lock.
    if (obj.fd >= 0 && remove_if_abandoned(obj.fd, name)) continue;
    if (Clock::now() >= deadline)
      throw SetupError("rank " + std::to_string(rank) + " could not join the job '" + job_id +
                       "' on segment '" + name + "' within the timeout" +
                       (obj.invalid.empty() ? std::string() : " (" + obj.invalid + ")") +
                       "; " + kRemedy);
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

std::shared_ptr<ProcessGroup::Impl> join_by_rendezvous(int rank, int world,
                                                       const std::string& job_id,
                                                       const InitOptions& options,
                                                       const config::Config& config,
                                                       const TransportWrap& wrap) {
  const std::string name = rendezvous_name(job_id, world, config.shm_tag);
  const std::uint64_t ring_size = config.ring_size.value_or(segment::default_ring_size(world));
  const auto deadline = Clock::now() + options.timeout;
  NamedObject obj = find_or_create(name, rank, world, ring_size, job_id, deadline);
  auto seg = obj.segment;
  auto impl = std::make_shared<ProcessGroup::Impl>(seg, rank, options.timeout, config,
                                                   /*supervised=*/false, wrap);
  // Wait for the full set, watching those who joined: a rank that dies now fails the job
  // at once (no launcher would tell us). The name goes as soon as everyone has attached,
  // or as soon as the job cannot start any more.
  auto& attached = seg->header().attached;
  auto next_check = Clock::now();
  while (attached.load(std::memory_order_acquire) < static_cast<std::uint32_t>(world)) {
    const auto now = Clock::now();
    if (seg->header().job_state.load(std::memory_order_acquire) ==
        static_cast<std::uint32_t>(segment::JobState::Aborted)) {
      remove_name_of(obj.fd, name);
      throw PeerFailure(segment::describe_job_failure(*seg));
    }
    if (now >= next_check) {
      next_check = now + std::chrono::milliseconds(50);
      int pid = 0;
      const int dead = dead_participant(*seg, rank, pid);
      // A rank that ended once everyone had joined is the transport's business, not ours.
      if (dead != -2 && attached.load(std::memory_order_acquire) < std::uint32_t(world)) {
        if (dead >= 0) segment::record_job_failure(*seg, dead, segment::EndKind::Vanished, 0);
        remove_name_of(obj.fd, name);
        throw PeerFailure(
            (dead >= 0 ? "rank " + std::to_string(dead) + " (pid " + std::to_string(pid) + ")"
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
  remove_name_of(obj.fd, name);  // every rank tries; the first one removes it
  seg->close_fd();
  return impl;
}

}  // namespace shmdist::detail
