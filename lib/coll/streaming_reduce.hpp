// A reduction that runs as a message's bytes arrive: the receive hands them over where they
// lie (a shared-memory ring, transport::ByteConsumer) and they are combined into memory of
// this rank's own, with no copy into a staging buffer first and no pass over it afterwards
// (step A of the columns' all_reduce, reduce_schedules.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>

#include <shmdist/distributed.hpp>

#include "transport/transport.hpp"

namespace shmdist::coll {

// out[i] = theirs[i] op out[i] when `theirs_first`, else out[i] op theirs[i], for the `count`
// elements at `out`, `theirs` being the message: bitwise reduce_in_order's result for the
// inputs {theirs, out} (or {out, theirs}), since each element is reduced alone. An element
// split between two calls waits in a carry until its last byte comes. `keep` holds the
// storage `out` points into for as long as the receive may run.
class StreamingReduce final : public transport::ByteConsumer {
 public:
  StreamingReduce(Tensor keep, std::byte* out, std::size_t count, DType dtype, ReduceOp op,
                  int divisor, bool theirs_first);
  void consume(std::uint64_t at, std::span<const std::byte> bytes) override;

 private:
  void reduce(std::size_t first, const std::byte* theirs, std::size_t count);

  Tensor keep_;
  std::byte* out_;
  std::size_t count_;
  DType dtype_;
  ReduceOp op_;
  int divisor_;
  bool theirs_first_;
  std::size_t element_;
  static constexpr std::size_t kWidest =
      *std::max_element(std::begin(detail::kDTypeSize), std::end(detail::kDTypeSize));
  std::array<std::byte, kWidest> carry_{};  // an element split between calls
  std::size_t carried_ = 0;
};

}  // namespace shmdist::coll
