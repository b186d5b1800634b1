#include "segment/named_object.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>

#include <shmdist/errors.hpp>

#include "segment/private_object.hpp"

namespace shmdist::segment {
namespace bip = boost::interprocess;
namespace {

// Holds an flock for a scope (not Boost's file_lock: see the header).
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
  if (fstat(fd, &st) != 0 || std::size_t(st.st_size) < sizeof(SegmentHeader)) return false;
  std::uint64_t magic = 0;
  return pread(fd, &magic, sizeof magic, 0) == static_cast<ssize_t>(sizeof magic) && magic != 0;
}

// The layout version of a begun object made by another version of shmdist (its magic
// number and a layout version other than ours), or 0. Such an object may be a live job's
// complete segment, whose creation lock is long released: it is refused, never replaced.
std::uint32_t other_layout_version(int fd) {
  if (!is_begun(fd)) return 0;
  SegmentHeader h{};
  if (pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) || h.magic != kMagic)
    return 0;
  return h.layout_version != 0 && h.layout_version != kLayoutVersion ? h.layout_version : 0;
}

// A complete segment of this layout, for any world size. The caller holds the object's lock,
// so no creator of ours is writing it: one that finished stored its magic number last with
// release, and validate() reads the header with acquire, so a finished layout is seen whole
// and never taken for an invalid one.
bool is_valid_segment(int fd) {
  if (!is_begun(fd)) return false;
  try {
    Segment::attach_fd(fd, /*expected_world_size=*/0);
    return true;
  } catch (const SetupError&) {
    return false;
  }
}

}  // namespace

std::string shm_object_name(const std::string& tag, const std::string& rest) {
  std::string name = "shmdist-" + std::to_string(getuid()) + "-";
  if (!tag.empty()) name += tag + "-";
  return name + rest;
}

std::string object_path(const std::string& name) { return "/dev/shm/" + name; }

int open_object(const std::string& name, ObjectOpen how, bool writable) {
  const bip::mode_t mode = writable ? bip::read_write : bip::read_only;
  const bip::permissions private_mode(0600);  // Boost applies it with fchmod, past the umask
  std::optional<bip::shared_memory_object> shm;
  try {
    switch (how) {
      case ObjectOpen::create_only:
        shm.emplace(bip::create_only, name.c_str(), mode, private_mode);
        break;
      case ObjectOpen::open_only:
        shm.emplace(bip::open_only, name.c_str(), mode);
        break;
      case ObjectOpen::open_or_create:
        shm.emplace(bip::open_or_create, name.c_str(), mode, private_mode);
        break;
    }
  } catch (const bip::interprocess_exception& e) {
    errno = e.get_native_error() != 0 ? e.get_native_error() : EIO;
    return -1;
  }
  // A descriptor of our own: the shared_memory_object closes its handle when it goes (it
  // has no release). Both are close-on-exec from the start (glibc's shm_open adds O_CLOEXEC,
  // and F_DUPFD_CLOEXEC): never an inheritable moment for a fork+exec in another thread.
  const int fd = ::fcntl(shm->get_mapping_handle().handle, F_DUPFD_CLOEXEC, 0);
  if (fd < 0 && how == ObjectOpen::create_only) {
    const int err = errno;
    // We created it: the name goes again (if it is still this object).
    if (still_named(shm->get_mapping_handle().handle, name)) unlink_object(name);
    errno = err;
  }
  return fd;
}

bool unlink_object(const std::string& name) {
  return bip::shared_memory_object::remove(name.c_str());
}

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

NamedObject create_named_object(const std::string& name, int world_size,
                                std::uint64_t ring_size) {
  NamedObject obj;
  const int fd = open_object(name, ObjectOpen::create_only, /*writable=*/true);
  if (fd < 0) {
    if (errno == EEXIST) return obj;
    throw SetupError("cannot create the shared segment '" + object_path(name) +
                     "': " + std::strerror(errno) +
                     ". Check that /dev/shm is mounted and writable.");
  }
  obj.fd = fd;
  FileLock creating(fd, /*wait=*/true);  // see the header: "incomplete objects"
  try {
    // Exactly 0600, whatever the umask: Boost.Interprocess calls fchmod too, but ignores
    // its failure.
    if (fchmod(fd, 0600) != 0)
      throw SetupError("cannot set the mode of the shared segment '" + object_path(name) +
                       "': " + std::strerror(errno));
    obj.segment = std::make_shared<Segment>(Segment::create_on_fd(fd, world_size, ring_size));
  } catch (...) {
    // Ours, incomplete, and we hold its lock: remove it (if the name is still ours).
    if (still_named(fd, name)) unlink_object(name);
    throw;
  }
  // The Segment owns the descriptor now; keep a duplicate for locks and inode checks.
  obj.fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (obj.fd < 0) {
    const int err = errno;
    if (still_named(fd, name)) unlink_object(name);
    throw SetupError(std::string("cannot duplicate the shared segment's descriptor: ") +
                     std::strerror(err));
  }
  return obj;
}

NamedObject open_named_object(const std::string& name, int world_size,
                              const std::string& remedy) {
  NamedObject obj;
  const std::string path = object_path(name);
  const int fd = open_object(name, ObjectOpen::open_only, /*writable=*/true);
  if (fd < 0) {
    if (errno == ENOENT) return obj;
    const int err = errno;
    // Not even openable: say whose it is (require_private_object throws for another owner).
    struct stat st {};
    if (err == EACCES && stat(path.c_str(), &st) == 0) require_private_object(st, path, remedy);
    throw SetupError("cannot open the shared segment '" + path + "': " + std::strerror(err) +
                     "; " + remedy);
  }
  obj.fd = fd;
  require_private_object(fd, path, remedy);  // before reading any of its contents
  if (!is_begun(fd)) return obj;
  try {
    obj.segment = std::make_shared<Segment>(Segment::attach_fd(fd, world_size));
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
  return unlink_object(name);
}

void remove_name_of(int fd, const std::string& name, const std::string& notice) {
  if (fd < 0) return;
  FileLock lock(fd, /*wait=*/true);
  if (!lock.held || !still_named(fd, name)) return;
  if (!notice.empty()) std::fprintf(stderr, "shmdist: %s\n", notice.c_str());
  unlink_object(name);
}

}  // namespace shmdist::segment
