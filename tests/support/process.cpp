#include "support/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <stdexcept>

namespace shmdist::test {

using Clock = std::chrono::steady_clock;

CommandResult run_command(const std::vector<std::string>& argv, const CommandOptions& options) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe2 failed");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    if (options.stdout_path.empty()) {
      dup2(out[1], STDOUT_FILENO);
    } else {
      const int fd = open(options.stdout_path.c_str(), O_WRONLY);
      if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0) _exit(127);
    }
    dup2(err[1], STDERR_FILENO);
    for (const auto& name : options.unset_env) unsetenv(name.c_str());
    for (const auto& [k, v] : options.env) setenv(k.c_str(), v.c_str(), 1);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  if (options.on_start) options.on_start(pid);
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  CommandResult result;
  bool exited = false;
  int status = 0;
  pollfd fds[3] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}, {pidfd, POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  const auto deadline = start + options.timeout;
  while (fds[0].fd >= 0 || fds[1].fd >= 0 || !exited) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 && !result.timed_out) {
      result.timed_out = true;
      kill(pid, SIGKILL);  // by pid; its own children die with it (PDEATHSIG) or were reaped
    }
    const int wait_ms = result.timed_out ? 100 : static_cast<int>(std::min<long long>(left.count(), 100));
    if (poll(fds, 3, wait_ms) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[65536];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<std::size_t>(n));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
      }
    }
    if (!exited && waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      fds[2].fd = -1;
    }
    // A grandchild that keeps our pipes open must not hang the test once time is up.
    if (exited && result.timed_out) break;
  }
  for (int i = 0; i < 2; ++i)
    if (fds[i].fd >= 0) close(fds[i].fd);
  if (pidfd >= 0) close(pidfd);
  if (!exited) waitpid(pid, &status, 0);
  result.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  if (WIFSIGNALED(status)) {
    result.signal = WTERMSIG(status);
    result.exit_code = 128 + result.signal;
  } else {
    result.exit_code = WEXITSTATUS(status);
  }
  return result;
}

std::string shmrun_path() { return SHMDIST_TEST_SHMRUN; }
std::string examples_dir() { return SHMDIST_TEST_EXAMPLES_DIR; }
std::string test_programs_dir() { return SHMDIST_TEST_PROGRAMS_DIR; }

}  // namespace shmdist::test
