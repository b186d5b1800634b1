// Element-wise reductions with one fixed evaluation order: element i of the result is
// ((x0[i] op x1[i]) op x2[i]) ... over the inputs in the order given (group-rank order), so
// every rank that reduces the same inputs gets bitwise the same result, whatever algorithm
// moved the bytes. float16 and bfloat16 accumulate in float32 and round once at the end; AVG
// is the SUM divided by the divisor (floating dtypes only); integer SUM and PRODUCT wrap
// around as in torch; bool SUM/MAX/BOR are or, PRODUCT/MIN/BAND are and, BXOR is xor.
// MIN/MAX on floating values propagate NaN (the first NaN in input order wins).
//
// SUM, AVG, PRODUCT, MIN and MAX on the floating dtypes run vector kernels chosen at run time
// for the CPU (coll/reduce_simd.hpp) that compute bitwise what the scalar path computes;
// reduce_in_order_scalar is that path, the reference the kernels are tested against.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>

#include <shmdist/distributed.hpp>

namespace shmdist::coll {

const char* reduce_op_name(ReduceOp op);

// Why `op` has no meaning for `dtype` (AVG on an integer, BXOR on a float, an unknown op);
// nullopt when it has.
std::optional<std::string> unsupported(ReduceOp op, DType dtype);

// out[i] = inputs[0][i] op inputs[1][i] op ... for i < count, evaluated left to right. `out`
// may be one of the inputs (each block of elements is read completely before it is written).
// `divisor` is the group size, used by AVG. The op must be supported for the dtype.
void reduce_in_order(ReduceOp op, DType dtype, std::span<const std::byte* const> inputs,
                     std::byte* out, std::size_t count, int divisor);

// reduce_in_order without the vector kernels: the reference (tests, benchmarks).
void reduce_in_order_scalar(ReduceOp op, DType dtype, std::span<const std::byte* const> inputs,
                            std::byte* out, std::size_t count, int divisor);

}  // namespace shmdist::coll
