// The round plans: round k (from 1) moves window k of the payload.

#include "coll/lane_plans.hpp"

#include <algorithm>
#include <cstring>

#include "coll/reduce.hpp"

namespace shmdist::coll {
namespace {

std::byte* bytes_of(const Tensor& t) {
  return static_cast<std::byte*>(const_cast<void*>(t.data_ptr()));
}

// Windows of `window` bytes over `total` bytes: how many rounds, and round k's range.
struct Windows {
  std::size_t total, window;
  std::uint64_t rounds() const { return total == 0 ? 1 : (total + window - 1) / window; }
  std::size_t offset(std::uint64_t k) const { return (k - 1) * window; }
  std::size_t length(std::uint64_t k) const {
    const std::size_t off = offset(k);
    return off >= total ? 0 : std::min(window, total - off);
  }
};

void copy_bytes(std::byte* to, const std::byte* from, std::size_t n) {
  if (n && to != from) std::memcpy(to, from, n);
}

}  // namespace

void plan_broadcast(Schedule& sch, const ShmLane& lane, const Tensor& tensor, int root, int me) {
  const Windows w{tensor.nbytes(), lane.slot_size()};
  std::byte* data = bytes_of(tensor);
  RoundPlan& p = sch.plan();
  p.rounds = w.rounds();
  if (me == root) {
    p.write = [=](std::uint64_t k, std::byte* slot) { copy_bytes(slot, data + w.offset(k), w.length(k)); };
  } else {
    p.read = [=](std::uint64_t k, const std::vector<const std::byte*>& slots) {
      copy_bytes(data + w.offset(k), slots[root], w.length(k));
    };
  }
}

void plan_reduce(Schedule& sch, const ShmLane& lane, const Tensor& tensor, ReduceOp op, int root,
                 int me) {
  const std::size_t es = element_size(tensor.dtype());
  const Windows w{tensor.nbytes(), lane.slot_size() / 8 * 8};
  std::byte* data = bytes_of(tensor);
  const DType dtype = tensor.dtype();
  const int n = lane.world();
  RoundPlan& p = sch.plan();
  p.rounds = w.rounds();
  p.write = [=](std::uint64_t k, std::byte* slot) { copy_bytes(slot, data + w.offset(k), w.length(k)); };
  if (root < 0 || root == me) {
    // This member's own input for the window is in its slot already: the tensor may be
    // overwritten. Every member evaluates the same expression over the same bytes.
    p.read = [=](std::uint64_t k, const std::vector<const std::byte*>& slots) {
      reduce_in_order(op, dtype, slots, data + w.offset(k), w.length(k) / es, n);
    };
  }
}

void plan_all_gather(Schedule& sch, const ShmLane& lane, const Tensor& input,
                     const std::vector<Tensor>& outputs) {
  const Windows w{input.nbytes(), lane.slot_size()};
  const std::byte* in = bytes_of(input);
  std::vector<std::byte*> out;
  for (const Tensor& t : outputs) out.push_back(bytes_of(t));
  RoundPlan& p = sch.plan();
  p.rounds = w.rounds();
  p.write = [=](std::uint64_t k, std::byte* slot) { copy_bytes(slot, in + w.offset(k), w.length(k)); };
  p.read = [=](std::uint64_t k, const std::vector<const std::byte*>& slots) {
    for (std::size_t j = 0; j < out.size(); ++j) copy_bytes(out[j] + w.offset(k), slots[j], w.length(k));
  };
}

void plan_reduce_scatter(Schedule& sch, const ShmLane& lane, const std::vector<Tensor>& parts,
                         const Tensor& output, ReduceOp op, int me) {
  const int n = lane.world();
  const std::size_t es = element_size(output.dtype());
  // Each round carries one window of every part: n windows side by side in the slot.
  const Windows w{output.nbytes(), std::max<std::size_t>(lane.slot_size() / n / 8 * 8, 8)};
  std::vector<const std::byte*> in;
  for (const Tensor& t : parts) in.push_back(bytes_of(t));
  std::byte* out = bytes_of(output);
  const DType dtype = output.dtype();
  RoundPlan& p = sch.plan();
  p.rounds = w.rounds();
  p.write = [=](std::uint64_t k, std::byte* slot) {
    for (int j = 0; j < n; ++j) copy_bytes(slot + j * w.window, in[j] + w.offset(k), w.length(k));
  };
  p.read = [=](std::uint64_t k, const std::vector<const std::byte*>& slots) {
    std::vector<const std::byte*> mine(n);
    for (int r = 0; r < n; ++r) mine[r] = slots[r] + me * w.window;
    reduce_in_order(op, dtype, mine, out + w.offset(k), w.length(k) / es, n);
  };
}

}  // namespace shmdist::coll
