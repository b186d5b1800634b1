#include "pg/rendezvous.hpp"

#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "pg/env.hpp"
#include "segment/segment.hpp"
#include "pg/process_alive.hpp"

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

std::uint64_t ring_size_for(int world) {
  if (const auto v = env::get("SHMDIST_RING_SIZE")) {
    const std::uint64_t size = segment::parse_byte_size(*v, "SHMDIST_RING_SIZE");
    segment::check_ring_size(size, "SHMDIST_RING_SIZE");
    return size;
  }
  return segment::default_ring_size(world);
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

// Removes the name of the stale segment `seg` (which we hold open), unless it already names
// another segment. Replacers of one stale segment serialise on a lock of that segment, and
// only a holder of the lock can unlink its name, so checking that the name still refers to
// the same inode and then unlinking cannot remove a fresh segment another rank just created.
void remove_stale(const segment::Segment& seg, const std::string& name) {
  const int fd = seg.fd();
  if (fd < 0 || flock(fd, LOCK_EX) != 0) return;
  struct stat held {}, named {};
  const std::string path = "/dev/shm/" + name;
  if (fstat(fd, &held) == 0 && stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
      held.st_dev == named.st_dev) {
    std::fprintf(stderr, "shmdist: replacing the stale segment '%s' left by a crashed job\n",
                 name.c_str());
    segment::Segment::remove_name(name);
  }
  flock(fd, LOCK_UN);
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

std::string rendezvous_name(const std::string& job_id, int world_size) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "shmdist-%u-rv-%016llx", static_cast<unsigned>(getuid()),
                static_cast<unsigned long long>(
                    fnv1a64(job_id + "/" + std::to_string(world_size))));
  return buf;
}

std::shared_ptr<ProcessGroup::Impl> join_by_rendezvous(int rank, int world,
                                                       const std::string& job_id,
                                                       const InitOptions& options,
                                                       long spin_us_override) {
  const std::string name = rendezvous_name(job_id, world);
  const std::uint64_t ring_size = ring_size_for(world);
  const auto deadline = Clock::now() + options.timeout;
  auto seg = std::make_shared<segment::Segment>();
  for (;;) {
    bool exists = false;
    *seg = segment::Segment::create_named(world, ring_size, name, &exists);
    if (seg->valid()) break;
    *seg = segment::Segment::attach_name(name, world);
    if (seg->valid()) {
      if (!is_stale(*seg, rank, job_id)) break;
      remove_stale(*seg, name);
      continue;
    }
    if (Clock::now() >= deadline)
      throw SetupError("rank " + std::to_string(rank) + " could not join the job '" + job_id +
                       "' on segment '" + name + "' within the timeout");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto impl = std::make_shared<ProcessGroup::Impl>(seg, rank, options.timeout, spin_us_override,
                                                   /*supervised=*/false);
  // Wait for the full set; the name goes as soon as everyone has attached.
  auto& attached = seg->header().attached;
  while (attached.load(std::memory_order_acquire) < static_cast<std::uint32_t>(world)) {
    if (Clock::now() >= deadline) {
      segment::Segment::remove_name(name);
      throw SetupError("only " + std::to_string(attached.load()) + " of " + std::to_string(world) +
                       " ranks joined the job '" + job_id + "' within the timeout of " +
                       std::to_string(options.timeout.count()) +
                       " ms; check that every rank was started with the same world size");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  segment::Segment::remove_name(name);  // idempotent: every rank may try
  seg->close_fd();
  return impl;
}

}  // namespace shmdist::detail
