#include "base/process_alive.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace shmdist::detail {
namespace {
// waitid's P_PIDFD (Linux 5.4), which glibc 2.36 headers do not name.
constexpr idtype_t kPidfd = static_cast<idtype_t>(3);
}  // namespace

// Through syscall(): glibc 2.36's <sys/pidfd.h> lacks C linkage for C++.
int open_pidfd(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

int pidfd_signal(int pidfd, int sig) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

bool pidfd_ended(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  for (;;) {
    const int n = ::poll(&p, 1, 0);
    if (n >= 0) return n > 0 && (p.revents & (POLLIN | POLLHUP));
    if (errno != EINTR) return false;
  }
}

int wait_pidfd(int pidfd, siginfo_t& info, int flags) {
  for (;;) {
    info = siginfo_t{};
    if (waitid(kPidfd, static_cast<id_t>(pidfd), &info, WEXITED | flags) == 0)
      return info.si_pid != 0 ? 1 : 0;
    if (errno == EINTR) continue;
    return -1;
  }
}

bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  const int fd = open_pidfd(pid);
  if (fd < 0) return errno == ESRCH ? false : process_alive_by_proc(pid);
  const bool ended = pidfd_ended(fd);
  close(fd);
  return !ended;
}

bool process_alive_by_proc(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  // kill() succeeds on a zombie: read the state letter from /proc/<pid>/stat ("pid (comm) S").
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (!f) return errno != ENOENT;
  char buf[512];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');
  if (!close_paren || close_paren[1] != ' ') return true;
  const char state = close_paren[2];
  return state != 'Z' && state != 'X' && state != 'x';
}

}  // namespace shmdist::detail
