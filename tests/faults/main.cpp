#define BOOST_TEST_MODULE shmdist fault injection
#include <boost/test/unit_test.hpp>

#include "launcher/live_command.hpp"

// Ranks orphaned by a dying launcher are re-parented to this process, so that a test can
// reap them and the leak checks (ShmLeakCheck) see any that linger.
struct Subreaper {
  Subreaper() { shmdist::test::become_subreaper(); }
};
BOOST_TEST_GLOBAL_FIXTURE(Subreaper);
