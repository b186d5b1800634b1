// The round plans. Windows: round k (from 1) of a one-round-per-window plan moves window k;
// the sliced all_reduce moves window (k + 1) / 2 in rounds k = 2w - 1 (inputs) and 2w
// (reduced slices).

#include "coll/lane_plans.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include "coll/reduce.hpp"
#include "coll/tensor_views.hpp"
#include "segment/layout.hpp"

namespace shmdist::coll {
namespace {

using segment::align_up;

void copy_bytes(std::byte* to, const std::byte* from, std::size_t n) {
  if (n && to != from) std::memcpy(to, from, n);
}

// Member j's slice of `count` elements split as evenly as possible among n members.
std::size_t slice_begin(std::size_t count, int n, int j) {
  return count * static_cast<std::size_t>(j) / static_cast<std::size_t>(n);
}

// The members' slot data pointers for a reduction, at byte `offset` into each slot. Up to 16
// members on the stack; larger worlds take the heap.
class SlotInputs {
 public:
  SlotInputs(const ShmLane& lane, int n, std::size_t offset) {
    data_ = n <= kInline ? inline_.data() : (heap_.resize(n), heap_.data());
    for (int j = 0; j < n; ++j) data_[j] = lane.data_of(j, offset);
    span_ = {data_, static_cast<std::size_t>(n)};
  }
  std::span<const std::byte* const> span() const { return span_; }
  // Member j's input from `p` instead of its slot.
  void set(int j, const std::byte* p) { data_[j] = p; }

 private:
  static constexpr int kInline = 16;
  std::array<const std::byte*, kInline> inline_;  // filled up to n by the constructor
  std::vector<const std::byte*> heap_;
  const std::byte** data_;
  std::span<const std::byte* const> span_;
};

}  // namespace

std::uint64_t LanePlan::rounds() const {
  const std::uint64_t windows = total == 0 ? 1 : (total + window - 1) / window;
  return sliced ? 2 * windows : windows;
}

std::byte* LanePlan::part(int j) const {
  return list ? bytes_of((*list)[static_cast<std::size_t>(j)]) : base + j * stride;
}

void LanePlan::write(std::uint64_t k, std::byte* slot) const {
  const std::uint64_t w = sliced ? (k + 1) / 2 : k;  // window number, from 1
  const std::size_t off = (w - 1) * window;
  const std::size_t len = off >= total ? 0 : std::min(window, total - off);
  switch (what) {
    case What::None: return;
    case What::Broadcast:
      if (me == root) copy_bytes(slot, data + off, len);
      return;
    case What::Reduce: {
      if (!sliced || k % 2 == 1) {
        copy_bytes(slot, data + off, len);
        return;
      }
      // Round 2 of a window: this member's slice, reduced from every member's round-1 slot
      // (data_of() is still round 1's here, and intact: ShmLane's protocol lets round r+1's
      // write phase read round r's slots).
      const std::size_t es = element_size(dtype);
      const std::size_t count = len / es;
      const std::size_t b = slice_begin(count, n, me), e = slice_begin(count, n, me + 1);
      SlotInputs inputs(*lane, n, at + b * es);
      if (root >= 0 && root != me) {  // this member's tensor stays as it is
        reduce_in_order(op, dtype, inputs.span(), slot + b * es, e - b, n);
        return;
      }
      // Its own part from its tensor, reduced in place there (as the direct read does: one
      // stream fewer), then copied into the slot for the others; read() skips it.
      std::byte* const own = data + off + b * es;
      inputs.set(me, own);
      reduce_in_order(op, dtype, inputs.span(), own, e - b, n);
      copy_bytes(slot + b * es, own, (e - b) * es);
      return;
    }
    case What::AllGather: copy_bytes(slot, in + off, len); return;
    case What::ReduceScatter:
      for (int j = 0; j < n; ++j) copy_bytes(slot + j * window, part(j) + off, len);
      return;
  }
}

void LanePlan::local(std::uint64_t k) const {
  if (what != What::AllGather) return;
  const std::size_t off = (k - 1) * window;
  const std::size_t len = off >= total ? 0 : std::min(window, total - off);
  copy_bytes(part(me) + off, in + off, len);
}

void LanePlan::read(std::uint64_t k) const {
  if (what == What::None) return;  // a plan without data (a barrier) may have no lane
  const ShmLane& slots = *lane;
  const std::uint64_t w = sliced ? (k + 1) / 2 : k;
  const std::size_t off = (w - 1) * window;
  const std::size_t len = off >= total ? 0 : std::min(window, total - off);
  const std::size_t es = element_size(dtype);
  switch (what) {
    case What::None: return;
    case What::Broadcast:
      if (me != root) copy_bytes(data + off, slots.data_of(root, at), len);
      return;
    case What::Reduce: {
      if (root >= 0 && root != me) return;  // only the root's tensor is written
      if (!sliced) {
        // The peers' inputs from their slots; this member's own from its tensor, where it
        // still is (only this read writes the window there), reduced in place: the same
        // bytes as in its slot, in the same group-rank order, but one memory stream fewer
        // for the kernel (two to read, one of them the output, instead of three). Interleaved
        // runs of 2 bound ranks, 2026-12-05: 64 KiB 2.0 against 5.1 us, 1 MiB 35 against
        // 68 us, 16 MiB 0.74 against 1.14 ms; one core alone (256 KiB float32 SUM) 2.0
        // against 3.2 us. Every member evaluates the same expression over the same bytes.
        SlotInputs inputs(slots, n, at);
        inputs.set(me, data + off);
        reduce_in_order(op, dtype, inputs.span(), data + off, len / es, n);
        return;
      }
      if (k % 2 == 1) return;  // the slices are reduced in the next round's write
      const std::size_t count = len / es;
      for (int j = 0; j < n; ++j) {
        if (j == me) continue;  // reduced in place by write()
        const std::size_t b = slice_begin(count, n, j) * es, e = slice_begin(count, n, j + 1) * es;
        copy_bytes(data + off + b, slots.data_of(j, at + b), e - b);
      }
      return;
    }
    case What::AllGather:
      for (int j = 0; j < n; ++j)
        if (j != me) copy_bytes(part(j) + off, slots.data_of(j, at), len);  // own: local()
      return;
    case What::ReduceScatter: {
      const SlotInputs inputs(slots, n, at + static_cast<std::size_t>(me) * window);
      reduce_in_order(op, dtype, inputs.span(), data + off, len / es, n);
      return;
    }
  }
}

LanePlan plan_broadcast(const ShmLane& lane, const Tensor& tensor, int root, int me) {
  LanePlan p;
  p.lane = &lane;
  p.what = LanePlan::What::Broadcast;
  p.n = lane.world();
  p.me = me;
  p.root = root;
  p.total = tensor.nbytes();
  // Two members, above kBroadcastChunk and up to kBroadcastPipelineMax: windows of that size,
  // so that the root writes window k+1 into its other slot while the peer copies window k
  // out (the two copies overlap). Larger broadcasts keep whole slots (interleaved runs on a
  // loaded machine measured 32 KiB windows 2x slower at 1-4 MiB: a round per 32 KiB is a
  // hand-off each, and a rank that loses its CPU stalls every one of them); so do larger
  // groups (with more ranks than cores every round may cost a context switch).
  constexpr std::size_t kBroadcastPipelineMax = 512 * 1024;
  p.window = p.n == 2 && p.total > kBroadcastChunk && p.total <= kBroadcastPipelineMax
                 ? std::min(lane.slot_size(), kBroadcastChunk)
                 : lane.slot_size();
  p.at = ShmLane::data_offset(std::min(p.total, p.window));
  p.data = bytes_of(tensor);
  return p;
}

LanePlan plan_reduce(const ShmLane& lane, const Tensor& tensor, ReduceOp op, int root, int me) {
  LanePlan p;
  p.lane = &lane;
  p.what = LanePlan::What::Reduce;
  p.op = op;
  p.dtype = tensor.dtype();
  p.n = lane.world();
  p.me = me;
  p.root = root;
  p.total = tensor.nbytes();
  p.window = lane.slot_size() / 8 * 8;  // whole elements of every dtype
  const bool half_float = p.dtype == DType::BFloat16 || p.dtype == DType::Float16;
  p.sliced = p.n >= kSliceMinMembers
                 ? p.total > slice_threshold(p.n)
                 : p.n == 2 && half_float && p.total > kSlicePairMin && p.total <= p.window;
  p.at = ShmLane::data_offset(std::min(p.total, p.window));
  p.data = bytes_of(tensor);
  return p;
}

LanePlan plan_all_gather(const ShmLane& lane, const Tensor& input,
                         const std::vector<Tensor>* outputs, std::byte* base) {
  LanePlan p;
  p.lane = &lane;
  p.what = LanePlan::What::AllGather;
  p.n = lane.world();
  p.me = lane.rank();
  p.total = input.nbytes();
  p.window = lane.slot_size();
  p.at = ShmLane::data_offset(std::min(p.total, p.window));
  p.in = bytes_of(input);
  p.list = outputs;
  p.base = base;
  p.stride = input.nbytes();
  return p;
}

LanePlan plan_reduce_scatter(const ShmLane& lane, const std::vector<Tensor>* parts,
                             std::byte* base, const Tensor& output, ReduceOp op, int me) {
  LanePlan p;
  p.lane = &lane;
  p.what = LanePlan::What::ReduceScatter;
  p.op = op;
  p.dtype = output.dtype();
  p.n = lane.world();
  p.me = me;
  p.total = output.nbytes();
  // Each round carries one window of every part: n windows side by side in the slot, packed
  // when the parts are small (whole elements of every dtype: multiples of 8 bytes).
  p.window = std::max<std::size_t>(
      std::min(lane.slot_size() / p.n / 8 * 8, align_up(p.total, 8)), 8);
  p.at = ShmLane::data_offset(p.window * static_cast<std::size_t>(p.n));
  p.data = bytes_of(output);
  p.list = parts;
  p.base = base;
  p.stride = output.nbytes();
  return p;
}

}  // namespace shmdist::coll
