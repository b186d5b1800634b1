// Vector kernels for the floating reductions, chosen at run time for the CPU (Google Highway's
// dynamic dispatch: AVX-512, AVX2, SSE4, SSSE3 on x86-64, NEON/SVE on aarch64, and Highway's
// portable fallback). They compute exactly what the scalar path in reduce.cpp computes, bit
// for bit: the same left-to-right order over the inputs, float16 and bfloat16 widened exactly
// to float32 and rounded once at the end (round to nearest even, NaN as c10 writes it:
// bfloat16 0x7fc0, float16 sign|0x7e00), AVG as one IEEE division by the divisor, the first
// NaN in input order winning. The bfloat16 conversions are integer code, like
// half_bits.hpp's, not AVX-512-BF16's vcvtneps2bf16, which flushes subnormals to zero and
// keeps NaN payloads; float16 uses F16C on AVX2 and better, with NaN lanes fixed up.
// tests/coll/test_reduce_kernels.cpp compares every target this CPU runs with the scalar path.
//
// Built without Highway (CMake did not find it), has_kernel() is false everywhere and
// reduce_in_order uses the scalar path: the same bits, only slower.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <shmdist/distributed.hpp>

namespace shmdist::coll::simd {

// Whether reduce() has a kernel for (op, dtype): SUM, AVG, PRODUCT, MIN and MAX on float16,
// bfloat16, float32 and float64, when built with Highway.
bool has_kernel(ReduceOp op, DType dtype);

// reduce_in_order's contract (coll/reduce.hpp), for an (op, dtype) with has_kernel(), except
// that `out` must be either equal to or disjoint from each input: the kernel reads each
// vector of every input before it writes that vector of `out`.
void reduce(ReduceOp op, DType dtype, std::span<const std::byte* const> inputs, std::byte* out,
            std::size_t count, int divisor);

// The target the kernels run on in this process ("AVX3", "AVX2", "NEON", ...), or "none"
// when built without Highway.
std::string target_name();

// For tests and benchmarks only (they change process-wide state, so no collective may run
// meanwhile): every target compiled in and supported by this CPU, best first, the portable
// fallback (EMU128 or SCALAR) last; and pinning one of them (by id), or back to the best
// with id 0.
struct Target {
  std::string name;
  std::int64_t id;
};
std::vector<Target> targets();
void pin_target(std::int64_t id);

}  // namespace shmdist::coll::simd
