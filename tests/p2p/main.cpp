#define BOOST_TEST_MODULE shmdist point-to-point
#include <boost/test/unit_test.hpp>
