// Shape validation shared by the Tensor constructors and factories.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <shmdist/tensor.hpp>

namespace shmdist::detail {

// "[2, -3]": a shape as users wrote it, for error messages.
std::string shape_text(const std::vector<std::int64_t>& sizes);

// The element count of `sizes`, after checking every size is >= 0 and that neither the count
// (int64) nor the byte count (size_t) overflows. Throws InvalidArgument naming `caller`.
std::int64_t checked_numel(const std::vector<std::int64_t>& sizes, DType dtype,
                           std::string_view caller);

}  // namespace shmdist::detail
