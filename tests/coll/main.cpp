#define BOOST_TEST_MODULE shmdist collectives
#include <boost/test/unit_test.hpp>
