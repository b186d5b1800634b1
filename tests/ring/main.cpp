#define BOOST_TEST_MODULE shmdist ring
#include <boost/test/unit_test.hpp>
