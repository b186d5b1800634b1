// Printing details not covered by the torch-generated golden file: operator<<, odd memory.
#include <cmath>
#include <sstream>

#include <boost/test/unit_test.hpp>

#include <shmdist/tensor.hpp>

using namespace shmdist;

BOOST_AUTO_TEST_SUITE(format)

BOOST_AUTO_TEST_CASE(stream_output_equals_to_string) {
  std::ostringstream os;
  os << tensor({10, 20, 30, 40}) << '\n' << tensor({7., 8., 9.});
  BOOST_TEST(os.str() == "tensor([10, 20, 30, 40])\ntensor([7., 8., 9.])");
  std::ostringstream undefined;
  undefined << Tensor();
  BOOST_TEST(undefined.str() == "[ Tensor (undefined) ]");
}

BOOST_AUTO_TEST_CASE(negative_nan_prints_nan) {
  // glibc would print "-nan"; Python (and so torch) never does.
  BOOST_TEST(tensor({-NAN, 1.5}).to_string() == "tensor([   nan, 1.5000])");
  BOOST_TEST(scalar_tensor(-NAN, kFloat64).to_string() == "tensor(nan, dtype=torch.float64)");
}

BOOST_AUTO_TEST_CASE(bool_bytes_other_than_one_print_true) {
  unsigned char bytes[3] = {0, 1, 2};
  BOOST_TEST(Tensor::from_blob(bytes, {3}, kBool).to_string() == "tensor([False,  True,  True])");
}

BOOST_AUTO_TEST_CASE(deep_tensors_of_ones) {
  // 90 dimensions: the indent passes the line width, and torch still puts one element per line.
  std::vector<std::int64_t> sizes(90, 1);
  sizes.back() = 2;
  const std::string printed = zeros(sizes, kInt32).to_string();
  const std::string open(90, '[');
  const std::string close(90, ']');
  BOOST_TEST(printed == "tensor(" + open + "0,\n" + std::string(97, ' ') + "0" + close +
                            ",\n       dtype=torch.int32)");
}

BOOST_AUTO_TEST_CASE(huge_tensors_print_only_the_edges) {
  // 10^7 elements: summarizing must not format (or even visit) the hidden middle.
  const Tensor t = arange(10000000, kInt32);
  BOOST_TEST(t.to_string() ==
             "tensor([      0,       1,       2,  ..., 9999997, 9999998, 9999999],\n"
             "       dtype=torch.int32)");
}

BOOST_AUTO_TEST_SUITE_END()
