#define BOOST_TEST_MODULE hostile
#include <boost/test/unit_test.hpp>

#include "launcher/live_command.hpp"

// Ranks orphaned by a dying launcher are re-parented to this process, so that the leak
// checks (ShmLeakCheck) see any that linger instead of losing them to init.
struct Subreaper {
  Subreaper() { shmdist::test::become_subreaper(); }
};
BOOST_TEST_GLOBAL_FIXTURE(Subreaper);
