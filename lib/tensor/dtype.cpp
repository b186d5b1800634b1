// The ten dtypes: sizes, torch names, and validation of dtype values from untrusted input.
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

// Indexed by the enum's value; the order is the public enum's order.
constexpr DTypeInfo kInfo[kNumDTypes] = {
    {1, "torch.bool", false},    {1, "torch.uint8", false},     {1, "torch.int8", false},
    {2, "torch.int16", false},   {4, "torch.int32", false},     {8, "torch.int64", false},
    {2, "torch.float16", true},  {2, "torch.bfloat16", true},   {4, "torch.float32", true},
    {8, "torch.float64", true},
};

}  // namespace

namespace detail {

DType checked_dtype(DType dtype, std::string_view caller) {
  const auto code = static_cast<unsigned>(dtype);
  if (code < static_cast<unsigned>(kNumDTypes)) return dtype;
  throw InvalidArgument(std::string(caller) + ": expected a dtype code in [0, " +
                        std::to_string(kNumDTypes) + "), found " + std::to_string(code) +
                        "; pass one of the shmdist::DType values (kFloat32, kInt64, ...)");
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
                        std::to_string(kNumDTypes) + ") (Bool=0 ... Float64=9), found " +
                        std::to_string(code) +
                        "; the data is corrupt or was written by an incompatible version");
}

}  // namespace shmdist
