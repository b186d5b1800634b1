// The vector reduction kernels (reduce_simd.hpp says what they promise). Highway compiles the
// code between HWY_BEFORE_NAMESPACE and HWY_AFTER_NAMESPACE once per target (foreach_target.h
// includes this file again for each); HWY_DYNAMIC_DISPATCH calls the best one the CPU runs.
//
// One loop for every (dtype, op): per vector of elements, the first input widened to the
// accumulator type (float32 for the halves), each further input widened and combined in input
// order, AVG's division, one narrowing store. The last partial vector goes through a
// zero-padded buffer, so it runs the same code. Everything stays in registers, so unlike the
// scalar path there is no accumulator block; `out` equal to an input is fine because a vector
// of every input is loaded before that vector of `out` is stored.
#include "coll/reduce_simd.hpp"

#include <algorithm>
#include <cstring>

#if SHMDIST_HAVE_HWY

// Every target Highway can build here, the portable fallback included (EMU128, or the
// one-lane SCALAR where Highway deems EMU128 broken, as with GCC 12). By default Highway
// leaves out the targets the baseline already beats; the tests compare the fallback too.
#ifndef HWY_COMPILE_ALL_ATTAINABLE
#define HWY_COMPILE_ALL_ATTAINABLE
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "coll/reduce_simd.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace shmdist::coll::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// How a dtype's elements are loaded into accumulator vectors (tag D) and stored back.
// float32 and float64 are themselves; bfloat16 (and float16 below AVX2) go through 32-bit
// integer lanes with the bit recipes of tensor/half_bits.hpp, step for step.
//
// kWhichNaN: whether the result shows which NaN an addition or multiplication propagated
// (its sign or payload). Not for bfloat16, whose every NaN is stored as 0x7fc0: there the
// kernels skip the select that makes the first NaN win (the scalar path keeps it; same bits).
struct F64 {
  using D = hn::ScalableTag<double>;
  static constexpr std::size_t kBytes = 8;
  static constexpr bool kWhichNaN = true;
  static hn::Vec<D> load(D d, const std::byte* p) {
    return hn::LoadU(d, reinterpret_cast<const double*>(p));
  }
  static void store(D d, hn::Vec<D> v, std::byte* p) {
    hn::StoreU(v, d, reinterpret_cast<double*>(p));
  }
};
struct F32 {
  using D = hn::ScalableTag<float>;
  static constexpr std::size_t kBytes = 4;
  static constexpr bool kWhichNaN = true;
  static hn::Vec<D> load(D d, const std::byte* p) {
    return hn::LoadU(d, reinterpret_cast<const float*>(p));
  }
  static void store(D d, hn::Vec<D> v, std::byte* p) {
    hn::StoreU(v, d, reinterpret_cast<float*>(p));
  }
};

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using DU16 = hn::Rebind<std::uint16_t, DF>;  // as many 16-bit lanes as DF has floats
using VU = hn::Vec<DU>;

HWY_INLINE VU load_u16(const std::byte* p) {
  return hn::PromoteTo(DU(), hn::LoadU(DU16(), reinterpret_cast<const std::uint16_t*>(p)));
}
// Each lane holds a value below 2^16, so the saturating demotion only truncates.
HWY_INLINE void store_u16(VU v, std::byte* p) {
  hn::StoreU(hn::DemoteTo(DU16(), hn::BitCast(DI(), v)), DU16(),
             reinterpret_cast<std::uint16_t*>(p));
}
HWY_INLINE VU k(std::uint32_t c) { return hn::Set(DU(), c); }
// a > b for lanes below 2^31 (Highway 1.0 compares signed 32-bit lanes on every target).
HWY_INLINE hn::Mask<DU> greater(VU a, VU b) {
  return hn::RebindMask(DU(), hn::Gt(hn::BitCast(DI(), a), hn::BitCast(DI(), b)));
}
// shift_right_round_even: `value >> shift` rounded to nearest, ties to even, shift in [1, 31].
HWY_INLINE VU shift_right_round_even(VU value, VU shift) {
  const VU one = k(1);
  const VU kept = hn::Shr(value, shift);
  const VU rest = hn::And(value, hn::Sub(hn::Shl(one, shift), one));
  const VU half = hn::Shl(one, hn::Sub(shift, one));
  const auto up = hn::Or(greater(rest, half),
                         hn::And(hn::Eq(rest, half), hn::Eq(hn::And(kept, one), one)));
  return hn::Add(kept, hn::IfThenElseZero(up, one));
}

struct BF16 {
  using D = DF;
  static constexpr std::size_t kBytes = 2;
  static constexpr bool kWhichNaN = false;
  static hn::Vec<D> load(D d, const std::byte* p) {
    return hn::BitCast(d, hn::ShiftLeft<16>(load_u16(p)));
  }
  // float_to_bfloat16_bits: round to nearest even by adding 0x7fff plus the kept lsb; every
  // NaN becomes 0x7fc0.
  static void store(D d, hn::Vec<D> v, std::byte* p) {
    const VU u = hn::BitCast(DU(), v);
    const auto nan = hn::RebindMask(DU(), hn::IsNaN(v));
    (void)d;
    const VU bias = hn::Add(k(0x7fffu), hn::And(hn::ShiftRight<16>(u), k(1)));
    const VU rounded = hn::ShiftRight<16>(hn::Add(u, bias));
    store_u16(hn::IfThenElse(nan, k(0x7fc0u), rounded), p);
  }
};

struct F16 {
  using D = DF;
  static constexpr std::size_t kBytes = 2;
  static constexpr bool kWhichNaN = true;  // the sign of a float16 NaN stays
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  // Where Highway's float16 conversions are F16C's (AVX2 and better): vcvtph2ps widens
  // exactly as half_bits_to_float does (subnormals exact, NaNs quieted, payload kept), and
  // vcvtps2ph rounds to nearest even by its immediate (not MXCSR) as float_to_half_bits does,
  // but keeps NaN payloads where c10 writes sign|0x7e00: NaN lanes are replaced by the quiet
  // NaN of the same sign with no payload first, which converts to exactly that.
  using D16 = hn::Rebind<hwy::float16_t, DF>;
  static hn::Vec<D> load(D d, const std::byte* p) {
    return hn::PromoteTo(d, hn::LoadU(D16(), reinterpret_cast<const hwy::float16_t*>(p)));
  }
  static void store(D d, hn::Vec<D> v, std::byte* p) {
    const VU u = hn::BitCast(DU(), v);
    const VU plain_nan = hn::Or(hn::And(u, k(0x80000000u)), k(0x7fc00000u));
    const auto w = hn::IfThenElse(hn::IsNaN(v), hn::BitCast(d, plain_nan), v);
    hn::StoreU(hn::DemoteTo(D16(), w), D16(), reinterpret_cast<hwy::float16_t*>(p));
  }
#else
  // half_bits_to_float: rebias normals; subnormals as mantissa * 2^-24 (exact); Inf/NaN with
  // the quiet bit set on NaNs, as c10's software conversion does.
  static hn::Vec<D> load(D d, const std::byte* p) {
    const VU h = load_u16(p);
    const VU sign = hn::ShiftLeft<16>(hn::And(h, k(0x8000u)));
    const VU exponent = hn::And(hn::ShiftRight<10>(h), k(0x1fu));
    const VU mantissa = hn::And(h, k(0x3ffu));
    const VU normal = hn::Or(hn::ShiftLeft<23>(hn::Add(exponent, k(112))),
                             hn::ShiftLeft<13>(mantissa));
    const VU quiet = hn::IfThenElseZero(hn::Ne(mantissa, hn::Zero(DU())), k(0x400000u));
    const VU inf_nan = hn::Or(hn::Or(k(0x7f800000u), quiet), hn::ShiftLeft<13>(mantissa));
    const VU subnormal = hn::BitCast(
        DU(), hn::Mul(hn::ConvertTo(d, hn::BitCast(DI(), mantissa)), hn::Set(d, 0x1p-24f)));
    const VU magnitude =
        hn::IfThenElse(hn::Eq(exponent, k(0x1f)), inf_nan,
                       hn::IfThenElse(hn::Eq(exponent, hn::Zero(DU())), subnormal, normal));
    return hn::BitCast(d, hn::Or(sign, magnitude));
  }
  // float_to_half_bits, its cases as selects in the same order.
  static void store(D d, hn::Vec<D> v, std::byte* p) {
    (void)d;
    const VU u = hn::BitCast(DU(), v);
    const VU sign = hn::And(hn::ShiftRight<16>(u), k(0x8000u));
    const VU magnitude = hn::And(u, k(0x7fffffffu));
    const VU normal = shift_right_round_even(hn::Sub(magnitude, k(112u << 23)), k(13));
    // The subnormal case's shift, 126 - exponent, is in [14, 24] for the magnitudes that
    // take it; clamping keeps the other lanes' shifts in range too.
    const VU exponent = hn::ShiftRight<23>(magnitude);
    const VU clamped = hn::BitCast(
        DU(), hn::Min(hn::Max(hn::BitCast(DI(), exponent), hn::Set(DI(), 102)), hn::Set(DI(), 112)));
    const VU significand = hn::Or(hn::And(magnitude, k(0x7fffffu)), k(0x800000u));
    const VU subnormal = shift_right_round_even(significand, hn::Sub(k(126), clamped));
    const VU result = hn::IfThenElse(
        greater(magnitude, k(0x7f800000u)), k(0x7e00u),                 // NaN
        hn::IfThenElse(
            greater(magnitude, k(0x477ff000u - 1)), k(0x7c00u),         // >= 65520: Inf
            hn::IfThenElse(
                greater(magnitude, k(0x38800000u - 1)), normal,         // >= 2^-14
                hn::IfThenElse(greater(magnitude, k(0x33000000u)), subnormal,  // > 2^-25
                               hn::Zero(DU())))));
    store_u16(hn::Or(sign, result), p);
  }
#endif
};

// combine<D, Op> in reduce.cpp: SUM/PRODUCT with a NaN `a` compute a op a (a, quieted), so
// that the first NaN in input order wins whichever operand order the compiler picks; MIN/MAX take b when a is not NaN and b is, or when b is
// strictly smaller (larger); otherwise a (equal values, -0.0 against 0.0, keep a).
template <ReduceOp Op, bool kWhichNaN, class V>
HWY_INLINE V combine(V a, V b) {
  if constexpr (kWhichNaN && (Op == ReduceOp::SUM || Op == ReduceOp::AVG ||
                              Op == ReduceOp::PRODUCT))
    b = hn::IfThenElse(hn::IsNaN(a), a, b);  // wrap_add, wrap_mul: a NaN `a` wins
  if constexpr (Op == ReduceOp::SUM || Op == ReduceOp::AVG) {
    return hn::Add(a, b);
  } else if constexpr (Op == ReduceOp::PRODUCT) {
    return hn::Mul(a, b);
  } else {
    const auto b_nan_first = hn::AndNot(hn::IsNaN(a), hn::IsNaN(b));
    const auto b_wins = Op == ReduceOp::MIN ? hn::Lt(b, a) : hn::Lt(a, b);
    return hn::IfThenElse(hn::Or(b_nan_first, b_wins), b, a);
  }
}

template <class C, ReduceOp Op>
void reduce_typed(const std::byte* const* inputs, std::size_t n_inputs, std::byte* out,
                  std::size_t count, int divisor) {
  using D = typename C::D;
  using T = hn::TFromD<D>;
  const D d;
  const std::size_t lanes = hn::Lanes(d);
  const std::size_t step = lanes * C::kBytes;
  [[maybe_unused]] const auto n = hn::Set(d, static_cast<T>(divisor));
  auto one_vector = [&](auto&& input_at) {
    auto acc = C::load(d, input_at(0));
    for (std::size_t r = 1; r < n_inputs; ++r)
      acc = combine<Op, C::kWhichNaN>(acc, C::load(d, input_at(r)));
    if constexpr (Op == ReduceOp::AVG) acc = hn::Div(acc, n);
    return acc;
  };
  std::size_t off = 0;
  const std::size_t whole = count / lanes * step;
  if (n_inputs == 2) {
    // Two members, the common case: the pointers in registers (`out` is bytes, so the
    // compiler must assume a store to it may change inputs[]) and two vectors per turn, both
    // loaded before either is stored.
    const std::byte* const a = inputs[0];
    const std::byte* const b = inputs[1];
    auto pair = [&](std::size_t at) {
      auto x = combine<Op, C::kWhichNaN>(C::load(d, a + at), C::load(d, b + at));
      if constexpr (Op == ReduceOp::AVG) x = hn::Div(x, n);
      return x;
    };
    for (; off + 2 * step <= whole; off += 2 * step) {
      const auto x0 = pair(off), x1 = pair(off + step);
      C::store(d, x0, out + off);
      C::store(d, x1, out + off + step);
    }
  }
  for (; off < whole; off += step)
    C::store(d, one_vector([&](std::size_t r) { return inputs[r] + off; }), out + off);
  const std::size_t rest = count * C::kBytes - whole;
  if (rest == 0) return;
  // The tail: each input copied into a zero-padded vector's worth of bytes (the padding
  // lanes' results are dropped).
  HWY_ALIGN std::byte in_buf[HWY_MAX_BYTES] = {};
  HWY_ALIGN std::byte out_buf[HWY_MAX_BYTES];
  const auto v = one_vector([&](std::size_t r) {
    std::memcpy(in_buf, inputs[r] + off, rest);
    return static_cast<const std::byte*>(in_buf);
  });
  C::store(d, v, out_buf);
  std::memcpy(out + off, out_buf, rest);
}

template <class C>
void reduce_op(ReduceOp op, const std::byte* const* inputs, std::size_t n_inputs,
               std::byte* out, std::size_t count, int divisor) {
  switch (op) {
    case ReduceOp::SUM: return reduce_typed<C, ReduceOp::SUM>(inputs, n_inputs, out, count, divisor);
    case ReduceOp::AVG: return reduce_typed<C, ReduceOp::AVG>(inputs, n_inputs, out, count, divisor);
    case ReduceOp::PRODUCT:
      return reduce_typed<C, ReduceOp::PRODUCT>(inputs, n_inputs, out, count, divisor);
    case ReduceOp::MIN: return reduce_typed<C, ReduceOp::MIN>(inputs, n_inputs, out, count, divisor);
    case ReduceOp::MAX: return reduce_typed<C, ReduceOp::MAX>(inputs, n_inputs, out, count, divisor);
    default: return;  // has_kernel() is false for the bitwise ops
  }
}

void reduce_floating(ReduceOp op, DType dtype, const std::byte* const* inputs,
                     std::size_t n_inputs, std::byte* out, std::size_t count, int divisor) {
  switch (dtype) {
    case DType::Float64: return reduce_op<F64>(op, inputs, n_inputs, out, count, divisor);
    case DType::Float32: return reduce_op<F32>(op, inputs, n_inputs, out, count, divisor);
    case DType::BFloat16: return reduce_op<BF16>(op, inputs, n_inputs, out, count, divisor);
    case DType::Float16: return reduce_op<F16>(op, inputs, n_inputs, out, count, divisor);
    default: return;  // has_kernel() is false for the others
  }
}

}  // namespace shmdist::coll::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // SHMDIST_HAVE_HWY

#if SHMDIST_HAVE_HWY
#if HWY_ONCE  // the rest once, not per target
namespace shmdist::coll::simd {

HWY_EXPORT(reduce_floating);

bool has_kernel(ReduceOp op, DType dtype) {
  // The dtypes with vector kernels (reduce_floating's switch), all of the table's floating
  // ones today; a new floating dtype runs the scalar path until it gets a kernel.
  const bool floating = dtype == DType::Float16 || dtype == DType::BFloat16 ||
                        dtype == DType::Float32 || dtype == DType::Float64;
  const bool arithmetic = op == ReduceOp::SUM || op == ReduceOp::AVG ||
                          op == ReduceOp::PRODUCT || op == ReduceOp::MIN || op == ReduceOp::MAX;
  return floating && arithmetic;
}

void reduce(ReduceOp op, DType dtype, std::span<const std::byte* const> inputs, std::byte* out,
            std::size_t count, int divisor) {
  if (inputs.empty() || count == 0) return;
  HWY_DYNAMIC_DISPATCH(reduce_floating)(op, dtype, inputs.data(), inputs.size(), out, count,
                                        divisor);
}

std::string target_name() {
  const std::int64_t best = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(best & -best);  // the lowest bit is the best target
}

std::vector<Target> targets() {
  std::vector<Target> all;
  for (std::int64_t id : hwy::SupportedAndGeneratedTargets())
    all.push_back({hwy::TargetName(id), id});
  return all;
}

void pin_target(std::int64_t id) { hwy::SetSupportedTargetsForTest(id); }

}  // namespace shmdist::coll::simd
#endif  // HWY_ONCE

#else  // built without Highway: the scalar path does everything
namespace shmdist::coll::simd {

bool has_kernel(ReduceOp, DType) { return false; }
void reduce(ReduceOp, DType, std::span<const std::byte* const>, std::byte*, std::size_t, int) {}
std::string target_name() { return "none"; }
std::vector<Target> targets() { return {}; }
void pin_target(std::int64_t) {}

}  // namespace shmdist::coll::simd
#endif  // SHMDIST_HAVE_HWY
