// The tensor layer's Boost.Test runner; the test cases live in the other files of this folder.
#define BOOST_TEST_MODULE shmdist_tensor
#include <boost/test/unit_test.hpp>
