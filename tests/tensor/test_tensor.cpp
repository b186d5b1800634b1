// The Tensor handle: undefined tensors, shared storage, clone, equal, from_blob, typed access,
// to/copy_, and rejection of bad shapes.
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include <boost/test/unit_test.hpp>

#include <shmdist/tensor.hpp>

using namespace shmdist;

namespace {

// Checks the exception type and that the message names every given fragment.
template <class F>
void check_invalid(F&& call, std::initializer_list<std::string> fragments) {
  try {
    call();
    BOOST_ERROR("expected InvalidArgument");
  } catch (const InvalidArgument& e) {
    for (const auto& fragment : fragments)
      BOOST_TEST(std::string(e.what()).find(fragment) != std::string::npos,
                 "message '" << e.what() << "' lacks '" << fragment << "'");
  }
}

constexpr std::int64_t kBig = std::numeric_limits<std::int64_t>::max();

}  // namespace

BOOST_AUTO_TEST_SUITE(tensor_handle)

BOOST_AUTO_TEST_CASE(undefined_tensor) {
  Tensor t;
  BOOST_TEST(!t.defined());
  BOOST_TEST(t.numel() == 0);
  BOOST_TEST(t.nbytes() == 0u);
  BOOST_TEST(t.data_ptr() == nullptr);
  BOOST_TEST(t.to_string() == "[ Tensor (undefined) ]");
  BOOST_TEST(!t.clone().defined());
  BOOST_TEST(t.equal(Tensor()));
  BOOST_TEST(!t.equal(zeros(1)));
  BOOST_TEST(!zeros(1).equal(t));
  check_invalid([&] { t.data<float>(); }, {"undefined"});
  check_invalid([&] { t.to(kInt32); }, {"undefined"});
  Tensor defined = zeros(1);
  check_invalid([&] { defined.copy_(t); }, {"undefined source"});
  check_invalid([&] { t.copy_(defined); }, {"undefined destination"});
}

BOOST_AUTO_TEST_CASE(metadata_for_scalars_and_empty_tensors) {
  const Tensor s = scalar_tensor(2.5);
  BOOST_TEST(s.dim() == 0);
  BOOST_TEST(s.sizes().empty());
  BOOST_TEST(s.numel() == 1);
  BOOST_TEST(s.nbytes() == 4u);
  const Tensor e = empty({2, 0, 3}, kInt16);
  BOOST_TEST(e.dim() == 3);
  BOOST_TEST(e.numel() == 0);
  BOOST_TEST(e.nbytes() == 0u);
  BOOST_TEST(e.element_size() == 2u);
  BOOST_TEST(e.clone().equal(e));
  // A zero size makes the count 0 however large the other sizes are.
  BOOST_TEST(empty({0, kBig, kBig}).numel() == 0);
}

BOOST_AUTO_TEST_CASE(copies_share_storage) {
  Tensor a = zeros({2, 2});
  Tensor b = a;
  b.data<float>()[3] = 5.0f;
  BOOST_TEST(a.data<float>()[3] == 5.0f);
  BOOST_TEST(a.data_ptr() == b.data_ptr());
  std::shared_ptr<void> keep = a.storage_handle();
  float* raw = a.data<float>();
  a = Tensor();
  b = Tensor();
  BOOST_TEST(raw[3] == 5.0f);  // still alive through the handle
}

BOOST_AUTO_TEST_CASE(clone_copies_the_data) {
  Tensor a = tensor({1, 2, 3});
  Tensor c = a.clone();
  BOOST_TEST(c.data_ptr() != a.data_ptr());
  BOOST_TEST(c.equal(a));
  c.data<std::int64_t>()[0] = 9;
  BOOST_TEST(a.data<std::int64_t>()[0] == 1);
  BOOST_TEST(!c.equal(a));
}

BOOST_AUTO_TEST_CASE(equal_compares_dtype_shape_and_bits) {
  BOOST_TEST(tensor({1, 2, 3, 4}).equal(tensor({1, 2, 3, 4})));
  BOOST_TEST(!tensor({1, 2, 3, 4}).equal(tensor({1, 2, 3, 4}, kInt32)));
  BOOST_TEST(!tensor({1, 2, 3, 4}).equal(tensor({{1, 2}, {3, 4}})));
  BOOST_TEST(tensor({NAN}).equal(tensor({NAN})));   // bitwise: the same NaN is equal
  BOOST_TEST(!tensor({0.0}).equal(tensor({-0.0})));  // bitwise: the sign of zero counts
  BOOST_TEST(empty({0}).equal(empty({0})));
  BOOST_TEST(!empty({0}).equal(empty({0, 1})));
}

BOOST_AUTO_TEST_CASE(typed_access_checks_the_element_type) {
  Tensor t = zeros(3, kInt16);
  BOOST_CHECK_NO_THROW(t.data<std::int16_t>());
  check_invalid([&] { t.data<float>(); }, {"torch.int16", "torch.float32", "to(dtype)"});
}

BOOST_AUTO_TEST_CASE(from_blob_borrows_memory) {
  float buffer[6] = {0, 1, 2, 3, 4, 5};
  Tensor t = Tensor::from_blob(buffer, {2, 3}, kFloat32);
  BOOST_TEST(t.data_ptr() == static_cast<void*>(buffer));
  t.data<float>()[0] = 7;
  BOOST_TEST(buffer[0] == 7);
  buffer[5] = 9;
  BOOST_TEST(t.to_string() == "tensor([[7., 1., 2.],\n        [3., 4., 9.]])");
  Tensor c = t.clone();
  buffer[1] = 100;
  BOOST_TEST(c.data<float>()[1] == 1);
  BOOST_TEST(Tensor::from_blob(nullptr, {0, 4}, kInt8).to_string() ==
             "tensor([], size=(0, 4), dtype=torch.int8)");
  check_invalid([] { Tensor::from_blob(nullptr, {3}, kFloat32); },
                {"non-null", "nullptr", "3 elements"});
}

BOOST_AUTO_TEST_CASE(from_blob_with_an_owner_keeps_it_alive_as_long_as_any_copy) {
  auto buffer = std::make_shared<std::vector<std::int32_t>>(std::vector<std::int32_t>{4, 5, 6});
  std::weak_ptr<std::vector<std::int32_t>> watch = buffer;
  Tensor t = Tensor::from_blob(buffer->data(), {3}, kInt32, buffer);
  buffer.reset();
  BOOST_TEST(!watch.expired());
  Tensor copy = t;
  t = Tensor();
  BOOST_TEST(!watch.expired());
  BOOST_TEST(copy.to_string() == "tensor([4, 5, 6], dtype=torch.int32)");
  copy = Tensor();
  BOOST_TEST(watch.expired());
}

BOOST_AUTO_TEST_CASE(bad_shapes_are_rejected) {
  check_invalid([] { empty({2, -3}); }, {">= 0", "-3", "dimension 1", "[2, -3]"});
  check_invalid([] { zeros(-1); }, {"-1"});
  check_invalid([] { ones({-5}); }, {"-5"});
  check_invalid([] { full({1, -1}, 2.0); }, {"-1"});
  check_invalid([] { arange(-2); }, {"-2"});
  int x = 0;
  check_invalid([&] { Tensor::from_blob(&x, {-1}, kInt32); }, {"-1"});
  check_invalid([] { empty({kBig, 2}); }, {"overflows", "int64"});
  check_invalid([] { empty({1LL << 32, 1LL << 32}); }, {"overflows"});
  check_invalid([&] { Tensor::from_blob(&x, {kBig / 2, 3}, kInt8); }, {"overflows"});
  check_invalid([] { empty({1LL << 62}, kFloat64); }, {"size_t", "torch.float64"});
  check_invalid([&] { Tensor::from_blob(&x, {kBig}, kInt64); }, {"size_t"});
}

BOOST_AUTO_TEST_CASE(to_converts_and_always_copies) {
  const Tensor f = tensor({1.5, -2.7, 300.0});
  const Tensor i = f.to(kUInt8);
  BOOST_TEST(i.to_string() == "tensor([  1, 254,  44], dtype=torch.uint8)");
  const Tensor same = f.to(kFloat32);
  BOOST_TEST(same.equal(f));
  BOOST_TEST(same.data_ptr() != f.data_ptr());
  BOOST_TEST(tensor({{1, 2}, {3, 4}}).to(kFloat64).sizes() == (std::vector<std::int64_t>{2, 2}));
}

BOOST_AUTO_TEST_CASE(copy_converts_into_existing_storage) {
  // The seed's example 3: an int64 [7, 8, 9] received into a float32 tensor.
  Tensor dst = zeros(3);
  Tensor alias = dst;
  dst.copy_(tensor({7, 8, 9}));
  BOOST_TEST(alias.to_string() == "tensor([7., 8., 9.])");
  // Element counts must match; shapes need not.
  Tensor grid = zeros({2, 2}, kInt32);
  grid.copy_(tensor({1, 2, 3, 4}));
  BOOST_TEST(grid.to_string() == "tensor([[1, 2],\n        [3, 4]], dtype=torch.int32)");
  check_invalid([&] { grid.copy_(tensor({1, 2, 3})); }, {"4 elements", "found 3", "[2, 2]"});
  grid.copy_(grid);  // self-copy is a no-op
  BOOST_TEST(grid.data<std::int32_t>()[3] == 4);
}

BOOST_AUTO_TEST_CASE(copy_between_overlapping_views) {
  // Two views of one buffer with different dtypes: widening in place would overwrite source
  // elements before reading them, so copy_ must stage.
  alignas(8) unsigned char buffer[32] = {};
  Tensor narrow = Tensor::from_blob(buffer, {4}, kInt16);
  Tensor wide = Tensor::from_blob(buffer, {4}, kInt64);
  for (int i = 0; i < 4; ++i) narrow.data<std::int16_t>()[i] = static_cast<std::int16_t>(i + 1);
  wide.copy_(narrow);
  BOOST_TEST(wide.to_string() == "tensor([1, 2, 3, 4])");
}

BOOST_AUTO_TEST_SUITE_END()
