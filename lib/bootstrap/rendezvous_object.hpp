// The named objects of a rendezvous (rendezvous.cpp, store_join.cpp). The segment the ranks
// meet on is a segment::NamedObject (segment/named_object.hpp, the one named-object path:
// exclusive creation under a creation lock, the ownership check, the one path that removes
// a name), named here as the join code always named it; this file adds the mark a contest
// over a job identity leaves, a small object made through the same path.
#pragma once

#include <cstdint>
#include <string>

#include "segment/named_object.hpp"

namespace shmdist::detail {

using segment::create_named_object;
using segment::NamedObject;
using segment::object_path;
using segment::open_named_object;
using segment::remove_if_abandoned;
using segment::remove_name_of;
using segment::shm_object_name;
using segment::still_named;

// The mark a contest over a job identity leaves (bootstrap/identity_claim.hpp): "<name>-contested",
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
