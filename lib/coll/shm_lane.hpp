// The world group's lane through the segment's collective area (segment/layout.hpp): each
// rank owns two slots (alternating rounds) and a monotonically increasing 64-bit counter
// `arrived` on its own cache line, written only by its owner.
//
// A collective is one or more rounds; every member takes part in every round, and all
// members number rounds alike (world collectives run on the lane one after another, in call
// order, and members agree on how many rounds each takes, or all stop after round 1 when
// their fingerprints disagree). Round r of this rank:
//   1. write its slot of parity r % 2 (header: the call's fingerprint; data: the payload),
//      possibly computed from the members' round r-1 slots;
//   2. arrived = r (release), wake peers;
//   3. wait until every peer has arrived at r (acquire), read their round r slots.
// There is no wait before writing and no "released" counter: a rank's arrived = r+1 says it
// is done with round r's slots (it reads them only before that store), and a rank can start
// round r+2 (overwriting its parity-r slot) only after its round r+1 ended, i.e. after it saw
// every peer's arrived >= r+1.
//
// Proof in the C++ memory model (W = a rank's plain writes of its round r slot, R = a peer's
// plain reads of it):
//   - W happen before R: W is sequenced before the writer's release store arrived = r; the
//     reader's acquire load that returns a value >= r reads from that store or a later one
//     of the same release sequence (only the owner stores, monotonically), so it
//     synchronizes with it, and R is sequenced after that load. No data race, and R sees W.
//   - R (in the reader's round r or in its round r+1 write phase) happen before the writer's
//     next writes W' of that slot (round r+2): R is sequenced before the reader's release
//     store arrived = r+1; W' is sequenced after the writer's acquire load that returned a
//     value >= r+1 (its round r+1 wait), which therefore synchronizes with that store. So R
//     never races with W', and R reads round r's bytes, not round r+2's.
//   - Counters only increase, so a stale load merely delays (it can never claim a round that
//     did not happen), and no flag is ever reset.
// Waking: after each release store the rank issues the doorbell protocol's notifier half
// (seq_cst fence, then wake every armed peer: wait/doorbell.hpp explains why no wake-up is
// lost against a waiter that arms, fences and re-checks these counters in the engine's
// progress loop before sleeping).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "segment/segment.hpp"

namespace shmdist::coll {

class ShmLane {
 public:
  ShmLane(std::shared_ptr<segment::Segment> segment, int rank);

  int world() const { return world_; }
  int rank() const { return rank_; }
  std::size_t slot_size() const { return slot_size_; }

  // World collectives use the lane one at a time, in call order.
  std::uint64_t take_ticket() { return ++issued_; }
  bool is_turn(std::uint64_t ticket) const { return ticket == served_ + 1; }
  void end_turn() { ++served_; }

  std::uint64_t round() const { return round_; }  // the last round this rank published
  // This rank's slot for round() + 1: its header line, then slot_size() data bytes.
  std::byte* next_slot() const { return seg_->coll_slot(rank_, (round_ + 1) & 1); }
  // Step 2: publishes round() + 1.
  void publish();
  // Step 3 for round(): whether every peer has published it.
  bool all_arrived();
  // Member `rank`'s slot for round() (header), and its data.
  const std::byte* slot_of(int rank) const { return seg_->coll_slot(rank, round_ & 1); }
  const std::byte* data_of(int rank) const { return slot_of(rank) + segment::kCollSlotHeader; }
  // Peers this rank waits for right now (global ranks).
  void awaited(std::vector<int>& out) const;

 private:
  void wake_peers();

  std::shared_ptr<segment::Segment> seg_;
  int rank_;
  int world_;
  std::size_t slot_size_;
  std::vector<segment::CollControl*> ctl_;  // by rank
  std::uint64_t round_ = 0;
  int arrived_scan_ = 0;  // peers below this index are known to have arrived at round_
  std::uint64_t issued_ = 0, served_ = 0;
};

}  // namespace shmdist::coll
