// shmdist::Tensor: a reference-counted handle to a dense, contiguous, row-major n-d array,
// like torch::Tensor. Copying a Tensor shares its storage; clone() copies the data.
// Printing (to_string, operator<<) is character-for-character PyTorch's repr.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <shmdist/dtype_table.hpp>
#include <shmdist/errors.hpp>

namespace shmdist {

// Bool, UInt8, Int8, Int16, Int32, Int64, Float16, BFloat16, Float32, Float64: the rows of
// shmdist/dtype_table.hpp, with their codes (0 ... 9).
enum class DType : std::uint8_t {
#define SHMDIST_DTYPE_ENUMERATOR(name, code, ...) name = code,
  SHMDIST_DTYPES(SHMDIST_DTYPE_ENUMERATOR)
#undef SHMDIST_DTYPE_ENUMERATOR
};

#define SHMDIST_DTYPE_COUNT(...) +1
inline constexpr int kNumDTypes = 0 SHMDIST_DTYPES(SHMDIST_DTYPE_COUNT);
#undef SHMDIST_DTYPE_COUNT

// torch-style aliases
inline constexpr DType kBool = DType::Bool;
inline constexpr DType kUInt8 = DType::UInt8;
inline constexpr DType kInt8 = DType::Int8;
inline constexpr DType kInt16 = DType::Int16;
inline constexpr DType kShort = DType::Int16;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kInt = DType::Int32;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kLong = DType::Int64;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kHalf = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kDouble = DType::Float64;

std::size_t element_size(DType dtype);
std::string_view dtype_name(DType dtype);  // "torch.int64", "torch.float32", ...
std::ostream& operator<<(std::ostream& os, DType dtype);  // writes dtype_name(dtype)
bool is_floating_point(DType dtype);
// Throws InvalidArgument unless `code` names one of the table's dtypes (used on untrusted input).
DType dtype_from_code(unsigned code);

// IEEE binary16 and bfloat16 values as stored in tensors; convert with to_float/from_float.
struct Half {
  std::uint16_t bits = 0;
};
struct BFloat16 {
  std::uint16_t bits = 0;
};
float to_float(Half h);
float to_float(BFloat16 b);
Half half_from_float(float f);          // round to nearest even; overflow gives inf; nan stays nan
BFloat16 bfloat16_from_float(float f);  // round to nearest even; nan stays nan

// The C++ element type of each dtype (used by Tensor::data<T>()).
#define SHMDIST_DTYPE_IS_ELEMENT(name, code, element, ...) || std::is_same_v<T, element>
template <class T>
inline constexpr bool is_element_type_v = false SHMDIST_DTYPES(SHMDIST_DTYPE_IS_ELEMENT);
#undef SHMDIST_DTYPE_IS_ELEMENT

template <class T>
constexpr DType dtype_of() {
  static_assert(is_element_type_v<T>, "not a shmdist element type");
#define SHMDIST_DTYPE_OF(name, code, element, ...) \
  if constexpr (std::is_same_v<T, element>) return DType::name;
  SHMDIST_DTYPES(SHMDIST_DTYPE_OF)
#undef SHMDIST_DTYPE_OF
  return DType::Bool;  // not reached: is_element_type_v<T> holds for one row
}

// Converts `count` elements from `src` (dtype `from`) into `dst` (dtype `to`) bit-exactly as
// PyTorch 1.13's copy_ does on x86-64: float to int truncates toward zero, nonzero to true,
// float to half/bfloat16 rounds to nearest even (through float), nan/inf kept where
// representable, int to float16 overflow gives inf. Out-of-range and NaN float to int, which is
// undefined in C++, gives what torch gives there: int64/int32 INT_MIN; int16/int8 through int32
// then wrapped; uint8 through int64 then wrapped (nan -> 0, 300. -> 44, -1. -> 255). Same dtype
// is a memcpy. `src` and `dst` need no alignment and must not overlap; a null pointer is
// accepted only with count 0. Throws InvalidArgument for invalid dtypes or null buffers.
void convert_elements(const void* src, DType from, void* dst, DType to, std::size_t count);

namespace detail {
// Bytes per element by dtype code, for the inline accessors below.
#define SHMDIST_DTYPE_SIZE(name, code, element, storage, ...) sizeof(storage),
inline constexpr std::size_t kDTypeSize[kNumDTypes] = {SHMDIST_DTYPES(SHMDIST_DTYPE_SIZE)};
#undef SHMDIST_DTYPE_SIZE
}  // namespace detail

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() == false
  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& sizes() const { return sizes_; }  // {} for a 0-d scalar
  std::int64_t dim() const { return static_cast<std::int64_t>(sizes_.size()); }
  std::int64_t numel() const { return numel_; }
  std::size_t element_size() const { return detail::kDTypeSize[static_cast<unsigned>(dtype_)]; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * element_size(); }
  void* data_ptr() { return data_; }
  const void* data_ptr() const { return data_; }
  template <class T>
  T* data() {
    check_element_type(dtype_of<T>());
    return static_cast<T*>(data_ptr());
  }
  template <class T>
  const T* data() const {
    check_element_type(dtype_of<T>());
    return static_cast<const T*>(data_ptr());
  }
  Tensor clone() const;
  // Same dtype, shape and bytes (floats compare bitwise: a NaN equals itself, 0. != -0.).
  // Two undefined tensors are equal.
  bool equal(const Tensor& other) const;
  std::string to_string() const;          // exactly PyTorch's repr(tensor)

  // Same shape, values converted to `dtype` (a clone when the dtype is unchanged).
  Tensor to(DType dtype) const;
  // Copies `src` into this tensor's storage, converting dtypes as torch's copy_ does.
  // The element counts must match (InvalidArgument otherwise).
  Tensor& copy_(const Tensor& src);

  // A tensor viewing `data` without owning it; `data` must outlive every copy of the tensor.
  // Throws InvalidArgument for a null `data` with elements, negative sizes or an overflowing
  // size. The library reads and writes the memory at any alignment; data<T>() callers
  // dereferencing the pointer need it aligned for T.
  static Tensor from_blob(void* data, std::vector<std::int64_t> sizes, DType dtype);
  // The same, keeping `owner` alive for as long as any copy of the tensor (or an operation
  // using it) exists: for memory owned by another runtime, such as a torch tensor.
  static Tensor from_blob(void* data, std::vector<std::int64_t> sizes, DType dtype,
                          std::shared_ptr<void> owner);

  // Shares the storage (keeps it alive); used by asynchronous operations.
  std::shared_ptr<void> storage_handle() const;

 private:
  struct Storage;
  void check_element_type(DType requested) const;
  friend Tensor empty(std::vector<std::int64_t> sizes, DType dtype);

  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  DType dtype_ = DType::Float32;
  std::vector<std::int64_t> sizes_;
  std::int64_t numel_ = 0;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);  // same text as to_string()

// Factories throw InvalidArgument for negative sizes, an element count overflowing int64 or a
// byte count overflowing size_t. Unlike torch.empty, empty() storage starts zeroed (so no
// indeterminate value is ever read), which makes zeros() the same call.
Tensor empty(std::vector<std::int64_t> sizes, DType dtype = kFloat32);
Tensor zeros(std::vector<std::int64_t> sizes, DType dtype = kFloat32);
Tensor zeros(std::int64_t n, DType dtype = kFloat32);  // 1-d, as torch.zeros(4, dtype=...)
Tensor ones(std::vector<std::int64_t> sizes, DType dtype = kFloat32);
Tensor ones(std::int64_t n, DType dtype = kFloat32);
// `value` is converted to `dtype` as convert_elements converts a float64.
Tensor full(std::vector<std::int64_t> sizes, double value, DType dtype = kFloat32);
Tensor arange(std::int64_t n, DType dtype = kInt64);

namespace detail {
// Builds a tensor of `sizes` from doubles / int64s (values given in row-major order).
Tensor tensor_from_values(const std::vector<double>& values, std::vector<std::int64_t> sizes,
                          DType dtype);
Tensor tensor_from_values(const std::vector<std::int64_t>& values,
                          std::vector<std::int64_t> sizes, DType dtype);

template <class T>
constexpr DType literal_dtype() {
  if constexpr (std::is_same_v<T, bool>) return DType::Bool;
  else if constexpr (std::is_integral_v<T>) return DType::Int64;
  else return DType::Float32;
}

template <class T, class It>
Tensor from_literals(It first, std::size_t n, std::vector<std::int64_t> sizes, DType dtype) {
  static_assert(std::is_arithmetic_v<T>, "tensor({...}) takes numbers or bools");
  if constexpr (std::is_integral_v<T>) {
    std::vector<std::int64_t> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i, ++first) v.push_back(static_cast<std::int64_t>(*first));
    return tensor_from_values(v, std::move(sizes), dtype);
  } else {
    std::vector<double> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i, ++first) v.push_back(static_cast<double>(*first));
    return tensor_from_values(v, std::move(sizes), dtype);
  }
}

template <class T>
Tensor from_nested(std::initializer_list<std::initializer_list<T>> rows, DType dtype) {
  std::vector<T> flat;
  std::size_t cols = rows.size() ? rows.begin()->size() : 0;
  for (const auto& r : rows) {
    if (r.size() != cols)
      throw InvalidArgument("tensor({{...}}): expected every row to have " +
                            std::to_string(cols) + " elements, found a row with " +
                            std::to_string(r.size()) + "; make all rows the same length");
    flat.insert(flat.end(), r.begin(), r.end());
  }
  return from_literals<T>(flat.begin(), flat.size(),
                          {static_cast<std::int64_t>(rows.size()),
                           static_cast<std::int64_t>(cols)},
                          dtype);
}
}  // namespace detail

// torch.tensor: integer literals give Int64, floating literals Float32, bool gives Bool, as in
// Python; nested braces give 2-d; an explicit dtype overrides. Mixed int/float lists are Float32.
template <class T>
Tensor tensor(std::initializer_list<T> values) {
  return detail::from_literals<T>(values.begin(), values.size(),
                                  {static_cast<std::int64_t>(values.size())},
                                  detail::literal_dtype<T>());
}
template <class T>
Tensor tensor(std::initializer_list<T> values, DType dtype) {
  return detail::from_literals<T>(values.begin(), values.size(),
                                  {static_cast<std::int64_t>(values.size())}, dtype);
}
inline Tensor tensor(std::initializer_list<double> values) { return tensor<double>(values); }
template <class T>
Tensor tensor(std::initializer_list<std::initializer_list<T>> rows) {
  return detail::from_nested<T>(rows, detail::literal_dtype<T>());
}
template <class T>
Tensor tensor(std::initializer_list<std::initializer_list<T>> rows, DType dtype) {
  return detail::from_nested<T>(rows, dtype);
}
// 0-d scalars: scalar_tensor(5) is tensor(5); scalar_tensor(2.5) is tensor(2.5000).
template <class T>
Tensor scalar_tensor(T value) {
  return detail::from_literals<T>(&value, 1, {}, detail::literal_dtype<T>());
}
template <class T>
Tensor scalar_tensor(T value, DType dtype) {
  return detail::from_literals<T>(&value, 1, {}, dtype);
}

}  // namespace shmdist
