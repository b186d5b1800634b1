// Factories and the torch.tensor-style literal builders: dtype inference and value conversion.
#include <boost/test/unit_test.hpp>

#include <shmdist/tensor.hpp>

using namespace shmdist;

BOOST_AUTO_TEST_SUITE(factories)

BOOST_AUTO_TEST_CASE(seed_lines) {
  const Tensor ints = tensor({10, 20, 30, 40});
  BOOST_TEST(ints.dtype() == kInt64);
  BOOST_TEST(ints.to_string() == "tensor([10, 20, 30, 40])");
  const Tensor floats = tensor({7., 8., 9.});
  BOOST_TEST(floats.dtype() == kFloat32);
  BOOST_TEST(floats.to_string() == "tensor([7., 8., 9.])");
  BOOST_TEST(zeros(4, kLong).to_string() == "tensor([0, 0, 0, 0])");
}

BOOST_AUTO_TEST_CASE(literal_dtypes_follow_python) {
  BOOST_TEST(tensor({1.5f, 2.0f}).dtype() == kFloat32);
  BOOST_TEST(tensor({1, 2}).dtype() == kInt64);
  BOOST_TEST(tensor({1, 2.5}).dtype() == kFloat32);  // mixed: floating
  BOOST_TEST(tensor({true, false}).to_string() == "tensor([ True, False])");
  BOOST_TEST(tensor({std::uint8_t{1}}).dtype() == kInt64);
  BOOST_TEST(tensor({}).to_string() == "tensor([])");
  BOOST_TEST(tensor({1, 2}, kInt32).to_string() == "tensor([1, 2], dtype=torch.int32)");
  BOOST_TEST(tensor({1.5, 2.0}, kFloat16).to_string() ==
             "tensor([1.5000, 2.0000], dtype=torch.float16)");
  BOOST_TEST(tensor({300, -1}, kUInt8).to_string() == "tensor([ 44, 255], dtype=torch.uint8)");
}

BOOST_AUTO_TEST_CASE(nested_literals_are_2d) {
  const Tensor t = tensor({{1, 2}, {3, 4}});
  BOOST_TEST(t.sizes() == (std::vector<std::int64_t>{2, 2}));
  BOOST_TEST(t.to_string() == "tensor([[1, 2],\n        [3, 4]])");
  BOOST_TEST(tensor({{1.5, 2.0}}, kFloat64).to_string() ==
             "tensor([[1.5000, 2.0000]], dtype=torch.float64)");
  BOOST_CHECK_THROW(tensor({{1, 2}, {3}}), InvalidArgument);
}

BOOST_AUTO_TEST_CASE(scalars_are_0d) {
  BOOST_TEST(scalar_tensor(5).to_string() == "tensor(5)");
  BOOST_TEST(scalar_tensor(2.5).to_string() == "tensor(2.5000)");
  BOOST_TEST(scalar_tensor(true).to_string() == "tensor(True)");
  BOOST_TEST(scalar_tensor(5, kInt32).to_string() == "tensor(5, dtype=torch.int32)");
  BOOST_TEST(scalar_tensor(-0.0).to_string() == "tensor(-0.)");
  BOOST_TEST(scalar_tensor(5).dim() == 0);
}

BOOST_AUTO_TEST_CASE(fill_factories) {
  BOOST_TEST(ones(3).to_string() == "tensor([1., 1., 1.])");
  BOOST_TEST(ones({2, 2}, kBool).to_string() == "tensor([[True, True],\n        [True, True]])");
  BOOST_TEST(full({2}, 2.5, kInt32).to_string() == "tensor([2, 2], dtype=torch.int32)");
  BOOST_TEST(full({3}, -1.0, kUInt8).to_string() == "tensor([255, 255, 255], dtype=torch.uint8)");
  BOOST_TEST(full({5}, 0.1, kBFloat16).to_string() ==
             "tensor([0.1001, 0.1001, 0.1001, 0.1001, 0.1001], dtype=torch.bfloat16)");
  BOOST_TEST(full({}, 3.0).to_string() == "tensor(3.)");
  BOOST_TEST(empty({2, 3}).equal(zeros({2, 3})));  // empty() storage starts zeroed
  for (unsigned code = 0; code < kNumDTypes; ++code) {
    const DType d = dtype_from_code(code);
    BOOST_TEST(zeros(7, d).equal(full({7}, 0.0, d)));
    BOOST_TEST(ones({7}, d).equal(full({7}, 1.0, d)));
  }
}

BOOST_AUTO_TEST_CASE(arange_in_every_dtype) {
  BOOST_TEST(arange(5).to_string() == "tensor([0, 1, 2, 3, 4])");
  BOOST_TEST(arange(4, kFloat64).to_string() == "tensor([0., 1., 2., 3.], dtype=torch.float64)");
  BOOST_TEST(arange(3, kBool).to_string() == "tensor([False,  True,  True])");
  BOOST_TEST(arange(0).to_string() == "tensor([], dtype=torch.int64)");
  const Tensor big = arange(10000, kInt16);
  BOOST_TEST(big.data<std::int16_t>()[9999] == 9999);
  BOOST_TEST(arange(300, kUInt8).data<std::uint8_t>()[299] == 43);  // wraps like torch
}

BOOST_AUTO_TEST_SUITE_END()
