#define BOOST_TEST_MODULE shmdist seed examples
#include <boost/test/unit_test.hpp>
