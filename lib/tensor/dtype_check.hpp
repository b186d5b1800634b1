// Internal helpers over the dtype table (shmdist/dtype_table.hpp), for lib/ (the tensor
// layer and the layers above it).
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include <shmdist/tensor.hpp>

namespace shmdist::detail {

// Returns `dtype` if it is one of the table's enumerators; otherwise throws InvalidArgument
// naming `caller`. Needed because a DType can be forged with static_cast from any byte.
DType checked_dtype(DType dtype, std::string_view caller);

// "peer rank N sent dtype code C which this build does not know: ...": what a frame or a
// fingerprint with a dtype code past this build's table means (a newer build), not corruption.
// `rank` is the peer's global rank.
std::string unknown_dtype_text(int rank, unsigned code);

// The kind column of shmdist/dtype_table.hpp.
enum class DTypeKind { Bool, Integer, Floating };

// The kind of a dtype (one of the table's rows), at compile time.
template <DType D>
constexpr DTypeKind dtype_kind() {
#define SHMDIST_DTYPE_KIND(name, code, element, storage, torch_name, kind, ...) \
  if constexpr (D == DType::name) return DTypeKind::kind;
  SHMDIST_DTYPES(SHMDIST_DTYPE_KIND)
#undef SHMDIST_DTYPE_KIND
  return DTypeKind::Bool;  // not reached: D is a row
}

// Calls f(std::integral_constant<DType, D>{}) for the row D == dtype, through one switch
// expanded from the table: the one place a run-time dtype becomes a compile-time one.
// The switch has no default: a row without a case cannot exist, and -Wswitch (an error with
// SHMDIST_WERROR) flags any hand-written switch over DType that misses one. A value that is
// no row (forged with static_cast) throws InvalidArgument.
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
#define SHMDIST_DTYPE_VISIT(name, ...) \
  case DType::name: return f(std::integral_constant<DType, DType::name>{});
    SHMDIST_DTYPES(SHMDIST_DTYPE_VISIT)
#undef SHMDIST_DTYPE_VISIT
  }
  checked_dtype(dtype, "visit_dtype");  // throws: no row has this value
  __builtin_unreachable();
}

}  // namespace shmdist::detail
