#include "pg/rendezvous_object.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <utility>

#include <shmdist/errors.hpp>

#include "segment/private_object.hpp"

namespace shmdist::detail {
namespace {

// Holds an flock for a scope.
struct FileLock {
  FileLock(int file, bool wait) : fd(file) {
    int rc;
    do rc = flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB));
    while (rc != 0 && errno == EINTR);
    held = rc == 0;
  }
  ~FileLock() {
    if (held) flock(fd, LOCK_UN);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  int fd;
  bool held = false;
};

// Begun = at least a header and a magic number written. Our creator writes the magic number
// last (with release; pread goes through the same page cache as the creator's mapping), so a
// begun object of ours is complete; but a creator of another layout, or one killed while
// writing, may leave a begun object that is not a valid segment (see is_valid_segment).
bool is_begun(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || std::size_t(st.st_size) < sizeof(segment::SegmentHeader))
    return false;
  std::uint64_t magic = 0;
  return pread(fd, &magic, sizeof magic, 0) == static_cast<ssize_t>(sizeof magic) && magic != 0;
}

// The layout version of a begun object made by another version of shmdist (its magic
// number and a layout version other than ours), or 0. Such an object may be a live job's
// complete segment, whose creation lock is long released: it is refused, never replaced.
std::uint32_t other_layout_version(int fd) {
  if (!is_begun(fd)) return 0;
  segment::SegmentHeader h{};
  if (pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) || h.magic != segment::kMagic)
    return 0;
  return h.layout_version != 0 && h.layout_version != segment::kLayoutVersion ? h.layout_version
                                                                              : 0;
}

// A complete segment of this layout, for any world size. The caller holds the object's lock,
// so no creator of ours is writing it: one that finished stored its magic number last with
// release, and validate() reads the header with acquire, so a finished layout is seen whole
// and never taken for an invalid one.
bool is_valid_segment(int fd) {
  if (!is_begun(fd)) return false;
  try {
    segment::Segment::attach_fd(fd, /*expected_world_size=*/0);
    return true;
  } catch (const SetupError&) {
    return false;
  }
}

}  // namespace

NamedObject::NamedObject(NamedObject&& o) noexcept { *this = std::move(o); }
NamedObject& NamedObject::operator=(NamedObject&& o) noexcept {
  if (this != &o) {
    if (fd >= 0) ::close(fd);
    fd = std::exchange(o.fd, -1);
    segment = std::move(o.segment);
    invalid = std::move(o.invalid);
  }
  return *this;
}
NamedObject::~NamedObject() {
  if (fd >= 0) ::close(fd);
}

std::string shm_object_name(const std::string& tag, const std::string& rest) {
  std::string name = "shmdist-" + std::to_string(getuid()) + "-";
  if (!tag.empty()) name += tag + "-";
  return name + rest;
}

std::string object_path(const std::string& name) { return "/dev/shm/" + name; }

NamedObject create_named_object(const std::string& name, int world_size,
                                std::uint64_t ring_size) {
  NamedObject obj;
  // glibc's shm_open adds O_NOFOLLOW | O_CLOEXEC.
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return obj;
    throw SetupError("cannot create the rendezvous segment '" + object_path(name) +
                     "': " + std::strerror(errno) +
                     ". Check that /dev/shm is mounted and writable.");
  }
  obj.fd = fd;
  FileLock creating(fd, /*wait=*/true);  // see the header: "incomplete objects"
  try {
    if (fchmod(fd, 0600) != 0)  // exactly 0600, whatever the umask
      throw SetupError("cannot set the mode of the rendezvous segment '" + object_path(name) +
                       "': " + std::strerror(errno));
    obj.segment = std::make_shared<segment::Segment>(
        segment::Segment::create_on_fd(fd, world_size, ring_size));
  } catch (...) {
    // Ours, incomplete, and we hold its lock: remove it (if the name is still ours).
    if (still_named(fd, name)) shm_unlink(name.c_str());
    throw;
  }
  // The Segment owns the descriptor now; keep a duplicate for locks and inode checks.
  obj.fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (obj.fd < 0) {
    const int err = errno;
    if (still_named(fd, name)) shm_unlink(name.c_str());
    throw SetupError(std::string("cannot duplicate the rendezvous segment's descriptor: ") +
                     std::strerror(err));
  }
  return obj;
}

NamedObject open_named_object(const std::string& name, int world_size,
                              const std::string& remedy) {
  NamedObject obj;
  const std::string path = object_path(name);
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    if (errno == ENOENT) return obj;
    const int err = errno;
    // Not even openable: say whose it is (require_private_object throws for another owner).
    struct stat st {};
    if (err == EACCES && stat(path.c_str(), &st) == 0)
      segment::require_private_object(st, path, remedy);
    throw SetupError("cannot open the rendezvous segment '" + path + "': " +
                     std::strerror(err) + "; " + remedy);
  }
  obj.fd = fd;
  segment::require_private_object(fd, path, remedy);  // before reading any of its contents
  if (!is_begun(fd)) return obj;
  try {
    obj.segment =
        std::make_shared<segment::Segment>(segment::Segment::attach_fd(fd, world_size));
  } catch (const SetupError& e) {
    if (other_layout_version(fd) != 0) throw;  // another shmdist's segment: refused at once
    obj.invalid = "'" + path + "': " + e.what();  // the caller decides: replace or refuse
  }
  return obj;
}

bool still_named(int fd, const std::string& name) {
  struct stat held {}, named {};
  return fstat(fd, &held) == 0 && stat(object_path(name).c_str(), &named) == 0 &&
         held.st_ino == named.st_ino && held.st_dev == named.st_dev;
}

bool remove_if_abandoned(int fd, const std::string& name) {
  FileLock lock(fd, /*wait=*/false);
  if (!lock.held || is_valid_segment(fd) || other_layout_version(fd) != 0 ||
      !still_named(fd, name))
    return false;
  std::fprintf(stderr,
               "shmdist: replacing the incomplete segment '%s' (its creator died before it "
               "was a complete segment of this version, and nobody is creating it)\n",
               name.c_str());
  return shm_unlink(name.c_str()) == 0;
}

void remove_name_of(int fd, const std::string& name, const std::string& notice) {
  if (fd < 0) return;
  FileLock lock(fd, /*wait=*/true);
  if (!lock.held || !still_named(fd, name)) return;
  if (!notice.empty()) std::fprintf(stderr, "shmdist: %s\n", notice.c_str());
  shm_unlink(name.c_str());
}

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
    const int fd = shm_open(contest_name(name).c_str(), O_RDWR | O_CREAT, 0600);
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
  const int fd = shm_open(contest_name(name).c_str(), O_RDONLY, 0);
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
  const int fd = shm_open(contest_name(name).c_str(), O_RDONLY, 0);
  if (fd < 0) return;
  std::int64_t at = 0;
  struct stat st {};
  // Under the writers' lock (see mark_contested): the value read is the one unlinked.
  if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && (st.st_mode & 077) == 0 &&
      flock(fd, LOCK_EX) == 0 && fstat(fd, &st) == 0 && st.st_nlink > 0 &&
      pread(fd, &at, sizeof at, 0) == static_cast<ssize_t>(sizeof at) && at != 0 &&
      at < before_ns)
    shm_unlink(contest_name(name).c_str());
  ::close(fd);  // drops the lock
}

}  // namespace shmdist::detail
