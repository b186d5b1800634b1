#define BOOST_TEST_MODULE shmdist engine
#include <boost/test/unit_test.hpp>
