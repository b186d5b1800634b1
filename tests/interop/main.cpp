#define BOOST_TEST_MODULE shmdist foreign launchers
#include <boost/test/unit_test.hpp>
