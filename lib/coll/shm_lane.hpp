// The world group's lane through the segment's collective area (segment/layout.hpp): each
// rank owns two slots (alternating rounds). A slot's header line starts with its round flag
// (segment::CollSlotHead: the last round its owner wrote there, 64-bit, written only by its
// owner, only increasing), then this layer's fingerprint, then a small payload inline:
//
//   [0, 8)      round flag (atomic)
//   [8, 40)     the call's Fingerprint
//   [40, ...)   data of a round whose payload is at most kInlineLimit bytes (it continues
//               past the header line into the data area when it is longer than 88 bytes)
//   [128, ...)  data of a larger round (kCollSlotHeader, cache-line aligned for big copies)
//
// So a small round is one store sequence into one or two lines and, for a reader, one line
// that carries flag, fingerprint and payload together.
//
// A collective is one or more rounds; every member takes part in every round, and all
// members number rounds alike (world collectives run on the lane one after another, in call
// order, and members agree on how many rounds each takes, or all stop after round 1 when
// their fingerprints disagree). Round r of this rank:
//   1. write its slot of parity r % 2 (fingerprint, payload), possibly computed from the
//      members' round r-1 slots;
//   2. store the slot's flag = r (release), wake peers;
//   3. wait until every peer's parity r % 2 flag is >= r (acquire), read their round r slots.
// There is no wait before writing and no "released" flag: a rank's round r+1 flag says it is
// done with round r's slots (it reads them only before that store), and a rank can start
// round r+2 (overwriting its parity-r slot) only after its round r+1 ended, i.e. after it saw
// every peer's round r+1 flag.
//
// Proof in the C++ memory model (W = a rank's plain writes of its round r slot, R = a peer's
// plain reads of it; F(j, p) = rank j's flag of parity p):
//   - W happen before R: W is sequenced before the writer's release store F = r; the
//     reader's acquire load of F that returns a value >= r reads from that store or a later
//     one of the same release sequence (only the owner stores F, monotonically), so it
//     synchronizes with it, and R is sequenced after that load. No data race, and R sees W.
//     (The reader's loads of F while W is under way are atomic loads of another object than
//     the one W writes, even when they share a cache line: no race either.)
//   - R (in the reader's round r or in its round r+1 write phase) happen before the writer's
//     next writes W' of that slot (round r+2): R is sequenced before the reader's release
//     store of its round r+1 flag; W' is sequenced after the writer's acquire load that
//     returned a value >= r+1 from that flag (its round r+1 wait), which therefore
//     synchronizes with that store. So R never races with W', and R reads round r's bytes.
//   - A reader waiting for round r can only see F = r-2 (not ready) or r: the writer cannot
//     reach r+2 before the reader has published r+1. Flags only increase and are never
//     reset, so a stale load merely delays.
// Waking: after each release store the rank issues the doorbell protocol's notifier half
// (wait::Notifier: fence F_n, seq_cst or the light half of an asymmetric pair, then wake every
// armed peer: wait/doorbell.hpp and wait/notifier.hpp explain why no wake-up is
// lost against a waiter that arms, fences and re-checks these flags in the engine's progress
// loop before sleeping).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "coll/fingerprint.hpp"
#include "segment/segment.hpp"
#include "wait/notifier.hpp"

namespace shmdist::coll {

class ShmLane {
 public:
  // Byte offsets inside a slot (see above).
  static constexpr std::size_t kFingerprintAt = sizeof(segment::CollSlotHead);
  static constexpr std::size_t kInlineAt = kFingerprintAt + sizeof(Fingerprint);
  static_assert(kInlineAt % 8 == 0 && kInlineAt < segment::kCollSlotHeader);  // any element
  static constexpr std::size_t kInlineLimit = 4096;
  // Where a round that writes `payload` bytes into each slot keeps them.
  static constexpr std::size_t data_offset(std::size_t payload) {
    return payload <= kInlineLimit ? kInlineAt : segment::kCollSlotHeader;
  }

  // `cpus`: the job's CPU count (cpus::for_job), for the collectives' crowded test.
  ShmLane(std::shared_ptr<segment::Segment> segment, int rank, int cpus);

  int world() const { return world_; }
  int rank() const { return rank_; }
  std::size_t slot_size() const { return slot_size_; }
  int cpus() const { return cpus_; }  // the CPUs the job's ranks share (at least 1)

  // World collectives use the lane one at a time, in call order.
  std::uint64_t take_ticket() { return ++issued_; }
  bool is_turn(std::uint64_t ticket) const { return ticket == served_ + 1; }
  void end_turn() { ++served_; }
  bool idle() const { return served_ == issued_; }  // no call holds or awaits a turn

  std::uint64_t round() const { return round_; }  // the last round this rank published
  // This rank's slot for round() + 1 (its header, then the data area).
  std::byte* next_slot() const { return slot(rank_, (round_ + 1) & 1); }
  // Step 2: publishes round() + 1.
  void publish() {
    ++round_;
    arrived_scan_ = 0;
    head(rank_, round_ & 1).round.store(round_, std::memory_order_release);
    wake_peers();
  }
  // Step 3 for round(): whether every peer has published it.
  bool all_arrived() {
    const int parity = static_cast<int>(round_ & 1);
    for (; arrived_scan_ < world_; ++arrived_scan_) {
      if (arrived_scan_ == rank_) continue;
      if (head(arrived_scan_, parity).round.load(std::memory_order_acquire) < round_) return false;
    }
    return true;
  }
  // Member `rank`'s slot for round() (header), and its data at offset `at`.
  const std::byte* slot_of(int rank) const { return slot(rank, round_ & 1); }
  const std::byte* data_of(int rank, std::size_t at) const { return slot_of(rank) + at; }
  // Peers this rank waits for right now (global ranks).
  void awaited(std::vector<int>& out) const;

 private:
  std::byte* slot(int rank, std::uint64_t parity) const {
    return slots_[static_cast<std::size_t>(rank) * 2 + parity];
  }
  segment::CollSlotHead& head(int rank, std::uint64_t parity) const {
    return *reinterpret_cast<segment::CollSlotHead*>(static_cast<void*>(slot(rank, parity)));
  }
  void wake_peers();

  std::shared_ptr<segment::Segment> seg_;
  int rank_;
  int world_;
  std::size_t slot_size_;
  std::vector<std::byte*> slots_;              // rank * 2 + parity
  std::vector<int> peers_;  // every rank but this one
  wait::Notifier notifier_;  // every rank's doorbell
  int cpus_ = 1;
  std::uint64_t round_ = 0;
  int arrived_scan_ = 0;  // peers below this index are known to have arrived at round_
  std::uint64_t issued_ = 0, served_ = 0;
};

}  // namespace shmdist::coll
