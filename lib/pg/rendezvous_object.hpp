// The named shared-memory object of a rendezvous (pg/rendezvous.cpp): creating it so that an
// incomplete one is recognisable, opening it only if it is ours, and the one path that ever
// removes its name.
//
// Incomplete objects: the creator takes an exclusive flock on the object right after
// creating it (O_EXCL) and keeps it until the layout is complete (magic number written), so
// an object that is not a complete, valid segment and whose lock nobody holds was abandoned:
// its creator died while sizing or writing it (whatever it got to write: nothing, part of a
// header, a header of another layout), or it was planted. The kernel drops the lock of a
// dead process. A creator that loses
// the race in the instant between creating and locking finds its name gone (or pointing
// elsewhere) once it is done, and starts over.
//
// Removing a name: every remover holds an exclusive flock on the object it means to remove
// and checks, under the lock, that the name still refers to that object (same inode). Since
// only lock holders remove names and a new object can only be created once the old name is
// gone, the name cannot change between that check and the unlink: no rank ever removes a
// newer job's segment.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "segment/segment.hpp"

namespace shmdist::detail {

// An open rendezvous object: the descriptor (locks and inode checks need it) and, once
// complete, its mapped and validated segment.
struct NamedObject {
  NamedObject() = default;
  NamedObject(NamedObject&& o) noexcept;
  NamedObject& operator=(NamedObject&& o) noexcept;
  NamedObject(const NamedObject&) = delete;
  NamedObject& operator=(const NamedObject&) = delete;
  ~NamedObject();

  int fd = -1;                                // -1: no object
  std::shared_ptr<segment::Segment> segment;  // null while incomplete or invalid
  std::string invalid;  // why a begun object (magic number written) is not a valid segment
};

// The name of one of this user's objects in /dev/shm: "shmdist-<uid>-<rest>", or
// "shmdist-<uid>-<tag>-<rest>" with a tag (SHMDIST_SHM_TAG, config::Config::shm_tag), which
// lets whoever set it tell its objects from everyone else's. Every name shmdist gives an
// object in /dev/shm is made here (segment::Segment::create_named's default name aside,
// which only tests use).
std::string shm_object_name(const std::string& tag, const std::string& rest);

// "/dev/shm/NAME", as errors name the object.
std::string object_path(const std::string& name);

// Creates `name` exclusively (mode 0600) and initialises a segment in it, holding the
// creation lock meanwhile. Returns a NamedObject without fd if the name exists already.
// Throws SetupError if creation fails (the name is removed again then). The caller must
// check still_named() afterwards (see above).
NamedObject create_named_object(const std::string& name, int world_size,
                                std::uint64_t ring_size);

// Opens `name` if it exists. Throws SetupError (via segment::require_private_object) if it
// is not owned by this user or is open to group/others; such an object is never touched.
// A begun object (header and magic number written) is mapped and validated against
// `world_size`; if that fails, `invalid` says why and `segment` stays null, except for a
// segment of another layout version (another shmdist's job, maybe live), which throws
// SetupError as it always did: such an object is never replaced.
NamedObject open_named_object(const std::string& name, int world_size,
                              const std::string& remedy);

// Whether `name` still refers to the object behind `fd`.
bool still_named(int fd, const std::string& name);

// Removes an incomplete or invalid object nobody is creating any more (see above): returns
// true if it removed the name, false if its creator still holds the lock or it is a valid
// segment.
bool remove_if_abandoned(int fd, const std::string& name);

// The one path that removes a rendezvous name: under the object's lock, and only if the
// name still refers to it. `notice`, if not empty, is printed to stderr when it does.
void remove_name_of(int fd, const std::string& name, const std::string& notice = {});

// The mark a contest over a job identity leaves (pg/identity_claim.hpp): "<name>-contested",
// a tiny object holding the time of the last contest (CLOCK_BOOTTIME, ns: the clock process
// start times count on). A rank waiting for its rank 0 that sees a contest marked after its
// process started, and within the rendezvous timeout, knows that a second job has its
// identity (its own rank 0 may have lost, and would never come): it fails at once. An older
// mark is ignored (a job started later, or a contest whose ranks have all given up);
// the next rank 0 whose job starts removes it.
void mark_contested(const std::string& name);
// Now on the clock of the marks.
std::int64_t contest_clock_ns();
// When this process started, on that clock (rounded down to a clock tick).
std::int64_t process_start_ns();
// The time of the last contest over `name`, or 0 (none, or not this user's private object).
std::int64_t contested_at(const std::string& name);
// Removes the mark if it is older than `before_ns`; never a mark written meanwhile (both
// hold an exclusive flock of the mark).
void clear_contested(const std::string& name, std::int64_t before_ns);

}  // namespace shmdist::detail
