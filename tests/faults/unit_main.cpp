#define BOOST_TEST_MODULE shmdist hostile input
#include <boost/test/unit_test.hpp>
