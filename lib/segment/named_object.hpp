// The one path for shared-memory objects with a name in /dev/shm. Every name shmdist gives
// such an object is made here (shm_object_name); every such object is created, opened and
// unnamed here, through Boost.Interprocess's shared_memory_object (the design card's
// package); and a segment in one is created so that an incomplete one is recognisable,
// opened only if it is ours, and unnamed by one path only. Production (the rendezvous and
// the store join, pg/) and the tests use these same functions.
//
// Incomplete objects: the creator takes an exclusive flock on the object right after
// creating it (O_EXCL) and keeps it until the layout is complete (magic number written), so
// an object that is not a complete, valid segment and whose lock nobody holds was abandoned:
// its creator died while sizing or writing it (whatever it got to write: nothing, part of a
// header, a header of another layout), or it was planted. The kernel drops the lock of a
// dead process. A creator that loses the race in the instant between creating and locking
// finds its name gone (or pointing elsewhere) once it is done, and starts over.
//
// Removing a name: every remover holds an exclusive flock on the object it means to remove
// and checks, under the lock, that the name still refers to that object (same inode). Since
// only lock holders remove names and a new object can only be created once the old name is
// gone, the name cannot change between that check and the unlink: no rank ever removes a
// newer job's segment.
//
// Where the code goes around Boost.Interprocess, and why:
// - the creation lock and the removers' lock are flock()s on the descriptor: Boost's
//   file_lock takes a path (not a shared-memory object) and uses fcntl record locks, which a
//   process loses as soon as it closes any descriptor of the file;
// - owner, mode and inode checks use fstat/stat: Boost.Interprocess cannot say who owns an
//   object or which object a name refers to now;
// - mappings are Segment's own (segment.cpp), each with a guard page after it: Boost's
//   mapped_region cannot place a mapping in front of a reserved page (it does not map
//   MAP_FIXED), and segments also live in a memfd or an inherited descriptor, which no
//   Boost.Interprocess object can hold (segment_memfd.cpp).
// O_NOFOLLOW and O_CLOEXEC on every open come from glibc's shm_open, which Boost calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "segment/segment.hpp"

namespace shmdist::segment {

// The name of one of this user's objects in /dev/shm: "shmdist-<uid>-<rest>", or
// "shmdist-<uid>-<tag>-<rest>" with a tag (SHMDIST_SHM_TAG, config::Config::shm_tag), which
// lets whoever set it tell its objects from everyone else's. Every name shmdist gives an
// object in /dev/shm is made here.
std::string shm_object_name(const std::string& tag, const std::string& rest);

// "/dev/shm/NAME", as errors name the object.
std::string object_path(const std::string& name);

// How open_object treats the name.
enum class ObjectOpen {
  create_only,     // O_CREAT | O_EXCL: fails with EEXIST if the name exists
  open_only,       // fails with ENOENT if it does not
  open_or_create,  // either; a created object gets mode 0600 as with create_only
};

// Opens or creates the shared-memory object `name` through Boost.Interprocess (a created
// one with mode 0600, whatever the umask). Returns a close-on-exec descriptor that is this
// caller's to close, or -1 with errno set (EEXIST, ENOENT, EACCES, ...). Checks nothing
// about an object that existed: the callers do (require_private_object).
int open_object(const std::string& name, ObjectOpen how, bool writable);

// Removes the name `name` (the memory lives on while mapped or open). Returns whether it
// did. No checks: a segment's name goes through remove_name_of.
bool unlink_object(const std::string& name);

// An open named segment: the descriptor (locks and inode checks need it) and, once
// complete, its mapped and validated segment.
struct NamedObject {
  NamedObject() = default;
  NamedObject(NamedObject&& o) noexcept;
  NamedObject& operator=(NamedObject&& o) noexcept;
  NamedObject(const NamedObject&) = delete;
  NamedObject& operator=(const NamedObject&) = delete;
  ~NamedObject();

  int fd = -1;                       // -1: no object
  std::shared_ptr<Segment> segment;  // null while incomplete or invalid
  std::string invalid;  // why a begun object (magic number written) is not a valid segment
};

// Creates `name` exclusively (mode 0600) and initialises a segment in it, holding the
// creation lock meanwhile. Returns a NamedObject without fd if the name exists already.
// Throws SetupError if creation fails (the name is removed again then). The caller must
// check still_named() afterwards (see above).
NamedObject create_named_object(const std::string& name, int world_size,
                                std::uint64_t ring_size);

// Opens `name` if it exists. Throws SetupError (via require_private_object) if it is not
// owned by this user or is open to group/others; such an object is never touched, and
// `remedy` says what to do. A begun object (header and magic number written) is mapped and
// validated against `world_size` (0: any); if that fails, `invalid` says why and `segment`
// stays null, except for a segment of another layout version (another shmdist's job, maybe
// live), which throws SetupError: such an object is never replaced.
NamedObject open_named_object(const std::string& name, int world_size,
                              const std::string& remedy);

// Whether `name` still refers to the object behind `fd`.
bool still_named(int fd, const std::string& name);

// Removes an incomplete or invalid object nobody is creating any more (see above): returns
// true if it removed the name, false if its creator still holds the lock or it is a valid
// segment.
bool remove_if_abandoned(int fd, const std::string& name);

// The one path that removes a segment's name: under the object's lock, and only if the
// name still refers to it. `notice`, if not empty, is printed to stderr when it does.
void remove_name_of(int fd, const std::string& name, const std::string& notice = {});

}  // namespace shmdist::segment
