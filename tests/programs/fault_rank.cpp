// A rank that fails, hangs or times out on purpose. Runs under shmrun or with torchrun-style
// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
//
//   fault_rank die VICTIM HOW      HOW = exit:CODE or signal:NUMBER. After a barrier, every
//                                  other rank blocks in recv (the lowest from VICTIM, the rest
//                                  from any source); VICTIM waits until the segment's
//                                  blocked-on records show every other rank blocked in
//                                  recv, says DYING and ends as told. The others must get PeerFailure: they print
//                                  it, destroy the group and exit 42.
//   fault_rank chain HOW           3 ranks: rank 1 dies as told (as in die) while rank 2
//                                  receives from it and rank 0 from rank 2; rank 2 leaves on
//                                  its PeerFailure at once (exit 42), rank 0 reports its own.
//   fault_rank after_cause HOW     3 ranks: rank 1 exits 0 while rank 2 receives from it;
//                                  rank 2 catches the PeerFailure (CARRIED_ON), then ends as
//                                  told (as in die); rank 0, receiving from rank 2, reports.
//   fault_rank hang                rank r receives from rank r+1 (mod n): a wait-for cycle.
//                                  PeerFailure (the launcher's abort) -> exit 42.
//   fault_rank timeout MS          rank 0 receives from rank 1, which sends nothing, with a
//                                  process-group timeout of MS: Timeout is expected (TIMEOUT
//                                  line); then it tells rank 1 to finish and exits 0.
//   fault_rank join                joins, barrier, destroys: for environment tests.
//   fault_rank sum VALUE           joins, then 20 all_reduce of [VALUE], printing
//                                  "SUM rank=R values=S1,S2,..." (the distinct sums seen).
//                                  With FAULT_RANK_START=FILE it waits for FILE to exist
//                                  before it joins, with FAULT_RANK_HOLD=FILE after;
//                                  FAULT_RANK_TIMEOUT_MS=MS sets the group's timeout.
//   fault_rank fork_rejoin         rank 0 of 2: joins, forks a child that lives on (as a
//                                  DataLoader worker does), destroys its group ("DESTROYED"),
//                                  then joins a second job with the same identity (its rank 1
//                                  started anew), barrier, destroys; then ends the child and
//                                  reaps it (also when a join fails).
//   fault_rank store_join DIR      the same, joining as the torch backend does (rank 0 creates
//                                  and announces through a key-value store): here a store of
//                                  files in DIR, one per key (the key's '/' become '_').
//
// Every rank first prints "READY rank=R pid=P world=W" once it has joined.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <string>
#include <vector>
#include <thread>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "job/diagnosis.hpp"
#include "pg/default_group.hpp"
#include "pg/impl.hpp"
#include <shmdist/embedding.hpp>
#include "report.hpp"

namespace dist = shmdist;
using namespace shmdist::programs;

namespace {

void say_ready() {
  emit("READY rank=" + std::to_string(dist::get_rank()) + " pid=" + std::to_string(getpid()) +
       " world=" + std::to_string(dist::get_world_size()));
}

int caught(const dist::PeerFailure& e, bool destroy) {
  const std::string rank = std::to_string(dist::get_rank());
  emit("PEER_FAILURE rank=" + rank + " t=" + std::to_string(steady_ns()) +
       " what=" + one_line(e.what()));
  if (destroy) {
    dist::destroy_process_group();  // must return promptly after a failure
    emit("DESTROYED rank=" + rank + " t=" + std::to_string(steady_ns()));
  }
  return kExitCaughtPeerFailure;
}

// Polls the blocked-on records of this rank's job until every other rank is blocked in recv
// (they publish the record once they stop spinning and go to sleep). False after 30 s.
bool others_blocked_in_recv() {
  auto& impl = shmdist::detail::ProcessGroupAccess::impl(shmdist::detail::default_process_group());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    bool all = true;
    for (const auto& r : shmdist::job::snapshot_ranks(*impl.segment))
      if (r.rank != impl.segment_rank && r.op != shmdist::segment::kBlockedRecv) all = false;
    if (all) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Ends this process as told: "exit:N" (_Exit, no destructors) or "signal:N" (raised with the
// default action and no core file). Returns only for an unknown HOW.
int end_as(const std::string& how) {
  if (how.rfind("exit:", 0) == 0) std::_Exit(std::stoi(how.substr(5)));
  if (how.rfind("signal:", 0) == 0) {
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    std::signal(std::stoi(how.substr(7)), SIG_DFL);
    std::raise(std::stoi(how.substr(7)));
  }
  emit("ERROR type=usage what=unknown HOW '" + how + "'");
  return kExitOtherError;
}

int die(int victim, const std::string& how, bool after_barrier = false) {
  if (!after_barrier) {
    dist::init_process_group("shm");
    say_ready();
    dist::barrier();
  }
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  if (rank == victim) {
    if (!others_blocked_in_recv()) {
      emit("ERROR type=setup what=the other ranks did not block in recv within 30 s");
      return kExitOtherError;
    }
    emit("DYING rank=" + std::to_string(rank) + " pid=" + std::to_string(getpid()) +
         " t=" + std::to_string(steady_ns()));
    return end_as(how);
  }
  const int first_survivor = victim == 0 ? 1 : 0;
  const int src = rank == first_survivor || world == 2 ? victim : dist::ANY_SOURCE;
  dist::Tensor t = dist::zeros(16, dist::kFloat);
  try {
    dist::recv(t, src);
  } catch (const dist::PeerFailure& e) {
    return caught(e, true);
  }
  emit("UNEXPECTED rank=" + std::to_string(rank) + " what=recv returned");
  return kExitUnexpected;
}

// 3 ranks: rank 1 dies as told once the others are blocked; rank 2, receiving from it, gets
// PeerFailure and leaves at once (exit 42, no destroy); rank 0 receives from rank 2 and must
// be told about rank 1, the root cause, not about rank 2.
int chain(const std::string& how) {
  dist::init_process_group("shm");
  say_ready();
  dist::barrier();
  const int rank = dist::get_rank();
  if (rank == 1) return die(1, how, /*after_barrier=*/true);
  dist::Tensor t = dist::zeros(16, dist::kFloat);
  try {
    dist::recv(t, rank == 2 ? 1 : 2);
  } catch (const dist::PeerFailure& e) {
    return caught(e, /*destroy=*/rank == 0);
  }
  emit("UNEXPECTED rank=" + std::to_string(rank) + " what=recv returned");
  return kExitUnexpected;
}

// 3 ranks: rank 1 exits 0 once the others are blocked in recv; rank 2, receiving from it,
// catches the PeerFailure, says CARRIED_ON and later ends as told (HOW as in die), for a
// reason of its own; rank 0 receives from rank 2 and must be told how rank 2 ended.
int after_cause(const std::string& how) {
  dist::init_process_group("shm");
  say_ready();
  dist::barrier();
  const int rank = dist::get_rank();
  if (rank == 1) return die(1, "exit:0", /*after_barrier=*/true);
  dist::Tensor t = dist::zeros(16, dist::kFloat);
  try {
    dist::recv(t, rank == 2 ? 1 : 2);
  } catch (const dist::PeerFailure& e) {
    if (rank == 0) return caught(e, /*destroy=*/true);
    emit("CARRIED_ON rank=2 what=" + one_line(e.what()));
    return end_as(how);
  }
  emit("UNEXPECTED rank=" + std::to_string(rank) + " what=recv returned");
  return kExitUnexpected;
}

int hang() {
  dist::init_process_group("shm");
  say_ready();
  dist::barrier();
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();
  dist::Tensor t = dist::zeros(256, dist::kFloat);
  try {
    dist::recv(t, (rank + 1) % world, {}, /*tag=*/5);
  } catch (const dist::PeerFailure& e) {
    return caught(e, false);
  }
  emit("UNEXPECTED rank=" + std::to_string(rank) + " what=recv returned");
  return kExitUnexpected;
}

int timeout(int ms) {
  const int rank = env_int("RANK", -1);
  dist::InitOptions options;
  options.timeout = rank == 0 ? std::chrono::milliseconds(ms) : std::chrono::milliseconds(60'000);
  dist::init_process_group("shm", options);
  say_ready();
  dist::Tensor done = dist::zeros(1, dist::kInt);
  if (dist::get_rank() == 0) {
    dist::Tensor t = dist::zeros(8, dist::kFloat);
    const auto start = std::chrono::steady_clock::now();
    try {
      dist::recv(t, 1, {}, /*tag=*/7);
      emit("UNEXPECTED rank=0 what=recv returned");
      return kExitUnexpected;
    } catch (const dist::Timeout& e) {
      const auto waited = std::chrono::steady_clock::now() - start;
      emit("TIMEOUT rank=0 elapsed_ms=" +
           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) +
           " what=" + one_line(e.what()));
    }
    // The group stays usable after a timeout.
    dist::send(done, 1, {}, /*tag=*/9);
  } else if (dist::get_rank() == 1) {
    dist::recv(done, 0, {}, /*tag=*/9);
  }
  dist::destroy_process_group();
  emit("DONE rank=" + std::to_string(rank));
  return 0;
}

int join() {
  dist::init_process_group("shm");
  say_ready();
  dist::barrier();
  dist::destroy_process_group();
  emit("DONE rank=" + std::to_string(env_int("RANK", -1)));
  return 0;
}

// Waits (up to 60 s) until the file named by the environment variable `var` exists, if set.
void await_file_named_by(const char* var) {
  const char* path = std::getenv(var);
  if (!path) return;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(path) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

int sum(std::int64_t value) {
  await_file_named_by("FAULT_RANK_START");  // so that several ranks start at once
  dist::InitOptions options;
  if (const int ms = env_int("FAULT_RANK_TIMEOUT_MS", 0); ms > 0)
    options.timeout = std::chrono::milliseconds(ms);
  dist::init_process_group("shm", options);
  say_ready();
  await_file_named_by("FAULT_RANK_HOLD");  // the job runs while the test starts another
  std::vector<std::int64_t> seen;
  for (int i = 0; i < 20; ++i) {
    dist::Tensor t = dist::full({1}, static_cast<double>(value), dist::kInt64);
    dist::all_reduce(t);
    const std::int64_t s = t.data<std::int64_t>()[0];
    if (std::find(seen.begin(), seen.end(), s) == seen.end()) seen.push_back(s);
  }
  std::string values;
  for (std::int64_t s : seen) {
    if (!values.empty()) values += ',';
    values += std::to_string(s);
  }
  const std::string rank = std::to_string(dist::get_rank());
  emit("SUM rank=" + rank + " values=" + values);
  dist::destroy_process_group();
  emit("DONE rank=" + rank);
  return 0;
}

int fork_rejoin() {
  dist::init_process_group("shm");
  say_ready();
  int wake[2];
  int running[2];
  if (::pipe(wake) != 0 || ::pipe(running) != 0)
    throw std::runtime_error("fault_rank fork_rejoin: pipe failed");
  const pid_t child = ::fork();
  if (child < 0) throw std::runtime_error("fault_rank fork_rejoin: fork failed");
  if (child == 0) {  // only async-signal-safe calls: lives until the parent closes its end
    ::close(wake[1]);
    ::close(running[0]);
    // fork() returned here, so the fork handlers ran: say so (a worker that has not run yet
    // holds the claim's descriptors until it does; see docs/other-launchers.md).
    [[maybe_unused]] const ssize_t w = ::write(running[1], "r", 1);
    char byte = 0;
    [[maybe_unused]] const ssize_t n = ::read(wake[0], &byte, 1);
    ::_exit(0);
  }
  ::close(wake[0]);
  ::close(running[1]);
  {
    char byte = 0;
    [[maybe_unused]] const ssize_t n = ::read(running[0], &byte, 1);
    ::close(running[0]);
  }
  struct Reap {
    int fd;
    pid_t pid;
    ~Reap() {
      ::close(fd);
      int status = 0;
      ::waitpid(pid, &status, 0);
    }
  } reap{wake[1], child};
  dist::barrier();
  dist::destroy_process_group();
  emit("DESTROYED");
  dist::init_process_group("shm");
  dist::barrier();
  dist::destroy_process_group();
  emit("DONE rank=0");
  return 0;
}

// A key-value store of files: set writes a temporary file and renames it (readers never see
// half a value); get polls for the file, up to 60 s.
shmdist::embedding::KeyValueStore file_store(const std::string& dir) {
  auto path = [dir](std::string key) {
    for (char& c : key)
      if (c == '/') c = '_';
    return dir + "/" + key;
  };
  shmdist::embedding::KeyValueStore store;
  store.set = [path](const std::string& key, const std::string& value) {
    const std::string tmp = path(key) + ".tmp." + std::to_string(getpid());
    std::ofstream(tmp) << value;
    std::filesystem::rename(tmp, path(key));
  };
  store.get = [path](const std::string& key) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      std::ifstream in(path(key));
      if (in) {
        std::ostringstream text;
        text << in.rdbuf();
        return text.str();
      }
      if (std::chrono::steady_clock::now() >= deadline)
        throw dist::Timeout("the file store has no key '" + key + "' after 60 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  return store;
}

int store_join(const std::string& dir) {
  const int rank = env_int("RANK", -1);
  dist::ProcessGroup pg = shmdist::embedding::join_through_store(
      rank, env_int("WORLD_SIZE", -1), std::chrono::seconds(60), file_store(dir));
  emit("READY rank=" + std::to_string(rank) + " pid=" + std::to_string(getpid()));
  pg.barrier();
  pg.destroy();
  emit("DONE rank=" + std::to_string(rank));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main([&] {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "die" && argc == 4) return die(std::atoi(argv[2]), argv[3]);
    if (mode == "hang") return hang();
    if (mode == "chain" && argc == 3) return chain(argv[2]);
    if (mode == "after_cause" && argc == 3) return after_cause(argv[2]);
    if (mode == "timeout" && argc == 3) return timeout(std::atoi(argv[2]));
    if (mode == "join") return join();
    if (mode == "sum" && argc == 3) return sum(std::atoll(argv[2]));
    if (mode == "fork_rejoin") return fork_rejoin();
    if (mode == "store_join" && argc == 3) return store_join(argv[2]);
    emit_err("usage: fault_rank die VICTIM exit:CODE|signal:N | hang | timeout MS | join | "
             "store_join DIR");
    return 2;
  });
}
