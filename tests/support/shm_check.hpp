// Leak checks for multi-process tests: no shared-memory object and no child process may
// outlive a test. Use ShmLeakCheck as a Boost.Test fixture (BOOST_FIXTURE_TEST_SUITE or
// BOOST_AUTO_TEST_SUITE(..., *boost::unit_test::fixture<ShmLeakCheck>())).
//
// A test checks only the names its own jobs made, so that other programs on the machine
// (another checkout's test suite, a user's job, a crashed job's leftovers) can neither fail
// it nor hide behind it: every test process sets SHMDIST_SHM_TAG in its environment to a
// fresh tag before main() (own_shm_tag()), every job it starts inherits it and puts it into
// each name it gives an object in /dev/shm ("shmdist-<uid>-<tag>-..."), and the checks look
// at those names only.
#pragma once

#include <set>
#include <string>

namespace shmdist::test {

// This test process's tag ("t<pid>_<random hex>"), set in its environment as SHMDIST_SHM_TAG
// at the first call (made during static initialisation, before any test runs).
const std::string& own_shm_tag();
// "shmdist-<uid>-<own tag>-": how every name this process's jobs make in /dev/shm begins.
std::string own_shm_prefix();
// Names in /dev/shm that this process's jobs made (they start with own_shm_prefix()).
std::set<std::string> shm_objects();
// Our child processes that still exist (zombies included), as "pid command" lines.
std::set<std::string> child_processes();

struct ShmLeakCheck {
  ShmLeakCheck();
  ~ShmLeakCheck();  // fails the current test if a new object of ours or a child remains
  // Our names made since construction that remain after a grace for exiting processes.
  std::set<std::string> leaked_objects() const;
  std::set<std::string> before;
};

}  // namespace shmdist::test
