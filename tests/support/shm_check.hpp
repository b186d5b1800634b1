// Leak checks for multi-process tests: no shared-memory object and no child process may
// outlive a test. Use ShmLeakCheck as a Boost.Test fixture (BOOST_FIXTURE_TEST_SUITE or
// BOOST_AUTO_TEST_SUITE(..., *boost::unit_test::fixture<ShmLeakCheck>())).
#pragma once

#include <set>
#include <string>

namespace shmdist::test {

// Names in /dev/shm that start with "shmdist".
std::set<std::string> shm_objects();
// Our child processes that still exist (zombies included), as "pid command" lines.
std::set<std::string> child_processes();

struct ShmLeakCheck {
  ShmLeakCheck();
  ~ShmLeakCheck();  // fails the current test if a new shmdist object or child remains
  std::set<std::string> before;
};

}  // namespace shmdist::test
