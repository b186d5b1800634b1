// Internal helpers shared by the tensor layer's files.
#pragma once

#include <string_view>

#include <shmdist/tensor.hpp>

namespace shmdist::detail {

// Returns `dtype` if it is one of the ten enumerators; otherwise throws InvalidArgument naming
// `caller`. Needed because a DType can be forged with static_cast from any byte.
DType checked_dtype(DType dtype, std::string_view caller);

}  // namespace shmdist::detail
