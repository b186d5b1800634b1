// A collective as a schedule of point-to-point steps on the library's internal channel,
// driven by the engine's progress loop (engine/background.hpp), so that async collectives
// move while their rank blocks elsewhere.
//
// On the world group, when the segment has a collective area, the agreement and (for the
// collectives that have a plan for it) the data go through the lane instead: the schedule
// runs a LaneCall (coll/lane_call.hpp; round 1 carries every member's fingerprint in its slot
// header, so agreement costs no extra round), then any point-to-point steps. Blocking calls
// with a lane plan do not come here at all: they run their LaneCall in the caller's frame.
//
// Otherwise step 0 is the fingerprint exchange: each member sends its call's fingerprint to
// every other member and receives theirs; then every member computes the same verdict
// (coll/fingerprint.hpp). Only when all agree do the data steps run. Step k starts when
// every transfer of step k-1 has completed and its `after` action has run (local reductions,
// copies). Tags are (sequence number, step), so consecutive and concurrent collectives of
// one group, and point-to-point traffic (user channel), can never match each other's
// messages.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "coll/fingerprint.hpp"
#include "coll/lane_call.hpp"
#include "engine/engine.hpp"

namespace shmdist::coll {

// Everything a collective builder needs.
struct CallSetup {
  engine::Engine* engine = nullptr;
  GroupView group;
  std::uint64_t seq = 0;  // per group, counted by every member alike
  ShmLane* lane = nullptr;  // the world group's lane, when the segment has one
  bool blocking = false;    // the caller waits for the result (not async_op)
  // A job across hosts: the host of every global rank (hosts numbered from 0 in the order of
  // their lowest global rank); empty on one host. A group spanning hosts reduces, broadcasts
  // inside each host first (collectives.cpp, HostSplit).
  std::span<const int> host_of;
};

struct Transfer {
  enum class Dir : std::uint8_t { Send, Recv } dir;
  int peer;     // global rank
  Tensor view;  // what is sent, or where it is received (a view into a caller's tensor)
};

struct Step {
  std::vector<Transfer> transfers;
  std::function<void()> after;  // runs once every transfer of the step has completed
};

class Schedule final : public engine::BackgroundTask,
                       public std::enable_shared_from_this<Schedule> {
 public:
  // `error`: this member's own arguments are invalid (it still takes part in the
  // fingerprint exchange, so that every member learns it and none waits forever).
  Schedule(const CallSetup& setup, CallDescription call, std::optional<std::string> error);

  Step& add_step() { return steps_.emplace_back(); }
  bool on_lane() const { return lane_.has_value(); }
  // The lane's data plan (a collective that moves its data on the lane). A plan's `list`
  // is copied into the schedule (keep_list) and pointed there.
  void set_plan(const LanePlan& plan);
  // A blocking call's LaneCall that could not finish in its frame (Timeout, PeerFailure):
  // the schedule continues it in the background, from where it stands.
  void adopt(const LaneCall& call);
  void keep(const Tensor& t) { kept_.push_back(t); }  // storage the steps' views point into
  std::uint64_t bytes = 0;                           // for hang reports

  // Registers with the engine and returns the completion a Work refers to.
  std::shared_ptr<detail::Operation> start();

  bool advance() override;
  bool finished() const override { return finished_; }
  void abandon(std::exception_ptr error) override { finish(std::move(error)); }
  void awaited_peers(std::vector<int>& out) const override;
  std::string describe() const override { return ctx_.name(); }

 private:
  void start_step();
  bool advance_steps();
  bool advance_rounds();
  void finish(std::exception_ptr error);
  void judge_exchange();  // after step 0

  engine::Engine& engine_;
  std::vector<int> members_;  // ctx_.group.members points here
  CallContext ctx_;
  std::vector<std::byte> own_wire_;
  std::optional<LaneCall> lane_;
  bool adopted_ = false;     // lane_ came from a blocking call (it has its ticket)
  std::vector<Tensor> list_;  // the plan's list, when it has one
  std::vector<Tensor> wires_;  // peers' fingerprints, by group rank
  std::vector<Step> steps_;    // steps_[0] is the fingerprint exchange
  std::vector<Tensor> kept_;
  std::size_t step_ = 0;
  bool step_started_ = false;
  std::vector<std::shared_ptr<detail::Operation>> ops_;  // the current step's transfers
  std::vector<int> op_peers_;                            // and their peers (receives: >= 0)
  std::size_t first_pending_ = 0;
  std::shared_ptr<detail::Operation> handle_;
  bool finished_ = false;
};

// "all_reduce (call #3 on the world group)"
std::string call_name(Kind kind, const GroupView& group, std::uint64_t seq);
// A completed collective's completion, for blocking calls that finished in their frame.
std::shared_ptr<detail::Operation> completed_collective();
// The internal-channel tag of a collective's step.
int step_tag(std::uint64_t seq, std::size_t step);

}  // namespace shmdist::coll
