// Storage types per dtype, and unaligned element loads/stores.
//
// Tensor memory may come from from_blob or straight out of a ring buffer at any offset, so the
// tensor layer never dereferences a typed pointer into it: every access is a fixed-size memcpy,
// which compilers turn into a plain (unaligned) load or store.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <shmdist/tensor.hpp>

#include "tensor/dtype_check.hpp"

namespace shmdist::detail {

// How each dtype's element is held in memory: the table's StorageType column (bool is a byte
// so that any byte value can be read without undefined behaviour: nonzero means true).
template <DType D>
struct storage_of;
#define SHMDIST_DTYPE_STORAGE(name, code, element, storage, ...) \
  template <>                                                    \
  struct storage_of<DType::name> {                               \
    using type = storage;                                        \
  };
SHMDIST_DTYPES(SHMDIST_DTYPE_STORAGE)
#undef SHMDIST_DTYPE_STORAGE

template <DType D>
using storage_t = typename storage_of<D>::type;

template <DType D>
inline constexpr bool is_integer_dtype_v = dtype_kind<D>() == DTypeKind::Integer;

template <class T>
inline T load(const void* base, std::size_t index) {
  T value;
  std::memcpy(&value, static_cast<const unsigned char*>(base) + index * sizeof(T), sizeof(T));
  return value;
}

template <class T>
inline void store(void* base, std::size_t index, T value) {
  std::memcpy(static_cast<unsigned char*>(base) + index * sizeof(T), &value, sizeof(T));
}

// The element's value widened for printing: floating dtypes as the double Python would see
// (float16/bfloat16 go through float, as torch's printer does).
double load_as_double(const void* base, DType dtype, std::size_t index);
// Integer and bool dtypes as int64 (bool: 0 or 1).
std::int64_t load_as_int64(const void* base, DType dtype, std::size_t index);

}  // namespace shmdist::detail
