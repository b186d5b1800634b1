#include "coll/streaming_reduce.hpp"

#include <algorithm>
#include <cstring>

#include "coll/reduce.hpp"

namespace shmdist::coll {

StreamingReduce::StreamingReduce(Tensor keep, std::byte* out, std::size_t count, DType dtype,
                                 ReduceOp op, int divisor, bool theirs_first)
    : keep_(std::move(keep)),
      out_(out),
      count_(count),
      dtype_(dtype),
      op_(op),
      divisor_(divisor),
      theirs_first_(theirs_first),
      element_(element_size(dtype)) {}

void StreamingReduce::reduce(std::size_t first, const std::byte* theirs, std::size_t count) {
  // The engine routes only a message of count_ elements here; a byte past them (which no
  // transport hands over) is ignored rather than written out of bounds.
  if (first >= count_) return;
  count = std::min(count, count_ - first);
  std::byte* out = out_ + first * element_;
  const std::byte* inputs[2] = {theirs, out};
  if (!theirs_first_) std::swap(inputs[0], inputs[1]);
  reduce_in_order(op_, dtype_, inputs, out, count, divisor_);
}

void StreamingReduce::consume(std::uint64_t at, std::span<const std::byte> bytes) {
  std::size_t used = 0;
  if (carried_) {  // the rest of an element that began in the last call
    used = std::min(element_ - carried_, bytes.size());
    std::memcpy(carry_.data() + carried_, bytes.data(), used);
    carried_ += used;
    if (carried_ < element_) return;
    reduce(static_cast<std::size_t>(at / element_), carry_.data(), 1);
    carried_ = 0;
  }
  const std::size_t whole = (bytes.size() - used) / element_;
  if (whole) reduce(static_cast<std::size_t>((at + used) / element_), bytes.data() + used, whole);
  used += whole * element_;
  carried_ = bytes.size() - used;
  if (carried_) std::memcpy(carry_.data(), bytes.data() + used, carried_);
}

}  // namespace shmdist::coll
