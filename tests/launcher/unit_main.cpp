#define BOOST_TEST_MODULE lib/job units
#include <boost/test/unit_test.hpp>
