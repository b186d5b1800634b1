#define BOOST_TEST_MODULE shmdist across hosts
#include <boost/test/unit_test.hpp>
