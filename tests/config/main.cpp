#define BOOST_TEST_MODULE shmdist config
#include <boost/test/unit_test.hpp>
