// float16 / bfloat16 <-> float: exhaustive round trips and the rounding corner cases, checked
// against an independent oracle (c10's float-arithmetic formulation of the same conversion).
#include <cmath>
#include <cstring>

#include <boost/test/unit_test.hpp>

#include <shmdist/tensor.hpp>

using namespace shmdist;

namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// c10/util/Half.h fp16_ieee_from_fp32_value, which torch uses for float -> half.
std::uint16_t c10_half_from_float(float f) {
  const float scale_to_inf = float_of(UINT32_C(0x77800000));
  const float scale_to_zero = float_of(UINT32_C(0x08800000));
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const std::uint32_t w = bits_of(f);
  const std::uint32_t shl1_w = w + w;
  const std::uint32_t sign = w & UINT32_C(0x80000000);
  std::uint32_t bias = shl1_w & UINT32_C(0xFF000000);
  if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
  base = float_of((bias >> 1) + UINT32_C(0x07800000)) + base;
  const std::uint32_t b = bits_of(base);
  const std::uint32_t nonsign = ((b >> 13) & UINT32_C(0x7C00)) + (b & UINT32_C(0x0FFF));
  return static_cast<std::uint16_t>((sign >> 16) |
                                    (shl1_w > UINT32_C(0xFF000000) ? 0x7E00u : nonsign));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(half_and_bfloat16)

BOOST_AUTO_TEST_CASE(every_half_round_trips) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = to_float(Half{static_cast<std::uint16_t>(h)});
    const std::uint16_t back = half_from_float(f).bits;
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (nan) {
      BOOST_REQUIRE(std::isnan(f));
      BOOST_REQUIRE_EQUAL(back, (h & 0x8000) | 0x7e00);  // sign kept, payload dropped
      // The quiet bit is set and the payload kept, as c10's software conversion does.
      BOOST_REQUIRE_EQUAL(bits_of(f), ((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13));
    } else {
      BOOST_REQUIRE_EQUAL(back, h);
    }
  }
}

BOOST_AUTO_TEST_CASE(every_bfloat16_round_trips) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = to_float(BFloat16{static_cast<std::uint16_t>(b)});
    BOOST_REQUIRE_EQUAL(bits_of(f), b << 16);  // exact, even for NaN payloads
    const bool nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    BOOST_REQUIRE_EQUAL(bfloat16_from_float(f).bits, nan ? 0x7fc0u : b);
  }
}

BOOST_AUTO_TEST_CASE(half_matches_c10_on_a_sweep_of_floats) {
  // A stride coprime to 2^32 visits every exponent and many mantissa patterns, including the
  // subnormal and overflow ranges.
  std::uint32_t u = 0;
  for (int i = 0; i < (1 << 22); ++i, u += 1021u) {
    BOOST_REQUIRE_MESSAGE(half_from_float(float_of(u)).bits == c10_half_from_float(float_of(u)),
                          "float bits " << std::hex << u);
  }
}

BOOST_AUTO_TEST_CASE(half_rounding_corners) {
  BOOST_TEST(half_from_float(1.0f + 0x1p-11f).bits == 0x3c00);      // tie -> even (down)
  BOOST_TEST(half_from_float(1.0f + 3 * 0x1p-11f).bits == 0x3c02);  // tie -> even (up)
  BOOST_TEST(half_from_float(65504.0f).bits == 0x7bff);
  BOOST_TEST(half_from_float(65519.996f).bits == 0x7bff);
  BOOST_TEST(half_from_float(65520.0f).bits == 0x7c00);  // the tie above max rounds to inf
  BOOST_TEST(half_from_float(-1e10f).bits == 0xfc00);
  BOOST_TEST(half_from_float(INFINITY).bits == 0x7c00);
  BOOST_TEST(half_from_float(0x1p-24f).bits == 0x0001);  // smallest subnormal
  BOOST_TEST(half_from_float(0x1p-25f).bits == 0x0000);  // tie -> even (zero)
  BOOST_TEST(half_from_float(1.5f * 0x1p-24f).bits == 0x0002);
  BOOST_TEST(half_from_float(2.5f * 0x1p-24f).bits == 0x0002);
  BOOST_TEST(half_from_float(-0.0f).bits == 0x8000);
  BOOST_TEST(half_from_float(0x1.ffcp-15f).bits == 0x0400);  // tie rounds up into the normals
  BOOST_TEST(half_from_float(-NAN).bits == 0xfe00);
  BOOST_TEST(to_float(Half{0x3555}) == 0.333251953125f);
}

BOOST_AUTO_TEST_CASE(bfloat16_rounding_corners) {
  BOOST_TEST(bfloat16_from_float(1.0f + 0x1p-8f).bits == 0x3f80);      // tie -> even (down)
  BOOST_TEST(bfloat16_from_float(1.0f + 3 * 0x1p-8f).bits == 0x3f82);  // tie -> even (up)
  BOOST_TEST(bfloat16_from_float(3.4028235e38f).bits == 0x7f80);       // overflow -> inf
  BOOST_TEST(bfloat16_from_float(-INFINITY).bits == 0xff80);
  BOOST_TEST(bfloat16_from_float(-NAN).bits == 0x7fc0);  // c10: every NaN -> 0x7fc0
  BOOST_TEST(bfloat16_from_float(1e-40f).bits == 0x0001);
  BOOST_TEST(to_float(BFloat16{0x3eab}) == 0.333984375f);
}

BOOST_AUTO_TEST_SUITE_END()
