// A collective's tensors as its schedules take them apart: their bytes, a range of their
// elements, a member's slice, a staging buffer. Every schedule builder uses these, and only
// these, to point into a tensor.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include <shmdist/distributed.hpp>

namespace shmdist::coll {

inline std::byte* bytes_of(const Tensor& t) {
  return static_cast<std::byte*>(const_cast<void*>(t.data_ptr()));
}

// Elements [offset, offset + count) of t's storage, as a 1-d tensor that shares it (and
// keeps it alive: a receive into it may outlive the schedule, engine/engine.cpp memory_of).
inline Tensor view_of(const Tensor& t, std::int64_t offset, std::int64_t count) {
  return Tensor::from_blob(bytes_of(t) + offset * static_cast<std::int64_t>(element_size(t.dtype())),
                           {count}, t.dtype(), t.storage_handle());
}

// Member j's slice of `count` elements split as evenly as possible among n members.
inline std::int64_t slice_begin(std::int64_t count, int n, int j) { return count * j / n; }
inline std::int64_t slice_len(std::int64_t count, int n, int j) {
  return slice_begin(count, n, j + 1) - slice_begin(count, n, j);
}

// A schedule's staging buffer of `count` elements, uninitialized: every element is written
// (received, or reduced into) before it is read, and never shown to the caller. empty()
// zeroes (calloc), which on a 4 MiB all_reduce across hosts was 10% of the call's CPU time
// (the 2 MiB stage reused from the heap is memset each call).
inline Tensor scratch(std::int64_t count, DType dtype) {
  const std::size_t nbytes = static_cast<std::size_t>(count) * element_size(dtype);
  std::shared_ptr<void> owner(std::malloc(std::max<std::size_t>(nbytes, 1)),
                              [](void* p) { std::free(p); });
  if (!owner) throw std::bad_alloc();
  return Tensor::from_blob(owner.get(), {count}, dtype, owner);
}

inline void copy_elements(const Tensor& from, const Tensor& to) {
  if (from.nbytes() && bytes_of(from) != bytes_of(to))
    std::memmove(bytes_of(to), bytes_of(from), from.nbytes());
}

}  // namespace shmdist::coll
