#include "bootstrap/rendezvous_object.hpp"

#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <ctime>

namespace shmdist::detail {

namespace {
std::string contest_name(const std::string& name) { return name + "-contested"; }
}  // namespace

std::int64_t contest_clock_ns() {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

std::int64_t process_start_ns() {
  // Field 22 of /proc/self/stat, after "pid (comm) ": clock ticks since boot.
  FILE* f = std::fopen("/proc/self/stat", "re");
  if (!f) return 0;
  char buf[1024];
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  unsigned long long ticks = 0;
  // After ')': state (field 3) ... starttime (field 22): skip 19 fields.
  if (std::sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
                         "%*d %*d %llu", &ticks) != 1)
    return 0;
  const long hz = sysconf(_SC_CLK_TCK);
  return hz > 0 ? static_cast<std::int64_t>(ticks) * (1'000'000'000 / hz) : 0;
}

// Writers and the clearer serialise on an exclusive flock of the mark: clear_contested reads
// and unlinks it under the lock, so a mark written meanwhile is never deleted with the old
// one. A writer that gets the lock on a mark unlinked in between (no links left) writes a
// fresh one instead. (Readers take no lock: they read one 8-byte value.)
void mark_contested(const std::string& name) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int fd = segment::open_object(contest_name(name), segment::ObjectOpen::open_or_create,
                                        /*writable=*/true);
    if (fd < 0) return;  // best effort: a rank that misses it waits until its timeout
    struct stat st {};
    bool again = false;
    if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && (st.st_mode & 077) == 0 &&
        flock(fd, LOCK_EX) == 0) {
      if (fstat(fd, &st) == 0 && st.st_nlink == 0) {
        again = true;  // cleared between our open and our lock
      } else {
        const std::int64_t now = contest_clock_ns();
        [[maybe_unused]] const ssize_t n = pwrite(fd, &now, sizeof now, 0);
      }
    }
    ::close(fd);  // drops the lock
    if (!again) return;
  }
}

std::int64_t contested_at(const std::string& name) {
  const int fd =
      segment::open_object(contest_name(name), segment::ObjectOpen::open_only, /*writable=*/false);
  if (fd < 0) return 0;
  std::int64_t at = 0;
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0 ||
      pread(fd, &at, sizeof at, 0) != static_cast<ssize_t>(sizeof at))
    at = 0;
  ::close(fd);
  return at;
}

void clear_contested(const std::string& name, std::int64_t before_ns) {
  const int fd =
      segment::open_object(contest_name(name), segment::ObjectOpen::open_only, /*writable=*/false);
  if (fd < 0) return;
  std::int64_t at = 0;
  struct stat st {};
  // Under the writers' lock (see mark_contested): the value read is the one unlinked.
  if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && (st.st_mode & 077) == 0 &&
      flock(fd, LOCK_EX) == 0 && fstat(fd, &st) == 0 && st.st_nlink > 0 &&
      pread(fd, &at, sizeof at, 0) == static_cast<ssize_t>(sizeof at) && at != 0 &&
      at < before_ns)
    segment::unlink_object(contest_name(name));
  ::close(fd);  // drops the lock
}

}  // namespace shmdist::detail
