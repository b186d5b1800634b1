// Element conversion between any two dtypes, bit-exact with PyTorch 1.13's CPU copy_ (AVX2
// kernels, as on x86-64).
//
// Rules, as measured with torch 1.13.1 (`src.to(dtype)`) on x86-64; tests/golden/
// tensor_convert.txt holds the evidence for all 100 pairs:
//   * int -> int: two's-complement wrap (300 -> uint8 44, -1 -> uint8 255).
//   * anything -> bool: value != 0, so NaN -> true.  bool -> anything: 0 or 1.
//   * float -> int truncates toward zero. Out of range (and NaN, +-inf), torch's result is what
//     the x86 truncating conversion instructions give, never C++ undefined behaviour here:
//       - int64: cvttsd2si 64-bit, "integer indefinite" INT64_MIN for NaN/inf/|x| >= 2^63
//         (nan -> -9223372036854775808, 1e20 -> -9223372036854775808);
//       - int32: cvttsd2si 32-bit, INT32_MIN unless -2^31-1 < x < 2^31 (1e20 -> -2147483648);
//       - int16, int8: through the int32 rule, then wrapped (300. -> int8 44, 70001.7 ->
//         int16 4465, nan/inf/1e20 -> 0 because INT32_MIN's low bits are zero);
//       - uint8: c10 casts through int64 first, then wraps (-1. -> 255, 300. -> 44,
//         4294967301. -> 5, nan/inf/1e20 -> 0).
//   * float16 <- anything: via float, then round to nearest even; overflow -> +-inf (int64
//     65520 -> inf); NaN keeps its sign, payload dropped (0x7e00). float64 is rounded to float
//     first (double rounding, as c10::Half(float) does).
//   * bfloat16 <- anything: via float, round to nearest even. NaN depends on torch's kernel:
//     the AVX2 float32/float64 kernel writes 0xffff; the scalar path (float16 source, and the
//     last n % 16 elements of a float64 source) writes 0x7fc0. Both are reproduced, counting
//     the 16-blocks from the start of each convert_elements call (torch counts per thread
//     chunk of at least 32768 elements, so huge tensors can differ in which NaN bits appear).
//   * float16 -> float keeps NaN payloads but sets the quiet bit (c10 converts in software);
//     bfloat16 -> float is the exact bit shift; float <-> double use the hardware conversion.
#include <cmath>
#include <limits>

#include <shmdist/tensor.hpp>

#include "tensor/dtype_check.hpp"
#include "tensor/element_io.hpp"
#include "tensor/half_bits.hpp"

namespace shmdist {
namespace {

using detail::is_integer_dtype_v;
using detail::storage_t;

static_assert(std::numeric_limits<float>::is_iec559 && std::numeric_limits<double>::is_iec559,
              "conversions assume IEEE 754 float and double");

constexpr double kTwo63 = 9223372036854775808.0;
constexpr double kTwo31 = 2147483648.0;

// x86 cvttsd2si (64-bit): truncation, or INT64_MIN when the result does not fit.
std::int64_t truncate_to_int64(double x) {
  if (x >= -kTwo63 && x < kTwo63) return static_cast<std::int64_t>(x);
  return std::numeric_limits<std::int64_t>::min();
}

// x86 cvttsd2si (32-bit): truncation, or INT32_MIN when the result does not fit.
std::int32_t truncate_to_int32(double x) {
  if (x > -kTwo31 - 1.0 && x < kTwo31) return static_cast<std::int32_t>(x);
  return std::numeric_limits<std::int32_t>::min();
}

// The value a floating element has for conversion purposes.
template <DType From>
auto widen_float(storage_t<From> v) {
  if constexpr (From == DType::Float16) return detail::half_bits_to_float(v);
  else if constexpr (From == DType::BFloat16) return detail::bfloat16_bits_to_float(v);
  else {
    static_assert(std::is_floating_point_v<storage_t<From>>,
                  "a floating dtype stored as bits needs its decoding here");
    return v;
  }
}

template <DType To>
storage_t<To> int_from_float(double x) {
  if constexpr (To == DType::Int64) return truncate_to_int64(x);
  else if constexpr (To == DType::UInt8) return static_cast<std::uint8_t>(truncate_to_int64(x));
  else {
    // A new integer dtype needs torch's rule for it here (uint16/32/64 differ from these).
    static_assert(To == DType::Int8 || To == DType::Int16 || To == DType::Int32,
                  "an integer dtype without torch's float-to-integer rule here");
    return static_cast<storage_t<To>>(truncate_to_int32(x));
  }
}

template <DType To>
storage_t<To> float_from_float(float f) {
  if constexpr (To == DType::Float16) return detail::float_to_half_bits(f);
  else if constexpr (To == DType::BFloat16) return detail::float_to_bfloat16_bits(f);
  else {
    static_assert(std::is_floating_point_v<storage_t<To>>,
                  "a floating dtype stored as bits needs its encoding here");
    return static_cast<storage_t<To>>(f);
  }
}

// Out-of-range double -> float gives +-inf: defined for IEC 559 types (C Annex F), which
// static_asserts below pin down.
template <DType To>
storage_t<To> float_from_double(double d) {
  if constexpr (To == DType::Float64) return d;
  else return float_from_float<To>(static_cast<float>(d));
}

template <DType From, DType To>
storage_t<To> convert_one(storage_t<From> v) {
  if constexpr (To == DType::Bool) {
    if constexpr (is_integer_dtype_v<From> || From == DType::Bool) return v != 0 ? 1 : 0;
    else return widen_float<From>(v) != 0 ? 1 : 0;
  } else if constexpr (From == DType::Bool) {
    return convert_one<DType::UInt8, To>(v != 0 ? 1 : 0);
  } else if constexpr (is_integer_dtype_v<From> && is_integer_dtype_v<To>) {
    return static_cast<storage_t<To>>(v);
  } else if constexpr (is_integer_dtype_v<From>) {
    // torch converts integers to float16/bfloat16 through float (int -> float rounds first).
    if constexpr (To == DType::Float64) return static_cast<double>(v);
    else return float_from_float<To>(static_cast<float>(v));
  } else if constexpr (is_integer_dtype_v<To>) {
    return int_from_float<To>(static_cast<double>(widen_float<From>(v)));
  } else if constexpr (From == DType::Float64) {
    return float_from_double<To>(v);
  } else if constexpr (To == DType::Float64) {
    return static_cast<double>(widen_float<From>(v));
  } else {
    return float_from_float<To>(widen_float<From>(v));
  }
}

// torch's AVX2 float -> bfloat16 kernel (cvtfp32_bf16) blends every NaN lane to 0xffff.
std::uint16_t bfloat16_bits_vectorized(float f) {
  return std::isnan(f) ? std::uint16_t{0xffff} : detail::float_to_bfloat16_bits(f);
}

template <DType From, DType To>
void convert_range(const void* src, void* dst, std::size_t begin, std::size_t end) {
  for (std::size_t i = begin; i < end; ++i) {
    const auto v = detail::load<storage_t<From>>(src, i);
    detail::store<storage_t<To>>(dst, i, convert_one<From, To>(v));
  }
}

template <DType From>
void convert_to_bfloat16_vectorized(const void* src, void* dst, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    const auto v = static_cast<float>(detail::load<storage_t<From>>(src, i));
    detail::store<std::uint16_t>(dst, i, bfloat16_bits_vectorized(v));
  }
}

template <DType From, DType To>
void convert_all(const void* src, void* dst, std::size_t count) {
  if constexpr (To == DType::BFloat16 && From == DType::Float32) {
    convert_to_bfloat16_vectorized<From>(src, dst, count);
  } else if constexpr (To == DType::BFloat16 && From == DType::Float64) {
    // torch vectorizes whole blocks of 16 and finishes the remainder with the scalar path.
    const std::size_t vectorized = count - count % 16;
    convert_to_bfloat16_vectorized<From>(src, dst, vectorized);
    convert_range<From, To>(src, dst, vectorized, count);
  } else {
    convert_range<From, To>(src, dst, 0, count);
  }
}

template <DType From>
void convert_from(const void* src, void* dst, DType to, std::size_t count) {
  detail::visit_dtype(to, [&](auto to_row) { convert_all<From, to_row.value>(src, dst, count); });
}

}  // namespace

void convert_elements(const void* src, DType from, void* dst, DType to, std::size_t count) {
  detail::checked_dtype(from, "convert_elements (source dtype)");
  detail::checked_dtype(to, "convert_elements (destination dtype)");
  if (count == 0) return;
  if (src == nullptr || dst == nullptr)
    throw InvalidArgument("convert_elements: expected non-null source and destination for " +
                          std::to_string(count) +
                          " elements, found a null pointer; pass valid buffers");
  if (from == to) {
    std::memcpy(dst, src, count * element_size(from));
    return;
  }
  detail::visit_dtype(from, [&](auto from_row) { convert_from<from_row.value>(src, dst, to, count); });
}

namespace detail {

namespace {

// One element of D as a double (floating dtypes) or an int64 (bool: 0 or 1, integers).
template <DType D>
double floating_value(storage_t<D> s) {
  if constexpr (D == DType::Float16) return half_bits_to_float(s);
  else if constexpr (D == DType::BFloat16) return bfloat16_bits_to_float(s);
  else {
    static_assert(std::is_floating_point_v<storage_t<D>>,
                  "a floating dtype stored as bits needs its decoding here");
    return s;
  }
}
template <DType D>
std::int64_t integer_value(storage_t<D> s) {
  if constexpr (dtype_kind<D>() == DTypeKind::Bool) return s != 0 ? 1 : 0;
  else return s;
}

}  // namespace

double load_as_double(const void* base, DType dtype, std::size_t index) {
  return visit_dtype(dtype, [&](auto row) -> double {
    constexpr DType D = row.value;
    const storage_t<D> s = load<storage_t<D>>(base, index);
    if constexpr (dtype_kind<D>() == DTypeKind::Floating) return floating_value<D>(s);
    else return static_cast<double>(integer_value<D>(s));
  });
}

std::int64_t load_as_int64(const void* base, DType dtype, std::size_t index) {
  return visit_dtype(dtype, [&](auto row) -> std::int64_t {
    constexpr DType D = row.value;
    const storage_t<D> s = load<storage_t<D>>(base, index);
    if constexpr (dtype_kind<D>() == DTypeKind::Floating) return truncate_to_int64(floating_value<D>(s));
    else return integer_value<D>(s);
  });
}

}  // namespace detail
}  // namespace shmdist
