// Hand-written conversion rules: the out-of-range float -> int results torch gives on x86-64,
// and the buffer contract of convert_elements. (All 100 pairs are golden-tested as well.)
#include <cmath>
#include <cstring>
#include <limits>

#include <boost/test/unit_test.hpp>

#include <shmdist/tensor.hpp>

using namespace shmdist;

namespace {

template <class To, class From>
To convert_one(From value, DType from, DType to) {
  To out{};
  convert_elements(&value, from, &out, to, 1);
  return out;
}

template <class To>
To from_double(double v, DType to) {
  return convert_one<To>(v, kFloat64, to);
}

template <class To>
To from_float(float v, DType to) {
  return convert_one<To>(v, kFloat32, to);
}

constexpr std::int64_t kInt64Min = std::numeric_limits<std::int64_t>::min();
constexpr std::int32_t kInt32Min = std::numeric_limits<std::int32_t>::min();

}  // namespace

BOOST_AUTO_TEST_SUITE(convert)

BOOST_AUTO_TEST_CASE(float_to_int_truncates_toward_zero) {
  BOOST_TEST(from_double<std::int32_t>(2.9, kInt32) == 2);
  BOOST_TEST(from_double<std::int32_t>(-2.9, kInt32) == -2);
  BOOST_TEST(from_double<std::int64_t>(-0.5, kInt64) == 0);
  BOOST_TEST(from_float<std::int16_t>(-32768.7f, kInt16) == -32768);
  BOOST_TEST(from_double<std::int64_t>(9223372036854774784.0, kInt64) == 9223372036854774784);
}

BOOST_AUTO_TEST_CASE(out_of_range_float_to_int_is_what_torch_gives_on_x86) {
  BOOST_TEST(from_double<std::int64_t>(NAN, kInt64) == kInt64Min);
  BOOST_TEST(from_double<std::int64_t>(INFINITY, kInt64) == kInt64Min);
  BOOST_TEST(from_double<std::int64_t>(9223372036854775808.0, kInt64) == kInt64Min);
  BOOST_TEST(from_double<std::int32_t>(1e20, kInt32) == kInt32Min);
  BOOST_TEST(from_double<std::int32_t>(-2147483649.0, kInt32) == kInt32Min);
  BOOST_TEST(from_double<std::int32_t>(-2147483648.9, kInt32) == kInt32Min);
  BOOST_TEST(from_float<std::int32_t>(NAN, kInt32) == kInt32Min);
  BOOST_TEST(from_double<std::uint8_t>(300.0, kUInt8) == 44);
  BOOST_TEST(from_double<std::uint8_t>(-1.0, kUInt8) == 255);
  BOOST_TEST(from_double<std::uint8_t>(4294967301.0, kUInt8) == 5);  // via int64
  BOOST_TEST(from_double<std::uint8_t>(NAN, kUInt8) == 0);
  BOOST_TEST(from_double<std::int8_t>(NAN, kInt8) == 0);
  BOOST_TEST(from_double<std::int8_t>(300.0, kInt8) == 44);
  BOOST_TEST(from_double<std::int8_t>(4294967301.0, kInt8) == 0);  // via int32
  BOOST_TEST(from_double<std::int16_t>(70001.7, kInt16) == 4465);
  BOOST_TEST(from_float<std::int16_t>(-INFINITY, kInt16) == 0);
  BOOST_TEST(convert_one<std::int8_t>(Half{0x7c00}, kFloat16, kInt8) == 0);  // inf
  BOOST_TEST(convert_one<std::int64_t>(BFloat16{0x7fc0}, kBFloat16, kInt64) == kInt64Min);
}

BOOST_AUTO_TEST_CASE(bool_rules) {
  BOOST_TEST(from_double<std::uint8_t>(NAN, kBool) == 1);
  BOOST_TEST(from_double<std::uint8_t>(-0.0, kBool) == 0);
  BOOST_TEST(from_double<std::uint8_t>(1e-300, kBool) == 1);
  BOOST_TEST(convert_one<std::uint8_t>(std::int64_t{256}, kInt64, kBool) == 1);
  // A bool byte other than 0/1 (from_blob, the wire) reads as true, never as UB.
  BOOST_TEST(convert_one<std::int32_t>(std::uint8_t{2}, kBool, kInt32) == 1);
  BOOST_TEST(convert_one<float>(std::uint8_t{255}, kBool, kFloat32) == 1.0f);
  BOOST_TEST(convert_one<std::uint8_t>(std::uint8_t{7}, kBool, kBool) == 7);  // same dtype: bytes
}

BOOST_AUTO_TEST_CASE(int_conversions_wrap_and_round) {
  BOOST_TEST(convert_one<std::uint8_t>(std::int64_t{300}, kInt64, kUInt8) == 44);
  BOOST_TEST(convert_one<std::int8_t>(std::uint8_t{200}, kUInt8, kInt8) == -56);
  BOOST_TEST(convert_one<std::uint16_t>(std::int64_t{65520}, kInt64, kFloat16) == 0x7c00);
  BOOST_TEST(convert_one<std::uint16_t>(std::int32_t{-70000}, kInt32, kFloat16) == 0xfc00);
  BOOST_TEST(convert_one<std::uint16_t>(std::int64_t{65519}, kInt64, kFloat16) == 0x7bff);
  // int64 -> bfloat16 rounds to float first (double rounding), as torch does.
  BOOST_TEST(convert_one<std::uint16_t>(std::int64_t{(1 << 30) + (1 << 22) + 1}, kInt64,
                                        kBFloat16) == 0x4e80);
  BOOST_TEST(convert_one<float>(std::int64_t{(1LL << 62) + (1LL << 38) + 1}, kInt64, kFloat32) ==
             0x1.000002p62f);
}

BOOST_AUTO_TEST_CASE(float_narrowing) {
  // float64 -> float16 rounds to float first: 1 + 2^-11 + 2^-40 becomes the tie 1 + 2^-11,
  // which rounds to even (1.0); a direct rounding would give 1 + 2^-10.
  BOOST_TEST(from_double<std::uint16_t>(1.0 + 0x1p-11 + 0x1p-40, kFloat16) == 0x3c00);
  BOOST_TEST(from_double<float>(1e300, kFloat32) == INFINITY);
  BOOST_TEST(from_double<std::uint16_t>(-1e300, kBFloat16) == 0xff80);
  BOOST_TEST(from_float<std::uint16_t>(NAN, kBFloat16) == 0xffff);  // torch's AVX2 kernel
  BOOST_TEST(convert_one<std::uint16_t>(Half{0xfe00}, kFloat16, kBFloat16) == 0x7fc0);
}

BOOST_AUTO_TEST_CASE(buffer_contract) {
  BOOST_CHECK_NO_THROW(convert_elements(nullptr, kFloat32, nullptr, kInt8, 0));
  int value = 0;
  BOOST_CHECK_THROW(convert_elements(nullptr, kFloat32, &value, kInt32, 1), InvalidArgument);
  BOOST_CHECK_THROW(convert_elements(&value, kInt32, nullptr, kFloat32, 1), InvalidArgument);
  // Same dtype is a plain byte copy.
  const double source[3] = {1.5, NAN, -0.0};
  double copy[3] = {};
  convert_elements(source, kFloat64, copy, kFloat64, 3);
  BOOST_TEST(std::memcmp(source, copy, sizeof source) == 0);
}

BOOST_AUTO_TEST_CASE(large_conversion_is_elementwise_identical) {
  // The receive path converts whole tensors; chunking must not change any element.
  const Tensor source = arange(1 << 20, kInt64);
  const Tensor as_half = source.to(kFloat16);
  const Tensor back = as_half.to(kFloat32);
  const float* values = back.data<float>();
  for (std::int64_t i = 0; i < source.numel(); i += 4099) {
    const float expected = to_float(half_from_float(static_cast<float>(i)));
    BOOST_REQUIRE(values[i] == expected);
  }
}

BOOST_AUTO_TEST_SUITE_END()
