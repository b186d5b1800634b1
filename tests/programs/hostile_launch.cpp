// shmdist::launch() in hostile hosts, each in its own process (signal dispositions and limits
// are process-wide). Prints one result line; tests/hostile judges it.
//
//   hostile_launch sigchld_ignored   SIGCHLD ignored (the kernel reaps the ranks): a clean job and
//                                    one whose rank 1 throws; OUTCOMES clean=.. failed=..
//   hostile_launch reaper_thread     another thread reaps with waitpid(-1) meanwhile; OUTCOMES
//   hostile_launch fd_limit          descriptors run out after 3 ranks started: SetupError, and
//                                    then CLEANUP children=0|1 fds_before=N fds_after=M
//   hostile_launch pgroup            a rank starts `sleep 77` and returns: CHILD pid=P state=..
//   hostile_launch hang MODE         a 2-rank deadlock in MODE (threads|processes) with a short
//                                    hang_report and a 5 s job_timeout: DONE errors=..
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>

#include "report.hpp"

namespace dist = shmdist;
using namespace shmdist::programs;

namespace {

int count_fds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (const dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // the directory's own descriptor
}

std::string outcomes_line() {
  auto clean = dist::launch(2, [](dist::ProcessGroup& pg) { pg.barrier(); });
  auto failed = dist::launch(2, [](dist::ProcessGroup& pg) {
    pg.barrier();
    if (pg.get_rank() == 1) throw std::runtime_error("rank 1 fails on purpose");
    dist::Tensor t = dist::zeros(1, dist::kInt);
    pg.recv(t, 1);
  });
  return "OUTCOMES clean=" + std::to_string(clean[0].ok()) + std::to_string(clean[1].ok()) +
         " failed=" + std::to_string(failed[0].ok()) + std::to_string(failed[1].ok()) +
         " rank1_code=" + std::to_string(failed[1].exit_code) +
         " rank0_error=" + one_line(failed[0].error);
}

int sigchld_ignored() {
  signal(SIGCHLD, SIG_IGN);
  emit(outcomes_line());
  return 0;
}

int reaper_thread() {
  std::atomic<bool> stop{false};
  std::atomic<bool> reaping{false};
  std::thread reaper([&] {
    reaping = true;
    while (!stop.load()) {
      int status = 0;
      if (waitpid(-1, &status, WNOHANG) <= 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  // launch() starts only once the reaper runs its loop: the reaper is then certainly reaping
  // throughout both jobs, and its thread start-up (which allocates: glibc's
  // pthread_getattr_np, called by a sanitizer's thread start) is over before launch() forks.
  // Under ASan that matters: GCC 12's libasan does not lock its allocator around fork, so a
  // child forked while the starting thread held an allocator lock blocked forever in its
  // first allocation (the test hung about 1 run in 20 under load). glibc's own malloc takes
  // its locks around fork and is usable in the child (docs/embedding.md, "Forked ranks").
  while (!reaping.load()) std::this_thread::yield();
  const std::string line = outcomes_line();
  stop = true;
  reaper.join();
  emit(line);
  return 0;
}

int fd_limit() {
  const int before = count_fds();
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  const rlimit low{static_cast<rlim_t>(before + 7), lim.rlim_max};
  setrlimit(RLIMIT_NOFILE, &low);
  std::string error = "none";
  try {
    dist::launch(8, [](dist::ProcessGroup& pg) { pg.barrier(); });
  } catch (const std::exception& e) {
    error = std::string(error_type(e)) + ": " + e.what();
  }
  setrlimit(RLIMIT_NOFILE, &lim);
  int status = 0;
  const pid_t left = waitpid(-1, &status, WNOHANG);  // -1/ECHILD: no child at all
  emit("CLEANUP children=" + std::to_string(left == 0 ? 1 : 0) + " fds_before=" +
       std::to_string(before) + " fds_after=" + std::to_string(count_fds()) +
       " what=" + one_line(error));
  return 0;  // ranks left behind, if any, die with us (PR_SET_PDEATHSIG)
}

int pgroup() {
  int p[2];
  if (pipe(p) != 0) return kExitOtherError;
  auto out = dist::launch(1, [&](dist::ProcessGroup&) {
    const pid_t child = fork();
    if (child == 0) {
      execlp("sleep", "sleep", "77", static_cast<char*>(nullptr));
      _exit(127);
    }
    write_all(p[1], std::to_string(child) + "\n");
  });
  close(p[1]);
  char buf[32] = {};
  const ssize_t n = read(p[0], buf, sizeof buf - 1);
  close(p[0]);
  const int pid = n > 0 ? std::atoi(buf) : -1;
  // Its parent (the rank) is gone; whoever reaps orphans may take a moment: gone or zombie.
  std::string state = "gone";
  for (int i = 0; i < 500; ++i) {
    FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
    if (!f) { state = "gone"; break; }
    char line[512] = {};
    const bool got = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    const std::string text = got ? line : "";
    const auto close_paren = text.rfind(')');
    state = close_paren != std::string::npos && close_paren + 2 < text.size()
                ? std::string(1, text[close_paren + 2]) : "?";
    if (state == "Z" || state == "X") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  emit("CHILD pid=" + std::to_string(pid) + " state=" + state + " ok=" + std::to_string(out[0].ok()));
  return 0;
}

int hang(const std::string& mode) {
  dist::LaunchOptions o;
  o.mode = mode == "threads" ? dist::LaunchOptions::Mode::Threads
                             : dist::LaunchOptions::Mode::Processes;
  o.hang_report = std::chrono::milliseconds(200);
  o.job_timeout = std::chrono::seconds(5);
  auto out = dist::launch(2, [](dist::ProcessGroup& pg) {
    dist::Tensor t = dist::zeros(1, dist::kInt);
    pg.recv(t, 1 - pg.get_rank());
  }, o);
  emit("DONE errors=" + std::to_string(!out[0].ok()) + std::to_string(!out[1].ok()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run_main([&] {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "sigchld_ignored") return sigchld_ignored();
    if (mode == "reaper_thread") return reaper_thread();
    if (mode == "fd_limit") return fd_limit();
    if (mode == "pgroup") return pgroup();
    if (mode == "hang" && argc == 3) return hang(argv[2]);
    emit_err("usage: hostile_launch sigchld_ignored | reaper_thread | fd_limit | pgroup");
    return 2;
  });
}
