// DType metadata and validation of dtype codes from untrusted input.
#include <boost/test/unit_test.hpp>

#include <shmdist/tensor.hpp>

using namespace shmdist;

namespace {

bool message_contains(const InvalidArgument& e, const std::string& needle) {
  return std::string(e.what()).find(needle) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(dtype)

BOOST_AUTO_TEST_CASE(sizes_names_and_kinds) {
  struct Row {
    DType dtype;
    std::size_t size;
    const char* name;
    bool floating;
  };
  const Row rows[] = {
      {kBool, 1, "torch.bool", false},       {kUInt8, 1, "torch.uint8", false},
      {kInt8, 1, "torch.int8", false},       {kInt16, 2, "torch.int16", false},
      {kInt32, 4, "torch.int32", false},     {kInt64, 8, "torch.int64", false},
      {kFloat16, 2, "torch.float16", true},  {kBFloat16, 2, "torch.bfloat16", true},
      {kFloat32, 4, "torch.float32", true},  {kFloat64, 8, "torch.float64", true},
  };
  for (const Row& row : rows) {
    BOOST_TEST(element_size(row.dtype) == row.size);
    BOOST_TEST(dtype_name(row.dtype) == row.name);
    BOOST_TEST(is_floating_point(row.dtype) == row.floating);
  }
}

// Every row of shmdist/dtype_table.hpp as the API sees it: its code is the enumerator's value
// (codes travel between ranks: a row never changes its code), its element type maps back to
// it, and its size and name are the row's.
BOOST_AUTO_TEST_CASE(every_row_of_the_table_is_what_the_api_says) {
  int rows = 0;
#define ROW(name, code, element, storage, torch_name, ...)                              \
  BOOST_TEST_CONTEXT(#name) {                                                           \
    ++rows;                                                                             \
    BOOST_TEST(static_cast<int>(DType::name) == code);                                  \
    BOOST_TEST((dtype_from_code(code) == DType::name));                                 \
    BOOST_TEST((dtype_of<element>() == DType::name));                                   \
    BOOST_TEST(element_size(DType::name) == sizeof(storage));                           \
    BOOST_TEST(dtype_name(DType::name) == std::string_view(torch_name));                \
  }
  SHMDIST_DTYPES(ROW)
#undef ROW
  BOOST_TEST(rows == kNumDTypes);
  // The codes of the first ten are fixed: peers of other builds read them.
  BOOST_TEST(static_cast<int>(kBool) == 0);
  BOOST_TEST(static_cast<int>(kFloat64) == 9);
}

BOOST_AUTO_TEST_CASE(torch_style_aliases) {
  BOOST_TEST((kShort == kInt16 && kInt == kInt32 && kLong == kInt64));
  BOOST_TEST((kHalf == kFloat16 && kFloat == kFloat32 && kDouble == kFloat64));
  BOOST_TEST((dtype_of<bool>() == kBool && dtype_of<std::uint8_t>() == kUInt8));
  BOOST_TEST((dtype_of<Half>() == kHalf && dtype_of<BFloat16>() == kBFloat16));
  BOOST_TEST((dtype_of<float>() == kFloat && dtype_of<double>() == kDouble));
}

BOOST_AUTO_TEST_CASE(codes_round_trip) {
  for (unsigned code = 0; code < kNumDTypes; ++code)
    BOOST_TEST(static_cast<unsigned>(dtype_from_code(code)) == code);
}

BOOST_AUTO_TEST_CASE(bad_codes_throw_with_a_useful_message) {
  for (unsigned bad : {10u, 11u, 255u, 4000000000u}) {
    BOOST_CHECK_EXCEPTION(dtype_from_code(bad), InvalidArgument, [&](const InvalidArgument& e) {
      return message_contains(e, "found " + std::to_string(bad)) &&
             message_contains(e, "expected a dtype code");
    });
  }
  const auto forged = static_cast<DType>(42);
  BOOST_CHECK_THROW(element_size(forged), InvalidArgument);
  BOOST_CHECK_THROW(dtype_name(forged), InvalidArgument);
  BOOST_CHECK_THROW(is_floating_point(forged), InvalidArgument);
  BOOST_CHECK_THROW(zeros(3, forged), InvalidArgument);
  BOOST_CHECK_THROW(arange(3).to(forged), InvalidArgument);
  int storage = 0;
  BOOST_CHECK_THROW(Tensor::from_blob(&storage, {1}, forged), InvalidArgument);
  BOOST_CHECK_THROW(convert_elements(&storage, forged, &storage, kInt32, 1), InvalidArgument);
}

BOOST_AUTO_TEST_SUITE_END()
