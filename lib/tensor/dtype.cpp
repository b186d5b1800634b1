// The dtypes of shmdist/dtype_table.hpp: sizes, torch names, and validation of dtype values
// from untrusted input.
#include <cstdint>
#include <ostream>
#include <string>

#include <shmdist/tensor.hpp>

#include "tensor/dtype_check.hpp"

namespace shmdist {
namespace {

struct DTypeInfo {
  std::size_t size;
  std::string_view name;
  bool floating;
};

// Indexed by the enum's value: the table's rows, whose codes are 0, 1, 2, ... in order.
#define SHMDIST_DTYPE_INFO(name, code, element, storage, torch_name, kind, ...) \
  {sizeof(storage), torch_name, detail::DTypeKind::kind == detail::DTypeKind::Floating},
constexpr DTypeInfo kInfo[] = {SHMDIST_DTYPES(SHMDIST_DTYPE_INFO)};
#undef SHMDIST_DTYPE_INFO
static_assert(std::size(kInfo) == kNumDTypes);

#define SHMDIST_DTYPE_CODE(name, code, ...) code,
constexpr int kCodes[] = {SHMDIST_DTYPES(SHMDIST_DTYPE_CODE)};
#undef SHMDIST_DTYPE_CODE
constexpr bool codes_are_dense() {
  for (int i = 0; i < kNumDTypes; ++i)
    if (kCodes[i] != i) return false;
  return true;
}
static_assert(codes_are_dense(),
              "shmdist/dtype_table.hpp: the rows' codes must be 0, 1, 2, ... in row order "
              "(arrays are indexed by code; append a new dtype with the next code)");

}  // namespace

namespace detail {

DType checked_dtype(DType dtype, std::string_view caller) {
  const auto code = static_cast<unsigned>(dtype);
  if (code < static_cast<unsigned>(kNumDTypes)) return dtype;
  throw InvalidArgument(std::string(caller) + ": expected a dtype code in [0, " +
                        std::to_string(kNumDTypes) + "), found " + std::to_string(code) +
                        "; pass one of the shmdist::DType values (kFloat32, kInt64, ...)");
}

std::string unknown_dtype_text(int rank, unsigned code) {
  return "peer rank " + std::to_string(rank) + " sent dtype code " + std::to_string(code) +
         " which this build does not know (it knows 0.." + std::to_string(kNumDTypes - 1) +
         ", shmdist/dtype_table.hpp): it was built with a newer shmdist; rebuild every rank "
         "from the same version";
}

}  // namespace detail

std::size_t element_size(DType dtype) {
  return kInfo[static_cast<unsigned>(detail::checked_dtype(dtype, "element_size"))].size;
}

std::string_view dtype_name(DType dtype) {
  return kInfo[static_cast<unsigned>(detail::checked_dtype(dtype, "dtype_name"))].name;
}

bool is_floating_point(DType dtype) {
  return kInfo[static_cast<unsigned>(detail::checked_dtype(dtype, "is_floating_point"))].floating;
}

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_name(dtype); }

DType dtype_from_code(unsigned code) {
  if (code < static_cast<unsigned>(kNumDTypes)) return static_cast<DType>(code);
  throw InvalidArgument("dtype_from_code: expected a dtype code in [0, " +
                        std::to_string(kNumDTypes) + ") (see shmdist/dtype_table.hpp), found " +
                        std::to_string(code) +
                        "; the data is corrupt or was written by an incompatible version");
}

}  // namespace shmdist
