// torch-style factories: zeros, ones, full, arange and the tensor({...}) literal builders.
// Values are produced in int64 or float64 and converted with convert_elements, so a factory
// rounds and wraps exactly as copy_ (and torch) would.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include <shmdist/tensor.hpp>

#include "tensor/shape.hpp"

namespace shmdist {
namespace {

template <class Value>
DType source_dtype() {
  return std::is_same_v<Value, double> ? DType::Float64 : DType::Int64;
}

// A tensor of `sizes` and `dtype` whose every element is `value` converted to `dtype`.
template <class Value>
Tensor filled(std::vector<std::int64_t> sizes, Value value, DType dtype, const char* caller) {
  detail::checked_numel(sizes, dtype, caller);  // so errors name the call the user made
  Tensor t = empty(std::move(sizes), dtype);
  if (t.numel() == 0) return t;
  // Convert one element, then replicate its bytes: cheaper than converting numel copies.
  convert_elements(&value, source_dtype<Value>(), t.data_ptr(), dtype, 1);
  const std::size_t width = t.element_size();
  auto* bytes = static_cast<unsigned char*>(t.data_ptr());
  for (std::size_t filled_bytes = width; filled_bytes < t.nbytes();) {
    const std::size_t chunk = std::min(filled_bytes, t.nbytes() - filled_bytes);
    std::memcpy(bytes + filled_bytes, bytes, chunk);
    filled_bytes += chunk;
  }
  return t;
}

template <class Value>
Tensor from_values(const std::vector<Value>& values, std::vector<std::int64_t> sizes,
                   DType dtype) {
  const std::int64_t numel = detail::checked_numel(sizes, dtype, "tensor");
  if (static_cast<std::size_t>(numel) != values.size())
    throw InvalidArgument("tensor: expected " + std::to_string(numel) +
                          " values for shape " + detail::shape_text(sizes) + ", found " +
                          std::to_string(values.size()) + "; give one value per element");
  Tensor t = empty(std::move(sizes), dtype);
  convert_elements(values.data(), source_dtype<Value>(), t.data_ptr(), dtype, values.size());
  return t;
}

}  // namespace

Tensor zeros(std::vector<std::int64_t> sizes, DType dtype) {
  detail::checked_numel(sizes, dtype, "zeros");  // so errors name the call the user made
  // empty() storage is already zeroed, and all-zero bytes are 0 in every dtype.
  return empty(std::move(sizes), dtype);
}

Tensor zeros(std::int64_t n, DType dtype) { return zeros(std::vector<std::int64_t>{n}, dtype); }

Tensor ones(std::vector<std::int64_t> sizes, DType dtype) {
  return filled<std::int64_t>(std::move(sizes), 1, dtype, "ones");
}

Tensor ones(std::int64_t n, DType dtype) { return ones(std::vector<std::int64_t>{n}, dtype); }

Tensor full(std::vector<std::int64_t> sizes, double value, DType dtype) {
  return filled<double>(std::move(sizes), value, dtype, "full");
}

Tensor arange(std::int64_t n, DType dtype) {
  if (n < 0)
    throw InvalidArgument("arange: expected n >= 0, found " + std::to_string(n) +
                          "; pass the number of elements wanted");
  Tensor t = empty({n}, dtype);
  std::vector<std::int64_t> chunk;
  // Convert in chunks so a huge arange does not need an int64 copy of the whole tensor.
  constexpr std::int64_t kChunk = 4096;
  auto* out = static_cast<unsigned char*>(t.data_ptr());
  for (std::int64_t start = 0; start < n; start += kChunk) {
    const std::int64_t count = std::min(kChunk, n - start);
    chunk.resize(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) chunk[static_cast<std::size_t>(i)] = start + i;
    void* destination = out + static_cast<std::size_t>(start) * t.element_size();
    convert_elements(chunk.data(), DType::Int64, destination, dtype, chunk.size());
  }
  return t;
}

namespace detail {

Tensor tensor_from_values(const std::vector<double>& values, std::vector<std::int64_t> sizes,
                          DType dtype) {
  return from_values(values, std::move(sizes), dtype);
}

Tensor tensor_from_values(const std::vector<std::int64_t>& values,
                          std::vector<std::int64_t> sizes, DType dtype) {
  return from_values(values, std::move(sizes), dtype);
}

}  // namespace detail
}  // namespace shmdist
