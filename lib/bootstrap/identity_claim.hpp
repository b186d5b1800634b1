// The claim on a job identity (bootstrap/rendezvous.cpp): ranks started without shmrun meet on a
// segment named after their job's identity (MASTER_ADDR:MASTER_PORT and WORLD_SIZE, an MPI
// job id), and nothing else tells two jobs started with the same identity apart. So the
// job's rank 0 claims the identity before it creates the segment, as torch's TCPStore
// claims MASTER_PORT by binding it: it binds and listens on an abstract Unix socket named
// after the rendezvous ("\0<segment name>") for as long as its process group lives.
//
// - Binding is exclusive: a second job's rank 0 fails at once, naming the holder's pid.
// - The kernel drops the claim the instant its holder ends: a claim is never stale. A
//   segment whose creator holds the claim is a live job's (never replaced); any other
//   segment under the name is a leftover, which only the claim's holder replaces.
// - Other ranks learn who holds the claim by connecting (SO_PEERCRED: the listener's pid and
//   uid; the holder never has to accept), and join a segment only if its creator is that
//   pid.
// - Once every rank has joined, the holder also binds "<name>.started": a rank that arrives
//   later finds the job running and fails at once instead of waiting for a segment.
// - A rank 0 that finds the identity taken tells the holder (a report over the socket: a
//   byte and the moment the reporter's rendezvous began): while the holder's job is still
//   forming, some of its ranks may be the second job's, so the holder aborts it (see
//   join_by_rendezvous). So does a rank that finds the job already running: a report
//   read once the job runs still aborts it if the reporter began its rendezvous before the
//   job had all its ranks (the reporter was waiting for this identity while the job formed,
//   so the job may hold the rank meant for it: two jobs' ranks). A later reporter (a stray
//   process colliding with a job that formed without it) leaves the job alone.
//
// - A forked child (a DataLoader worker) closes the claim's sockets at once: only the process
//   that took the claim holds it.
//
// Abstract sockets belong to the network namespace: the ranks of one job must share it (as
// they share /dev/shm and the pid namespace). Torch's TCPStore on MASTER_PORT is another
// socket altogether: both coexist in one job.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shmdist::detail {

class IdentityClaim {
 public:
  // Claims `name` (a rendezvous segment name) for the job `job_id` of `world` ranks. Throws
  // SetupError naming the identity and the process that holds it if another one does; that
  // holder is told (see above).
  // `began_ns` (contest_clock_ns) is when this rank's rendezvous began, for the report.
  static std::unique_ptr<IdentityClaim> take(const std::string& name, const std::string& job_id,
                                             int world, std::int64_t began_ns);
  ~IdentityClaim();
  IdentityClaim(const IdentityClaim&) = delete;
  IdentityClaim& operator=(const IdentityClaim&) = delete;

  // Whether a second rank 0 of this identity has told us since the last call. Takes every
  // connection waiting on the claim (ranks asking who holds it; they send nothing).
  bool collision_reported();
  // Every rank has joined: binds "<name>.started" (see above).
  void mark_started();
  // Once the job runs: accepts every connection waiting on either socket and closes it once
  // it said what it had to (probes say nothing; reports, see above), so that the listen
  // queues never fill: a full queue refuses probes (claim_holder would see nobody). Returns
  // whether a report came from a rank whose rendezvous began before mark_started: the job
  // may hold ranks of two jobs. Cheap (two accept4 calls when nothing waits); called at the
  // job's health checks.
  bool drain();
  // Gives the identity up (destroy_process_group); the destructor does too.
  void release();
  // Whether this claim is live and on `name` (the caller holds the registry's mutex).
  bool held_as(const std::string& name) const;

 private:
  IdentityClaim(std::string name, int fd);
  void close_descriptors();
  // pthread_atfork handlers: a forked child gives up every claim (identity_claim.cpp).
  static void before_fork();
  static void after_fork_in_parent();
  static void after_fork_in_child();
  std::string name_;
  int listen_fd_ = -1;
  int started_fd_ = -1;
  std::int64_t started_ns_ = 0;  // contest_clock_ns at mark_started; 0 while forming
  std::vector<int> pending_;  // accepted connections that said nothing yet
};

// Who holds the claim on `name`: pid 0 if nobody (or if its backlog is full: until the holder
// drains it, at once while the job forms, at its next health check once it runs);
// `started` once the holder's job has every rank. Throws SetupError if a process of another
// user holds it (abstract sockets have no permissions: someone squats the name).
struct ClaimHolder {
  int pid = 0;
  bool started = false;
};
ClaimHolder claim_holder(const std::string& name, const std::string& job_id);

// A rank that found the job of `name` already running tells its holder when its own
// rendezvous began (see above). Best effort: nobody to tell if the holder just ended.
void report_late_arrival(const std::string& name, const std::string& job_id,
                         std::int64_t began_ns);

}  // namespace shmdist::detail
