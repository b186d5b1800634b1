#include "launcher/live_command.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace shmdist::test {

using Clock = std::chrono::steady_clock;

namespace {

// The child's environment, built before fork (the child only calls async-signal-safe code).
std::vector<std::string> child_environment(const CommandOptions& options) {
  std::set<std::string> drop(options.unset_env.begin(), options.unset_env.end());
  for (const auto& [k, v] : options.env) drop.insert(k);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    if (!drop.count(entry.substr(0, entry.find('=')))) env.push_back(entry);
  }
  for (const auto& [k, v] : options.env) env.push_back(k + "=" + v);
  return env;
}

}  // namespace

LiveCommand::LiveCommand(const std::vector<std::string>& argv, const CommandOptions& options) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    throw std::runtime_error("pipe2 failed");
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::vector<std::string> env_strings = child_environment(options);
  std::vector<char*> envp;
  for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t parent = getpid();
  started_ = Clock::now();
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // If the test dies (a ctest timeout), the command dies with it, and shmrun takes its
    // ranks along: nothing started by a test outlives it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execvpe(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  if (options.on_start) options.on_start(pid_);
}

LiveCommand::~LiveCommand() {
  if (!exited_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  for (int fd : {out_fd_, err_fd_, pidfd_})
    if (fd >= 0) close(fd);
}

void LiveCommand::pump(int wait_ms) {
  pollfd fds[3] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}, {exited_ ? -1 : pidfd_, POLLIN, 0}};
  if (poll(fds, 3, wait_ms) < 0 && errno != EINTR) return;
  int* fd_of[2] = {&out_fd_, &err_fd_};
  std::string* sink[2] = {&result_.out, &result_.err};
  for (int i = 0; i < 2; ++i) {
    if (*fd_of[i] < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    char buf[65536];
    const ssize_t n = read(*fd_of[i], buf, sizeof buf);
    if (n > 0) {
      sink[i]->append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      close(*fd_of[i]);
      *fd_of[i] = -1;
    }
  }
  int status = 0;
  if (!exited_ && waitpid(pid_, &status, WNOHANG) == pid_) {
    exited_ = true;
    exited_at_ = Clock::now();
    if (WIFSIGNALED(status)) {
      result_.signal = WTERMSIG(status);
      result_.exit_code = 128 + result_.signal;
    } else {
      result_.exit_code = WEXITSTATUS(status);
    }
  }
}

bool LiveCommand::wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!pred()) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    if (exited_ && out_fd_ < 0 && err_fd_ < 0) return pred();  // nothing more can come
    pump(static_cast<int>(std::min<long long>(left, 50)));
  }
  return true;
}

CommandResult LiveCommand::finish(std::chrono::milliseconds timeout) {
  const bool done = wait_until([&] { return exited_ && out_fd_ < 0 && err_fd_ < 0; }, timeout);
  if (!done) {
    if (!exited_) {
      result_.timed_out = true;
      kill(pid_, SIGKILL);
    }
    // A grandchild may hold the pipes open: give them a moment, then stop reading.
    wait_until([&] { return exited_ && out_fd_ < 0 && err_fd_ < 0; },
               std::chrono::milliseconds(2000));
    if (!exited_) {
      int status = 0;
      waitpid(pid_, &status, 0);
      exited_ = true;
      exited_at_ = Clock::now();
      result_.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      result_.exit_code = WIFSIGNALED(status) ? 128 + result_.signal : WEXITSTATUS(status);
    }
  }
  result_.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(exited_at_ - started_);
  return result_;
}

void LiveCommand::signal(int sig) {
  if (!exited_ && pid_ > 0) kill(pid_, sig);
}

std::vector<std::string> lines_starting(const std::string& text, const std::string& key) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    if (line.rfind(key + " ", 0) == 0 || line == key) lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

std::map<std::string, std::string> fields_of(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::size_t pos = line.find(' ');
  while (pos != std::string::npos && pos < line.size()) {
    const std::size_t begin = pos + 1;
    const std::size_t eq = line.find('=', begin);
    if (eq == std::string::npos) break;
    const std::string name = line.substr(begin, eq - begin);
    if (name == "what") {
      fields[name] = line.substr(eq + 1);
      break;
    }
    pos = line.find(' ', eq);
    fields[name] = line.substr(eq + 1, pos == std::string::npos ? std::string::npos : pos - eq - 1);
  }
  return fields;
}

std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

bool process_running(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (!f) return false;
  char buf[512];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');
  if (!paren || paren[1] != ' ') return true;
  return paren[2] != 'Z' && paren[2] != 'X';
}

void become_subreaper() { prctl(PR_SET_CHILD_SUBREAPER, 1); }

std::optional<int> reap_within(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) return status;
    if (got < 0 && errno == ECHILD) return std::nullopt;  // not (or no longer) our child
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace shmdist::test
