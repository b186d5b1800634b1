#define BOOST_TEST_MODULE shmdist transport
#include <boost/test/unit_test.hpp>
