#include "job/spawn.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <shmdist/errors.hpp>

namespace shmdist::job {
namespace {

// Runs in the child between fork and exec/body. Only async-signal-safe work would be strictly
// correct in a multi-threaded parent; launchers fork from their main thread before starting
// others, and launch() documents that its rank function must not take locks the host's other
// threads use (docs/embedding.md: glibc's malloc is usable in the child, ASan's in GCC 12 is
// not when another thread was inside it at the fork).
void prepare_child(const SpawnSpec& spec, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(128 + SIGKILL);  // the launcher died before prctl took effect
  if (spec.new_process_group) setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);  // launchers block signals they read via signalfd
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGPIPE, SIGCHLD}) signal(sig, SIG_DFL);
  if (spec.stdout_fd >= 0) dup2(spec.stdout_fd, STDOUT_FILENO);
  if (spec.stderr_fd >= 0) dup2(spec.stderr_fd, STDERR_FILENO);
  for (int fd : spec.close_fds)
    if (fd != spec.inherit_fd && fd > STDERR_FILENO) close(fd);
  if (spec.inherit_fd >= 0) fcntl(spec.inherit_fd, F_SETFD, 0);
  if (spec.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(spec.cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  for (const auto& [k, v] : spec.env) setenv(k.c_str(), v.c_str(), 1);
}

pid_t checked_fork() {
  // Unflushed stdio output would otherwise be copied into the child and written twice.
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw SetupError(std::string("fork failed: ") + std::strerror(errno));
  return pid;
}

std::string exec_failure_text(const std::string& program, int error) {
  std::string text = "cannot run '" + program + "': " + std::strerror(error);
  if (error == ENOENT && program.find('/') == std::string::npos)
    text += " (not found in PATH; give a path such as ./" + program + ")";
  else if (error == EACCES)
    text += " (is it a directory, or a file without execute permission?)";
  else if (error == ENOEXEC)
    text += " (not a binary or script this system can run)";
  return text;
}

}  // namespace

ExecFailed::ExecFailed(const std::string& program, int error)
    : SetupError(exec_failure_text(program, error)), error_(error) {}

int ExecFailed::exit_code() const { return error_ == ENOENT || error_ == ENOTDIR ? 127 : 126; }

pid_t spawn_program(const SpawnSpec& spec, const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The child writes errno here if exec fails; a successful exec closes it (close-on-exec),
  // so the parent reads either 0 bytes (running) or the error.
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0)
    throw SetupError(std::string("cannot create a pipe: ") + std::strerror(errno));
  const pid_t parent = getpid();
  pid_t pid = -1;
  try {
    pid = checked_fork();
  } catch (...) {
    close(report[0]);
    close(report[1]);
    throw;
  }
  if (pid == 0) {
    close(report[0]);
    prepare_child(spec, parent);
    execvp(args[0], args.data());
    const int error = errno;
    [[maybe_unused]] const ssize_t n = write(report[1], &error, sizeof error);
    _exit(127);
  }
  close(report[1]);
  int error = 0;
  ssize_t got;
  do {
    got = read(report[0], &error, sizeof error);
  } while (got < 0 && errno == EINTR);
  close(report[0]);
  if (got == static_cast<ssize_t>(sizeof error)) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    throw ExecFailed(argv.empty() ? std::string() : argv[0], error);
  }
  return pid;
}

pid_t spawn_function(const SpawnSpec& spec, const std::function<int()>& body) {
  const pid_t parent = getpid();
  const pid_t pid = checked_fork();
  // Both sides set the group, so it exists whichever runs first (as shells do).
  if (pid > 0 && spec.new_process_group) setpgid(pid, pid);
  if (pid == 0) {
    prepare_child(spec, parent);
    int code = 1;
    try {
      code = body();
    } catch (...) {
    }
    std::fflush(nullptr);
    _exit(code);
  }
  return pid;
}

}  // namespace shmdist::job
