// The public float16 / bfloat16 conversions; the bit-level work is in half_bits.hpp.
#include <shmdist/tensor.hpp>

#include "tensor/half_bits.hpp"

namespace shmdist {

float to_float(Half h) { return detail::half_bits_to_float(h.bits); }
Half half_from_float(float f) { return Half{detail::float_to_half_bits(f)}; }
float to_float(BFloat16 b) { return detail::bfloat16_bits_to_float(b.bits); }
BFloat16 bfloat16_from_float(float f) { return BFloat16{detail::float_to_bfloat16_bits(f)}; }

}  // namespace shmdist
