// The reduction kernels: one template per (dtype, op), blocks of elements accumulated in a
// wide type on the stack so that halves round once and the inner loops vectorize.

#include "coll/reduce.hpp"
#include "coll/reduce_simd.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "tensor/dtype_check.hpp"
#include "tensor/element_io.hpp"
#include "tensor/half_bits.hpp"

namespace shmdist::coll {
namespace {

using detail::load;
using detail::storage_t;
using detail::store;

template <DType D>
inline constexpr bool is_floating_v = detail::dtype_kind<D>() == detail::DTypeKind::Floating;

// How elements of D are widened for accumulation and narrowed back (rounded once).
template <DType D>
struct Accum {
  using S = storage_t<D>;
  static_assert(detail::dtype_kind<D>() != detail::DTypeKind::Floating ||
                    std::is_floating_point_v<S>,
                "a floating dtype stored as bits needs an Accum specialization (how it widens "
                "and narrows)");
  using A = S;
  static A widen(S s) { return s; }
  static S narrow(A a) { return a; }
};
template <>
struct Accum<DType::Bool> {
  using S = std::uint8_t;
  using A = std::uint8_t;
  static A widen(S s) { return s != 0; }
  static S narrow(A a) { return a; }
};
template <>
struct Accum<DType::Float16> {
  using S = std::uint16_t;
  using A = float;
  static A widen(S s) { return detail::half_bits_to_float(s); }
  static S narrow(A a) { return detail::float_to_half_bits(a); }
};
template <>
struct Accum<DType::BFloat16> {
  using S = std::uint16_t;
  using A = float;
  static A widen(S s) { return detail::bfloat16_bits_to_float(s); }
  static S narrow(A a) { return detail::float_to_bfloat16_bits(a); }
};

// Integer arithmetic goes through uint64 so that overflow wraps (no undefined behaviour);
// converting back to a signed type is modular in C++20.
//
// Floating + and * with two NaN operands return one of them, and which one the hardware takes
// depends on operand order, which the compiler is free to swap: so when `a` (the earlier
// inputs) is NaN, b is replaced by a, and a op a is a, quieted. The first NaN in input order
// wins, as in MIN/MAX, whatever code the compiler or the vector kernels emit.
template <class A>
A wrap_add(A a, A b) {
  if constexpr (std::is_integral_v<A>)
    return static_cast<A>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
  else
    return a + (std::isnan(a) ? a : b);
}
template <class A>
A wrap_mul(A a, A b) {
  if constexpr (std::is_integral_v<A>)
    return static_cast<A>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
  else
    return a * (std::isnan(a) ? a : b);
}
template <class A>
A min_of(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return b < a ? b : a;
}
template <class A>
A max_of(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return a < b ? b : a;
}

template <DType D, ReduceOp Op>
typename Accum<D>::A combine(typename Accum<D>::A a, typename Accum<D>::A b) {
  using A = typename Accum<D>::A;
  if constexpr (D == DType::Bool) {
    if constexpr (Op == ReduceOp::SUM || Op == ReduceOp::MAX || Op == ReduceOp::BOR)
      return static_cast<A>(a | b);
    else if constexpr (Op == ReduceOp::BXOR)
      return static_cast<A>(a ^ b);
    else
      return static_cast<A>(a & b);  // PRODUCT, MIN, BAND
  } else if constexpr (Op == ReduceOp::SUM || Op == ReduceOp::AVG) {
    return wrap_add(a, b);
  } else if constexpr (Op == ReduceOp::PRODUCT) {
    return wrap_mul(a, b);
  } else if constexpr (Op == ReduceOp::MIN) {
    return min_of(a, b);
  } else if constexpr (Op == ReduceOp::MAX) {
    return max_of(a, b);
  } else if constexpr (std::is_integral_v<A>) {
    if constexpr (Op == ReduceOp::BAND) return static_cast<A>(a & b);
    if constexpr (Op == ReduceOp::BOR) return static_cast<A>(a | b);
    return static_cast<A>(a ^ b);
  } else {
    return a;  // unreachable: unsupported() refuses bitwise ops on floating dtypes
  }
}

template <DType D, ReduceOp Op>
void reduce_typed(std::span<const std::byte* const> inputs, std::byte* out, std::size_t count,
                  int divisor) {
  using S = typename Accum<D>::S;
  using A = typename Accum<D>::A;
  constexpr std::size_t kBlock = 512;
  A acc[kBlock];
  for (std::size_t base = 0; base < count; base += kBlock) {
    const std::size_t m = std::min(kBlock, count - base);
    const std::byte* first = inputs[0];
    for (std::size_t i = 0; i < m; ++i) acc[i] = Accum<D>::widen(load<S>(first, base + i));
    for (std::size_t r = 1; r < inputs.size(); ++r) {
      const std::byte* in = inputs[r];
      for (std::size_t i = 0; i < m; ++i)
        acc[i] = combine<D, Op>(acc[i], Accum<D>::widen(load<S>(in, base + i)));
    }
    if constexpr (Op == ReduceOp::AVG && is_floating_v<D>) {
      const A n = static_cast<A>(divisor);
      for (std::size_t i = 0; i < m; ++i) acc[i] = acc[i] / n;
    }
    for (std::size_t i = 0; i < m; ++i) store<S>(out, base + i, Accum<D>::narrow(acc[i]));
  }
}

// Two inputs, neither overlapping the output (the common two-member case on the lane): one
// pass, no accumulator block, and nothing for the vectorizer to check at run time.
template <DType D, ReduceOp Op>
void reduce_pair(const std::byte* __restrict a, const std::byte* __restrict b,
                 std::byte* __restrict out, std::size_t count, int divisor) {
  using S = typename Accum<D>::S;
  using A = typename Accum<D>::A;
  [[maybe_unused]] const A n = static_cast<A>(divisor);
  for (std::size_t i = 0; i < count; ++i) {
    A x = combine<D, Op>(Accum<D>::widen(load<S>(a, i)), Accum<D>::widen(load<S>(b, i)));
    if constexpr (Op == ReduceOp::AVG && is_floating_v<D>) x = x / n;
    store<S>(out, i, Accum<D>::narrow(x));
  }
}

bool disjoint(const std::byte* p, const std::byte* q, std::size_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(q);
  return a + bytes <= b || b + bytes <= a;
}

template <DType D, ReduceOp Op>
void reduce_any(std::span<const std::byte* const> inputs, std::byte* out, std::size_t count,
                int divisor) {
  const std::size_t bytes = count * sizeof(typename Accum<D>::S);
  if (inputs.size() == 2 && disjoint(inputs[0], out, bytes) && disjoint(inputs[1], out, bytes))
    return reduce_pair<D, Op>(inputs[0], inputs[1], out, count, divisor);
  reduce_typed<D, Op>(inputs, out, count, divisor);
}

template <DType D>
void reduce_dtype(ReduceOp op, std::span<const std::byte* const> inputs, std::byte* out,
                  std::size_t count, int divisor) {
  switch (op) {
    case ReduceOp::SUM: return reduce_any<D, ReduceOp::SUM>(inputs, out, count, divisor);
    case ReduceOp::AVG: return reduce_any<D, ReduceOp::AVG>(inputs, out, count, divisor);
    case ReduceOp::PRODUCT: return reduce_any<D, ReduceOp::PRODUCT>(inputs, out, count, divisor);
    case ReduceOp::MIN: return reduce_any<D, ReduceOp::MIN>(inputs, out, count, divisor);
    case ReduceOp::MAX: return reduce_any<D, ReduceOp::MAX>(inputs, out, count, divisor);
    case ReduceOp::BAND: return reduce_any<D, ReduceOp::BAND>(inputs, out, count, divisor);
    case ReduceOp::BOR: return reduce_any<D, ReduceOp::BOR>(inputs, out, count, divisor);
    case ReduceOp::BXOR: return reduce_any<D, ReduceOp::BXOR>(inputs, out, count, divisor);
  }
}

bool floating(DType d) { return is_floating_point(d); }
bool is_half(DType d) { return d == DType::Float16 || d == DType::BFloat16; }

// Inputs of at most this many bytes (float32/float64) skip the vector kernels (reduce_in_order).
constexpr std::size_t kScalarMaxBytes = 64;

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
  }
  return "an unknown ReduceOp";
}

std::optional<std::string> unsupported(ReduceOp op, DType dtype) {
  const auto code = static_cast<int>(op);
  if (code < static_cast<int>(ReduceOp::SUM) || code > static_cast<int>(ReduceOp::BXOR))
    return "ReduceOp value " + std::to_string(code) +
           " is not one of SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR";
  const bool bitwise = op == ReduceOp::BAND || op == ReduceOp::BOR || op == ReduceOp::BXOR;
  if (bitwise && floating(dtype))
    return std::string("ReduceOp::") + reduce_op_name(op) + " is defined on integer and bool "
           "tensors only, not on " + std::string(dtype_name(dtype)) +
           "; reduce the bit patterns as an integer tensor of the same width instead";
  if (op == ReduceOp::AVG && !floating(dtype))
    return "ReduceOp::AVG is defined on floating tensors only, not on " +
           std::string(dtype_name(dtype)) + "; use SUM and divide, or reduce a floating copy";
  return std::nullopt;
}

void reduce_in_order(ReduceOp op, DType dtype, std::span<const std::byte* const> inputs,
                     std::byte* out, std::size_t count, int divisor) {
  if (inputs.empty() || count == 0) return;
  const std::size_t bytes = count * element_size(dtype);
  // A few float32/float64 elements (the small all_reduce of an inference loop) take the
  // scalar path: there the vector path's fixed cost (has_kernel, the overlap test, Highway's
  // dispatch, the kernel's setup and tail) is about 230 instructions for a 16 B float32 pair
  // by callgrind, the scalar loop a few per element. Not float16/bfloat16: their scalar
  // conversions cost tens of instructions per element. Same bits either way.
  if (bytes <= kScalarMaxBytes && !is_half(dtype))
    return reduce_in_order_scalar(op, dtype, inputs, out, count, divisor);
  // The vector kernels load a vector of every input before they store that vector of `out`:
  // `out` may be an input, but must not overlap one partly (the scalar path's blocks cope).
  if (simd::has_kernel(op, dtype)) {
    const bool fits = std::all_of(inputs.begin(), inputs.end(), [&](const std::byte* in) {
      return in == out || disjoint(in, out, bytes);
    });
    if (fits) return simd::reduce(op, dtype, inputs, out, count, divisor);
  }
  reduce_in_order_scalar(op, dtype, inputs, out, count, divisor);
}

void reduce_in_order_scalar(ReduceOp op, DType dtype, std::span<const std::byte* const> inputs,
                            std::byte* out, std::size_t count, int divisor) {
  if (inputs.empty() || count == 0) return;
  detail::visit_dtype(dtype, [&](auto row) {
    reduce_dtype<row.value>(op, inputs, out, count, divisor);
  });
}

}  // namespace shmdist::coll
