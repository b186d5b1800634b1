// Helpers of the collective tests: reproducible inputs per (seed, rank) that every rank can
// recompute, and a sequential reference for reductions written independently of
// lib/coll/reduce.cpp (it widens through the tensor layer's conversions, accumulates in
// float32 for float16/bfloat16/float32, float64 for float64, int64 for integers, which wraps
// like the narrow type since truncation commutes with +, *, min, max and bit operations).
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include <shmdist/shmdist.hpp>

#include "p2p/p2p_support.hpp"
#include "support/job.hpp"

namespace shmdist::test::coll {

using p2p::splitmix64;

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> d{DType::Bool,  DType::UInt8,   DType::Int8,
                                    DType::Int16, DType::Int32,   DType::Int64,
                                    DType::Float16, DType::BFloat16, DType::Float32,
                                    DType::Float64};
  return d;
}
inline const std::vector<ReduceOp>& all_ops() {
  static const std::vector<ReduceOp> o{ReduceOp::SUM, ReduceOp::AVG,  ReduceOp::PRODUCT,
                                       ReduceOp::MIN, ReduceOp::MAX,  ReduceOp::BAND,
                                       ReduceOp::BOR, ReduceOp::BXOR};
  return o;
}
inline bool is_floating(DType d) {
  return d == DType::Float16 || d == DType::BFloat16 || d == DType::Float32 ||
         d == DType::Float64;
}
inline bool defined_for(ReduceOp op, DType d) {
  const bool bitwise = op == ReduceOp::BAND || op == ReduceOp::BOR || op == ReduceOp::BXOR;
  if (bitwise) return !is_floating(d);
  if (op == ReduceOp::AVG) return is_floating(d);
  return true;
}

// Rank `rank`'s input of `n` elements for `seed`. Floating values are multiples of 1/37 in
// [-27, 27] (inexact sums, so the order matters); PRODUCT gets values near 1 so that
// products stay finite; integers use their full width.
inline Tensor make_input(std::uint64_t seed, int rank, std::int64_t n, DType dtype, ReduceOp op) {
  if (is_floating(dtype)) {
    Tensor t = empty({n}, kFloat64);
    auto* p = t.data<double>();
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint64_t h = splitmix64(seed * 1000003 + rank * 7919 + i);
      p[i] = op == ReduceOp::PRODUCT ? 1.0 + static_cast<double>(h % 64) / 256.0 - 0.125
                                     : (static_cast<double>(h % 2001) - 1000.0) / 37.0;
    }
    return t.to(dtype);
  }
  Tensor t = empty({n}, kInt64);
  auto* p = t.data<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t h = splitmix64(seed * 1000003 + rank * 7919 + i);
    p[i] = dtype == DType::Bool ? static_cast<std::int64_t>(h & 1) : static_cast<std::int64_t>(h);
  }
  return t.to(dtype);
}

// The reduction of `inputs` in order, element by element.
inline Tensor reference_reduce(const std::vector<Tensor>& inputs, ReduceOp op, DType dtype) {
  const std::int64_t n = inputs.at(0).numel();
  const int k = static_cast<int>(inputs.size());
  if (is_floating(dtype)) {
    if (dtype == DType::Float64) {
      Tensor out = empty({n}, kFloat64);
      for (std::int64_t i = 0; i < n; ++i) {
        double acc = inputs[0].data<double>()[i];
        for (int r = 1; r < k; ++r) {
          const double x = inputs[r].data<double>()[i];
          if (op == ReduceOp::SUM || op == ReduceOp::AVG) acc = acc + x;
          else if (op == ReduceOp::PRODUCT) acc = acc * x;
          else if (op == ReduceOp::MIN) acc = x < acc ? x : acc;
          else acc = acc < x ? x : acc;
        }
        if (op == ReduceOp::AVG) acc = acc / k;
        out.data<double>()[i] = acc;
      }
      return out;
    }
    std::vector<Tensor> wide;
    for (const Tensor& t : inputs) wide.push_back(t.to(kFloat32));
    Tensor out = empty({n}, kFloat32);
    for (std::int64_t i = 0; i < n; ++i) {
      float acc = wide[0].data<float>()[i];
      for (int r = 1; r < k; ++r) {
        const float x = wide[r].data<float>()[i];
        if (op == ReduceOp::SUM || op == ReduceOp::AVG) acc = acc + x;
        else if (op == ReduceOp::PRODUCT) acc = acc * x;
        else if (op == ReduceOp::MIN) acc = x < acc ? x : acc;
        else acc = acc < x ? x : acc;
      }
      if (op == ReduceOp::AVG) acc = acc / static_cast<float>(k);
      out.data<float>()[i] = acc;
    }
    return out.to(dtype);  // rounded once
  }
  std::vector<Tensor> wide;
  for (const Tensor& t : inputs) wide.push_back(t.to(kInt64));
  Tensor out = empty({n}, kInt64);
  const bool is_bool = dtype == DType::Bool;
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint64_t acc = static_cast<std::uint64_t>(wide[0].data<std::int64_t>()[i]);
    for (int r = 1; r < k; ++r) {
      const std::uint64_t x = static_cast<std::uint64_t>(wide[r].data<std::int64_t>()[i]);
      const auto sa = static_cast<std::int64_t>(acc), sx = static_cast<std::int64_t>(x);
      switch (op) {
        case ReduceOp::SUM: acc = is_bool ? (acc | x) : acc + x; break;
        case ReduceOp::PRODUCT: acc = is_bool ? (acc & x) : acc * x; break;
        case ReduceOp::MIN: acc = static_cast<std::uint64_t>(sx < sa ? sx : sa); break;
        case ReduceOp::MAX: acc = static_cast<std::uint64_t>(sa < sx ? sx : sa); break;
        case ReduceOp::BAND: acc &= x; break;
        case ReduceOp::BOR: acc |= x; break;
        case ReduceOp::BXOR: acc ^= x; break;
        case ReduceOp::AVG: break;
      }
    }
    out.data<std::int64_t>()[i] = static_cast<std::int64_t>(acc);
  }
  return out.to(dtype);
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

// Throws (failing the rank) unless `got` holds `want`'s bytes.
inline void require_same(const Tensor& got, const Tensor& want, const std::string& what) {
  if (same_bytes(got, want)) return;
  std::int64_t at = -1;
  const auto* g = static_cast<const unsigned char*>(got.data_ptr());
  const auto* w = static_cast<const unsigned char*>(want.data_ptr());
  if (got.nbytes() == want.nbytes())
    for (std::size_t i = 0; i < got.nbytes(); ++i)
      if (g[i] != w[i]) {
        at = static_cast<std::int64_t>(i / element_size(got.dtype()));
        break;
      }
  throw std::runtime_error(what + ": result differs from the sequential reference" +
                           (at >= 0 ? " first at element " + std::to_string(at) : std::string()) +
                           " (" + std::string(dtype_name(got.dtype())) + ", " +
                           std::to_string(got.numel()) + " elements)");
}

inline std::string label(const char* call, ReduceOp op, DType d, std::int64_t n) {
  return std::string(call) + " op " + std::to_string(static_cast<int>(op)) + " " +
         std::string(dtype_name(d)) + " x" + std::to_string(n);
}

}  // namespace shmdist::test::coll
