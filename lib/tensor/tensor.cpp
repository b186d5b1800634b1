// The Tensor handle: shared storage, shape, typed access, clone/equal/to/copy_, from_blob.
#include <cstdlib>
#include <cstring>
#include <new>
#include <ostream>

#include <shmdist/tensor.hpp>

#include "tensor/dtype_check.hpp"
#include "tensor/shape.hpp"

namespace shmdist {

// One allocation shared by every copy of a Tensor. Borrowed (from_blob) storage only records
// the pointer; the caller keeps the memory alive, or the owner given to from_blob does.
struct Tensor::Storage {
  void* bytes = nullptr;
  bool owned = false;
  std::shared_ptr<void> owner;  // borrowed storage: what keeps `bytes` alive, if given

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (owned) std::free(bytes);
  }
};

namespace detail {

std::string shape_text(const std::vector<std::int64_t>& sizes) {
  std::string text = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(sizes[i]);
  }
  return text + "]";
}

std::int64_t checked_numel(const std::vector<std::int64_t>& sizes, DType dtype,
                           std::string_view caller) {
  checked_dtype(dtype, caller);
  bool has_zero = false;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0)
      throw InvalidArgument(std::string(caller) + ": expected every size to be >= 0, found " +
                            std::to_string(sizes[d]) + " at dimension " + std::to_string(d) +
                            " of shape " + shape_text(sizes) + "; pass non-negative sizes");
    has_zero = has_zero || sizes[d] == 0;
  }
  // A zero anywhere makes the product 0, however large the other sizes are.
  if (has_zero) return 0;
  std::int64_t numel = 1;
  for (const std::int64_t size : sizes) {
    if (__builtin_mul_overflow(numel, size, &numel))
      throw InvalidArgument(std::string(caller) + ": expected a shape whose element count fits " +
                            "in int64, found " + shape_text(sizes) +
                            " which overflows; pass smaller sizes");
  }
  std::size_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(numel), element_size(dtype), &nbytes))
    throw InvalidArgument(std::string(caller) + ": expected a byte count that fits in size_t, " +
                          "found " + std::to_string(numel) + " elements of " +
                          std::string(dtype_name(dtype)) + "; pass smaller sizes");
  return numel;
}

}  // namespace detail


std::shared_ptr<void> Tensor::storage_handle() const { return storage_; }

void Tensor::check_element_type(DType requested) const {
  if (!defined())
    throw InvalidArgument(std::string("Tensor::data<T>(): expected a defined tensor, found an ") +
                          "undefined (default-constructed) one; create it with empty(), " +
                          "zeros(), tensor() or from_blob() first");
  if (requested != dtype_)
    throw InvalidArgument("Tensor::data<T>(): expected T to match the tensor's dtype " +
                          std::string(dtype_name(dtype_)) + ", found T for " +
                          std::string(dtype_name(requested)) +
                          "; use the matching element type or convert with to(dtype) first");
}

Tensor empty(std::vector<std::int64_t> sizes, DType dtype) {
  const std::int64_t numel = detail::checked_numel(sizes, dtype, "empty");
  Tensor t;
  t.storage_ = std::make_shared<Tensor::Storage>();
  const std::size_t nbytes = static_cast<std::size_t>(numel) * element_size(dtype);
  if (nbytes > 0) {
    // calloc: zeroed (no indeterminate values to print), lazily so for large tensors, and
    // aligned for every element type.
    t.storage_->bytes = std::calloc(nbytes, 1);
    if (t.storage_->bytes == nullptr) throw std::bad_alloc();
    t.storage_->owned = true;
  }
  t.data_ = t.storage_->bytes;
  t.dtype_ = dtype;
  t.sizes_ = std::move(sizes);
  t.numel_ = numel;
  return t;
}

Tensor Tensor::from_blob(void* data, std::vector<std::int64_t> sizes, DType dtype,
                         std::shared_ptr<void> owner) {
  Tensor t = from_blob(data, std::move(sizes), dtype);
  t.storage_->owner = std::move(owner);
  return t;
}

Tensor Tensor::from_blob(void* data, std::vector<std::int64_t> sizes, DType dtype) {
  const std::int64_t numel = detail::checked_numel(sizes, dtype, "Tensor::from_blob");
  if (data == nullptr && numel > 0)
    throw InvalidArgument("Tensor::from_blob: expected a non-null data pointer for " +
                          std::to_string(numel) + " elements of shape " +
                          detail::shape_text(sizes) +
                          ", found nullptr; pass the address of the caller's buffer");
  Tensor t;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->bytes = data;
  t.data_ = data;
  t.dtype_ = dtype;
  t.sizes_ = std::move(sizes);
  t.numel_ = numel;
  return t;
}

Tensor Tensor::clone() const {
  if (!defined()) return Tensor();
  Tensor copy = empty(sizes_, dtype_);
  if (nbytes() > 0) std::memcpy(copy.data_, data_, nbytes());
  return copy;
}

bool Tensor::equal(const Tensor& other) const {
  if (!defined() || !other.defined()) return defined() == other.defined();
  if (dtype_ != other.dtype_ || sizes_ != other.sizes_) return false;
  return nbytes() == 0 || std::memcmp(data_, other.data_, nbytes()) == 0;
}

Tensor Tensor::to(DType dtype) const {
  detail::checked_dtype(dtype, "Tensor::to");
  if (!defined())
    throw InvalidArgument("Tensor::to: expected a defined tensor, found an undefined one; "
                          "create it with empty(), zeros(), tensor() or from_blob() first");
  Tensor result = empty(sizes_, dtype);
  convert_elements(data_, dtype_, result.data_, dtype, static_cast<std::size_t>(numel_));
  return result;
}

namespace {

bool bytes_overlap(const void* a, std::size_t a_len, const void* b, std::size_t b_len) {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b);
  return a_len > 0 && b_len > 0 && a0 < b0 + b_len && b0 < a0 + a_len;
}

}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  if (!defined() || !src.defined())
    throw InvalidArgument(std::string("Tensor::copy_: expected defined source and destination, ") +
                          "found an undefined " + (defined() ? "source" : "destination") +
                          "; create tensors with empty(), zeros(), tensor() or from_blob()");
  if (numel_ != src.numel_)
    throw InvalidArgument("Tensor::copy_: expected the source to have " + std::to_string(numel_) +
                          " elements like the destination " + detail::shape_text(sizes_) +
                          ", found " + std::to_string(src.numel_) + " (shape " +
                          detail::shape_text(src.sizes_) + "); pass tensors of equal numel");
  const auto count = static_cast<std::size_t>(numel_);
  if (data_ == src.data_ && dtype_ == src.dtype_) return *this;
  if (bytes_overlap(data_, nbytes(), src.data_, src.nbytes())) {
    // Converting in place would read elements already overwritten; go through a copy.
    const Tensor staged = src.clone();
    convert_elements(staged.data_, src.dtype_, data_, dtype_, count);
  } else {
    convert_elements(src.data_, src.dtype_, data_, dtype_, count);
  }
  return *this;
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string(); }

}  // namespace shmdist
