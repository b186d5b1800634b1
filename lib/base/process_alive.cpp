#include "base/process_alive.hpp"

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace shmdist::detail {

bool process_alive(pid_t pid) {
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
