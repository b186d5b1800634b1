// One collective's turn on the world lane (ShmLane): its rounds as a state machine that never
// blocks, and the agreement check folded into round 1 (every slot header carries its
// member's fingerprint, so agreement costs no round of its own).
//
// A blocking call runs its LaneCall in the caller's frame (no allocation, no background
// task): lib/coll/on_lane.hpp waits with Engine::wait_until and advances it from there
// (each advance() that moved is a Look::Moved for the engine's waiter).
// An async call, a call whose data then goes point-to-point, or a blocking call that timed
// out or saw a peer fail, runs it inside a Schedule (coll/schedule.hpp) that the engine's
// progress loop advances.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "coll/fingerprint.hpp"
#include "coll/lane_plans.hpp"
#include "coll/shm_lane.hpp"

namespace shmdist::coll {

// The group a collective runs on, as the layer above resolved it. `members` points into
// storage that outlives the call (the group's own list, or a Schedule's copy).
struct GroupView {
  std::uint32_t id = 0;
  std::uint32_t sig = 0;
  std::span<const int> members;  // global ranks in group-rank order
  int me = -1;                   // this member's group rank
  int size() const { return static_cast<int>(members.size()); }
};

// What one member says about its call, and how to name it in errors.
struct CallContext {
  GroupView group;
  std::uint64_t seq = 0;  // per group, counted by every member alike
  CallDescription call;   // call.fp is complete (seq, group size, rejected)
  std::optional<std::string> own_error;  // this member's own arguments are invalid
  std::string name() const;              // "all_reduce (call #3 on the world group)"
};

// Throws InvalidArgument when `calls` (every member's, by group rank) disagree or a member
// rejected its arguments (this member: its own text).
void judge(const CallContext& ctx, std::span<const CallDescription> calls);

class LaneCall {
 public:
  // `round1_data`: what round 1 writes instead of the plan (all_to_all's counts), or empty.
  LaneCall(ShmLane& lane, const CallContext& ctx, const LanePlan& plan,
           std::span<const std::byte> round1_data = {});
  // The LaneCall moved to an owner that holds its own copy of the context.
  void rebind(const CallContext& ctx) { ctx_ = &ctx; }
  LanePlan& plan() { return plan_; }

  void queue() { ticket_ = lane_->take_ticket(); }  // in call order
  // Takes over a one-round call whose turn `ticket` the caller took and whose round 1 (this
  // plan's fingerprint and write(1)) it published itself (on_lane.cpp's small
  // all_reduce, when its peers were not there at once or disagreed): from the wait on.
  void resume(std::uint64_t ticket) {
    ticket_ = ticket;
    phase_ = Phase::Waiting;
  }
  // Moves as far as it can without blocking; returns whether anything moved. Throws the
  // verdict (InvalidArgument) in round 1 when the members disagree; the lane is then done
  // with this call on every member.
  bool advance();
  // advance() until done, at most `polls` more times, without the engine's waiting loop (no
  // clock, no progress on other operations): a blocking call whose peers are already there,
  // or arrive within a microsecond or so, finishes here. Returns done(). Throws as advance().
  bool spin(int polls) {
    for (int i = 0;; ++i) {
      advance();
      if (done()) return true;
      if (i == polls || !started()) return false;
    }
  }
  bool done() const { return phase_ == Phase::Done; }
  bool started() const { return phase_ != Phase::Queued; }
  void awaited(std::vector<int>& out) const;

 private:
  void check_agreement();
  void end();

  enum class Phase : std::uint8_t { Queued, Writing, Waiting, Done };
  ShmLane* lane_;
  const CallContext* ctx_;
  LanePlan plan_;
  std::span<const std::byte> round1_data_;
  std::uint64_t ticket_ = 0;
  std::uint64_t k_ = 1;  // the plan's round in progress
  Phase phase_ = Phase::Queued;
};

}  // namespace shmdist::coll
