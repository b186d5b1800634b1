// A collective's tensors as its schedules take them apart: their bytes, a range of their
// elements, a member's slice (staging buffers: scratch.hpp). Every schedule builder uses
// these, and only these, to point into a tensor.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

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

inline void copy_elements(const Tensor& from, const Tensor& to) {
  if (from.nbytes() && bytes_of(from) != bytes_of(to))
    std::memmove(bytes_of(to), bytes_of(from), from.nbytes());
}

}  // namespace shmdist::coll
