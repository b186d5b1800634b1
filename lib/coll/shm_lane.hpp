// The world group's lane through the segment's collective area (segment/layout.hpp): each
// rank owns two slots (alternating rounds) and two monotonically increasing 64-bit counters,
// `arrived` and `released`, each on its own cache line and written only by its owner.
//
// A collective is one or more rounds; every member takes part in every round, and all
// members number rounds alike (world collectives run on the lane one after another, in call
// order, and members agree on how many rounds each takes, or all stop after round 1 when
// their fingerprints disagree). Round r of this rank:
//   1. wait until every peer has released round r-2 (they are done reading the slot of
//      parity r%2 that round r overwrites);
//   2. write the slot (header: the call's fingerprint; data: this round's payload);
//   3. arrived = r (release), wake peers;
//   4. wait until every peer has arrived at r (acquire), read their slots;
//   5. released = r (release), wake peers.
//
// Memory orderings (C++ model): the payload is written with plain stores before the release
// store of arrived = r; a reader's acquire load that sees arrived >= r synchronizes with it,
// so the payload writes happen before its plain reads: no data race, the reader sees the
// whole round. Symmetrically, a reader's plain reads of round r-2 are sequenced before its
// release store released = r-2, and the writer's acquire load seeing it makes those reads
// happen before the writer's overwrite in round r. Counters only increase, so a stale load
// merely delays (it can never claim a round that did not happen), and no flag is reset.
// Waking: after each release store the rank issues the doorbell protocol's notifier half
// (seq_cst fence, then wake every armed peer: wait/doorbell.hpp explains why no wake-up is
// lost against a waiter that arms, fences and re-checks these counters in the engine's
// progress loop before sleeping).
#pragma once

#include <cstdint>
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
  // Step 1 for round() + 1.
  bool can_write() const;
  // This rank's slot for round() + 1: its header line, then slot_size() data bytes.
  std::byte* next_slot() const { return seg_->coll_slot(rank_, (round_ + 1) & 1); }
  // Step 3: publishes round() + 1.
  void publish();
  // Step 4 for round().
  bool all_arrived();
  const std::byte* slot_of(int rank) const { return seg_->coll_slot(rank, round_ & 1); }
  // Step 5 for round().
  void release();
  // Peers this rank waits for right now (global ranks).
  void awaited(std::vector<int>& out, bool writing) const;

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
