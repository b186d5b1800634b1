// Ranks that misbehave the way real programs do, for tests/hostile. Runs under shmrun.
//
//   hostile_rank leave CODE          rank 1 returns CODE from main right after init, without
//                                    destroy_process_group; rank 0 blocks in recv from rank 1
//                                    (PeerFailure expected: PEER_FAILURE line, exit 42).
//   hostile_rank leave_idle CODE     rank 1 as above; rank 0 waits in pause() (not in a shmdist
//                                    call), so only the launcher can end it.
//   hostile_rank leave_clean         rank 1 sends its pid to rank 0 and returns 0 without
//                                    destroy; rank 0 receives it, then waits (bounded) for rank 1's
//                                    process to end: PEER_EXITED, or PEER_STILL_THERE.
//   hostile_rank leave_offer         rank 1 sends 4 MiB (a single-copy offer: more than the ring)
//                                    with isend and returns 0 without destroy; rank 0 waits
//                                    0.3 s outside the library, then receives it: OFFER_OK, or
//                                    OFFER_BAD what=... .
//   hostile_rank spawn SETSID        every rank forks `sleep 77` (in a new session if SETSID is 1),
//                                    says CHILD pid=P, joins, barrier, destroys, exits 0.
//   hostile_rank stream MIB S        rank 0 sends tensors of MIB MiB to rank 1 for S seconds (a
//                                    stream that fills the ring, so both ranks block in turn).
//   hostile_rank wait_for_1          rank 0 receives from rank 1, which joins and then sleeps
//                                    (not blocked): the tests stop it with SIGSTOP.
//   hostile_rank noinit              rank 1 never calls init_process_group (it sleeps); rank 0
//                                    receives from it.
//   hostile_rank reinit              3 rounds of init, all_reduce, destroy (2 ranks): ROUND n
//                                    rank=R sum=S, or REINIT_ERROR round=n type=... what=...
//   hostile_rank chatter KIB         writes KIB KiB without a newline, then exits 0.
//
// Every rank that joins prints "READY rank=R pid=P".
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <string>
#include <thread>

#include "report.hpp"

namespace dist = shmdist;
using namespace shmdist::programs;

namespace {

void ready() {
  emit("READY rank=" + std::to_string(dist::get_rank()) + " pid=" + std::to_string(getpid()));
}

int recv_expecting_failure(int src) {
  dist::Tensor t = dist::zeros(4, dist::kFloat);
  try {
    dist::recv(t, src);
  } catch (const dist::PeerFailure& e) {
    emit("PEER_FAILURE rank=" + std::to_string(dist::get_rank()) + " what=" + one_line(e.what()));
    return kExitCaughtPeerFailure;
  }
  emit("UNEXPECTED what=recv returned");
  return kExitUnexpected;
}

int leave(int code, bool idle) {
  dist::init_process_group("shm");
  ready();
  dist::barrier();
  if (dist::get_rank() == 1) return code;  // no destroy_process_group
  if (idle) {
    for (;;) pause();  // ended by the launcher only
  }
  return recv_expecting_failure(1);
}

int leave_offer() {
  setenv("SHMDIST_SINGLE_COPY", "4K", 1);  // between processes it is off unless asked for
  dist::init_process_group("shm");
  ready();
  constexpr std::int64_t kBytes = 4 << 20;
  dist::Tensor t = dist::empty({kBytes}, dist::kUInt8);
  if (dist::get_rank() == 1) {
    for (std::int64_t i = 0; i < kBytes; ++i) t.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(i % 251);
    dist::Work w = dist::isend(t, 0);
    return 0;  // no destroy_process_group, no wait: the end of the rank flushes the send
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  try {
    dist::recv(t, 1);
  } catch (const std::exception& e) {
    emit("OFFER_BAD what=" + one_line(e.what()));
    return kExitUnexpected;
  }
  for (std::int64_t i = 0; i < kBytes; ++i)
    if (t.data<std::uint8_t>()[i] != static_cast<std::uint8_t>(i % 251)) {
      emit("OFFER_BAD what=byte " + std::to_string(i) + " differs");
      return kExitUnexpected;
    }
  emit("OFFER_OK");
  dist::destroy_process_group();
  return 0;
}

int leave_clean() {
  dist::init_process_group("shm");
  ready();
  dist::Tensor pid = dist::zeros(1, dist::kInt);
  if (dist::get_rank() == 1) {
    pid.data<int>()[0] = getpid();
    dist::send(pid, 0);
    return 0;  // no destroy_process_group
  }
  dist::recv(pid, 1);
  const pid_t peer = pid.data<int>()[0];
  // A bound, not a threshold: rank 1 either ends promptly or waits for us forever.
  for (int i = 0; i < 2000; ++i) {
    std::string state;
    {
      const std::string path = "/proc/" + std::to_string(peer) + "/stat";
      FILE* f = std::fopen(path.c_str(), "r");
      if (f) {
        char buf[512] = {};
        if (std::fgets(buf, sizeof buf, f)) state = buf;
        std::fclose(f);
      }
    }
    const auto close = state.rfind(')');
    if (state.empty() || (close != std::string::npos && close + 2 < state.size() &&
                          (state[close + 2] == 'Z' || state[close + 2] == 'X'))) {
      emit("PEER_EXITED pid=" + std::to_string(peer));
      dist::Tensor more = dist::zeros(1, dist::kInt);
      int code = 0;
      try {
        dist::recv(more, 1);
        emit("UNEXPECTED what=second recv returned");
        code = kExitUnexpected;
      } catch (const dist::PeerFailure& e) {
        emit("PEER_FAILURE rank=0 what=" + one_line(e.what()));
      }
      dist::destroy_process_group();
      return code;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  emit("PEER_STILL_THERE pid=" + std::to_string(peer));
  std::_Exit(kExitUnexpected);
}

int spawn(bool new_session) {
  // A close-on-exec pipe tells when the child has become `sleep`: its write end closes at exec,
  // so the launcher can only ever see the child under its final name.
  int exec_pipe[2];
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) return 3;
  const pid_t child = fork();
  if (child == 0) {
    if (new_session) setsid();
    execlp("sleep", "sleep", "77", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(exec_pipe[1]);
  char byte;
  while (read(exec_pipe[0], &byte, 1) < 0 && errno == EINTR) {
  }
  close(exec_pipe[0]);
  emit("CHILD pid=" + std::to_string(child) + " rank=" + std::to_string(env_int("RANK", -1)));
  dist::init_process_group("shm");
  ready();
  dist::barrier();
  dist::destroy_process_group();
  return 0;
}

int stream(int mib, int seconds) {
  dist::init_process_group("shm");
  ready();
  // The stream lasts `seconds` whatever the machine's speed: rank 0 decides when to stop and
  // says so in the first element of the last tensor (1 = more follow, 0 = the last).
  dist::Tensor t = dist::zeros(static_cast<std::int64_t>(mib) << 18, dist::kFloat);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (int i = 0;; ++i) {
    if (dist::get_rank() == 0) {
      const bool more = std::chrono::steady_clock::now() < until;
      t.data<float>()[0] = more ? 1.0f : 0.0f;
      dist::send(t, 1);
      if (i == 0) emit("STREAMING rank=0");
      if (!more) break;
    } else if (dist::get_rank() == 1) {
      dist::recv(t, 0);
      if (i == 0) emit("STREAMING rank=1");
      if (t.data<float>()[0] == 0.0f) break;
    } else {
      break;
    }
  }
  dist::destroy_process_group();
  emit("DONE rank=" + std::to_string(env_int("RANK", -1)));
  return 0;
}

int wait_for_1() {
  dist::init_process_group("shm");
  ready();
  if (dist::get_rank() == 0) return recv_expecting_failure(1);
  for (;;) pause();
}

int noinit() {
  if (env_int("RANK", -1) == 1) {
    emit("NOINIT rank=1 pid=" + std::to_string(getpid()));
    for (;;) pause();
  }
  dist::init_process_group("shm");
  ready();
  return recv_expecting_failure(1);
}

// Three rounds of init, all_reduce, destroy: each round's sum is printed.
int reinit() {
  for (int round = 1; round <= 3; ++round) {
    try {
      dist::init_process_group("shm");
    } catch (const std::exception& e) {
      emit("REINIT_ERROR round=" + std::to_string(round) + " type=" + error_type(e) +
           " what=" + one_line(e.what()));
      return 0;
    }
    if (round == 1) ready();
    const int rank = dist::get_rank();
    dist::Tensor t = dist::full({3}, (rank + 1) * round, dist::kInt32);
    dist::all_reduce(t);
    dist::Group pair = dist::new_group({0, 1});
    dist::all_reduce(t, dist::ReduceOp::SUM, pair);
    emit("ROUND " + std::to_string(round) + " rank=" + std::to_string(rank) + " sum=" +
         std::to_string(t.data<std::int32_t>()[0]));
    dist::destroy_process_group();
  }
  return 0;
}

int chatter(int kib) {
  const std::string chunk(1024, 'x');
  for (int i = 0; i < kib; ++i) write_all(STDOUT_FILENO, chunk);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main([&] {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "leave" && argc == 3) return leave(std::atoi(argv[2]), false);
    if (mode == "leave_idle" && argc == 3) return leave(std::atoi(argv[2]), true);
    if (mode == "leave_clean") return leave_clean();
    if (mode == "leave_offer") return leave_offer();
    if (mode == "spawn" && argc == 3) return spawn(std::atoi(argv[2]) == 1);
    if (mode == "stream" && argc == 4) return stream(std::atoi(argv[2]), std::atoi(argv[3]));
    if (mode == "wait_for_1") return wait_for_1();
    if (mode == "noinit") return noinit();
    if (mode == "reinit") return reinit();
    if (mode == "chatter" && argc == 3) return chatter(std::atoi(argv[2]));
    emit_err("usage: hostile_rank leave CODE | leave_idle CODE | leave_clean | leave_offer | spawn 0|1 | "
             "stream MIB N | wait_for_1 | noinit | reinit | chatter KIB");
    return 2;
  });
}
