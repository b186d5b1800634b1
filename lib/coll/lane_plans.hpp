// Round plans of the collectives that move their data through the world lane (ShmLane), as
// plain data: what each round writes into this member's slot and what it reads from all
// members' slots (no std::function, no allocation). Windows of at most slot_size() bytes go
// through the slots one round at a time, so any size works; every reduction reads the
// members' contributions in group-rank order (coll/reduce.hpp), whatever the size.
//
// all_reduce (and reduce) has two algorithms, chosen by size and group size alike on every
// member (the fingerprints agree, so the choice does too):
//   direct  (up to slice_threshold(n) bytes, or 2 members): one round per window; every member
//           copies its window in and reduces all members' windows straight into its output
//           (its own from the tensor, in place, the others' from their slots);
//   sliced  (above, 3 members or more; with 2 members, float16 and bfloat16 from
//           kSlicePairMin bytes up to one window): two rounds per window. Round 1: each
//           member copies its window in and, once all have, reduces only its own slice (1/n
//           of the window, member order as always) in place into its output. Round 2: each
//           member copies its reduced slice in, and copies the others' reduced slices out. Each member reads about 2 windows' worth
//           of slots instead of n (with 2 members both read 2: direct, with one round less).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <shmdist/distributed.hpp>

#include "coll/shm_lane.hpp"

namespace shmdist::coll {

// all_reduce windows above slice_threshold(n) bytes, in groups of at least kSliceMinMembers,
// take the sliced algorithm. Direct reads n windows per member (n^2 for the group), sliced
// about 3 per member (3n) plus one round more (a hand-off of each CPU when the members
// outnumber the CPUs, a few microseconds): at 3-4 members the rounds win up to 64 KiB, at 8
// members the n^2 reads (64 windows against 24) cost more than the extra round from 16 KiB on
// (interleaved runs at 8 ranks on 2 cores: 64 KiB direct took 1.4x-2.6x the time of sliced;
// the last gated run read 64 KiB direct slower than 128 KiB sliced, 235 against 163 us).
inline constexpr std::size_t kSliceThreshold = 64 * 1024;       // 3 or 4 members
inline constexpr std::size_t kSliceThresholdWide = 16 * 1024;   // 5 members or more
inline constexpr int kSliceMinMembers = 3;
inline constexpr std::size_t slice_threshold(int members) {
  return members > 4 ? kSliceThresholdWide : kSliceThreshold;
}
// Two members, float16 and bfloat16, above this many bytes and up to one window: the sliced
// algorithm (each member reduces half the elements, the other half it copies). There the
// reduction's arithmetic (widening to float32 and rounding back, about 2x float32's time per
// byte in the vector kernels, bench/micro/reduce_kernels.cpp) outweighs the round it adds.
// Since both algorithms reduce a member's own input in place in its tensor (issue 29), 2
// bound ranks, bfloat16, interleaved, medians of 3 (2026-12-05): sliced took 1.14x direct's
// time at 8 KiB, 1.00x-1.06x at 16 KiB, 0.93x at 32 KiB, 0.91x at 64 KiB, 0.90x at 256 KiB
// (before that change the switch was at 4 KiB: sliced 0.81x at 8 KiB, 0.67x at 256 KiB).
// float32 gained nothing from slicing (0.92x-1.06x), and above one window the doubled
// rounds (a hand-off each on a loaded machine) measured no gain either.
inline constexpr std::size_t kSlicePairMin = 16 * 1024;
// Two-member broadcasts above this many bytes move windows of this size (pipelined).
inline constexpr std::size_t kBroadcastChunk = 32 * 1024;

struct LanePlan {
  enum class What : std::uint8_t { None, Broadcast, Reduce, AllGather, ReduceScatter };
  What what = What::None;
  const ShmLane* lane = nullptr;
  ReduceOp op = ReduceOp::SUM;
  DType dtype = DType::UInt8;
  int n = 1;        // members (the world)
  int me = 0;       // this member
  int root = -1;    // Broadcast: src; Reduce: dst, -1 for all_reduce
  bool sliced = false;  // Reduce: the sliced algorithm (two rounds per window)
  std::size_t total = 0;   // bytes per member (ReduceScatter: of each part)
  std::size_t window = 1;  // bytes per window
  std::size_t at = segment::kCollSlotHeader;  // where the data sit in a slot (ShmLane::data_offset)
  std::byte* data = nullptr;  // Broadcast/Reduce: the tensor; ReduceScatter: the output
  const std::byte* in = nullptr;  // AllGather: the input
  // AllGather: the outputs; ReduceScatter: the inputs. Part j is list[j] when `list` is set,
  // else base + j * stride.
  const std::vector<Tensor>* list = nullptr;
  std::byte* base = nullptr;
  std::size_t stride = 0;

  std::uint64_t rounds() const;
  // Round k (from 1): this member's payload into `slot` (its data bytes, after the header).
  // May read round k-1's slots (lane->data_of(j, at) still names them).
  void write(std::uint64_t k, std::byte* slot) const;
  // Round k, work on this member's own bytes only (all_gather copies its input into its own
  // part): from round 2 on right after this member published it, while it waits for the
  // others; round 1 once the members are known to agree, before read(1).
  void local(std::uint64_t k) const;
  // Round k, once every member has published it: what this member takes from every
  // member's slot data (lane->data_of(j, at), by group rank).
  void read(std::uint64_t k) const;

 private:
  std::byte* part(int j) const;
};

LanePlan plan_broadcast(const ShmLane& lane, const Tensor& tensor, int root, int me);
// root < 0: every member writes the result into `tensor` (all_reduce); otherwise only root.
LanePlan plan_reduce(const ShmLane& lane, const Tensor& tensor, ReduceOp op, int root, int me);
// Part j of the output receives member j's input (all_gather: outputs[j]; all_gather_into_tensor:
// list == nullptr, base = output, stride = input bytes).
LanePlan plan_all_gather(const ShmLane& lane, const Tensor& input,
                         const std::vector<Tensor>* outputs, std::byte* base);
// Part j of every member's input is reduced into member j's output (list, or base + stride).
LanePlan plan_reduce_scatter(const ShmLane& lane, const std::vector<Tensor>* parts,
                             std::byte* base, const Tensor& output, ReduceOp op, int me);

}  // namespace shmdist::coll
