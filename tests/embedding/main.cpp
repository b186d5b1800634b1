#define BOOST_TEST_MODULE shmdist embedding
#include <boost/test/unit_test.hpp>
