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
// (coll/fingerprint.hpp). Only when all agree do the data steps run. A group split across
// hosts agrees along the host tree instead (steps 0-2, Schedule::agree_on_tree), so that one
// message crosses between each pair of hosts' leaders; a small all_reduce rides in those
// very messages (FoldedReduce) and has no data steps at all. Step k starts when
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

struct HostSplit;
using HostSplitPtr = std::shared_ptr<const HostSplit>;

// Everything a collective builder needs.
struct CallSetup {
  engine::Engine* engine = nullptr;
  GroupView group;
  std::uint64_t seq = 0;  // per group, counted by every member alike
  ShmLane* lane = nullptr;  // the world group's lane, when the segment has one
  bool blocking = false;    // the caller waits for the result (not async_op)
  // A job across hosts, a group spanning them: how its members sit on the hosts (host_split;
  // the caller computes it once per group and keeps it), or null (one host, or the flat
  // schedule serves). Such a group reduces and broadcasts inside each host first
  // (reduce_schedules.hpp, collectives.cpp; HostSplit).
  HostSplitPtr split;
};

// A group whose members sit on several hosts, some host holding two or more of them. Its
// agreement travels the host tree (Schedule::agree_on_tree) and its reductions are evaluated
// host by host (reduce_schedules.cpp, reduce_members), whichever schedule moves the data; a small
// all_reduce and every broadcast go inside each host first (shared memory), then among one
// leader per host (the only messages between hosts), then inside each host again; a large
// all_reduce on hosts of equal size likewise, but among each column of the hosts' members
// (reduce_schedules.hpp, reduce_by_columns) instead of the leaders alone. Hosts are
// taken in the order of their first member's group rank, each host's members in group-rank
// order. Host h's leader is its member at place h mod (its size): on hosts that share a
// machine's CPUs (containers on one box, emulated hosts), ranks bound round robin by their
// place would otherwise put every host's leader, and all the traffic between hosts, on the
// same CPU (on 2 emulated hosts x 2 ranks bound that way, 4 B all_reduce took 43-44 us with
// first members leading and 31.5 us spread, docs/hosts.md); on separate machines it changes
// nothing. Who leads changes no result: reductions keep the order above. For broadcast the
// root leads its host.
struct HostSplit {
  std::vector<std::vector<int>> hosts;  // group ranks, per host
  int mine = 0;                         // this member's host
  // Host h's leader: its place in hosts[h], and its group rank.
  std::size_t leader_place(std::size_t h) const { return h % hosts[h].size(); }
  int leader(std::size_t h) const { return hosts[h][leader_place(h)]; }
  // Each host's leader (group rank); `root` (a group rank, or -1) leads its own host.
  std::vector<int> leaders(int root) const;
};

// The split of `group` given the host of every global rank (`host_of`: hosts numbered from 0
// in the order of their lowest global rank; empty on one host), or null when the flat
// schedule serves as well: the job is on one host, the group inside one host, or every host
// holds one member (then the host order is the group-rank order and the flat schedule's
// result is the same bits). Fixed for a group's life: callers compute it once per group
// (CallSetup::split), not per call.
HostSplitPtr host_split(const GroupView& group, std::span<const int> host_of);

// A reduction that rides in the host tree's agreement messages (a small all_reduce across
// hosts, reduce_schedules.hpp): each member's input goes up with its fingerprint, each host's
// partial goes across with its host's fingerprints, the result comes down with everyone's.
// `tensor` is read when the call starts and written only once every member's call is known
// to agree, so a mismatch leaves it as it was.
struct FoldedReduce {
  Tensor tensor;
  // The ops of reduce_in_order (coll/reduce.hpp) over a host's members' inputs in group-rank
  // order, and over the hosts' partials in host order (reduce_schedules.hpp, folded_reduce).
  ReduceOp inside = ReduceOp::SUM, across = ReduceOp::SUM;
};

struct Transfer {
  enum class Dir : std::uint8_t { Send, Recv } dir;
  int peer;     // global rank
  Tensor view;  // what is sent, or where it is received (a view into a caller's tensor)
  // A receive of any size (the host tree's messages, whose length depends on the sender's
  // call): the message's bytes land here once the step has completed; `view` is unused.
  Tensor* landing = nullptr;
  // A receive whose bytes go to this as they arrive (a StreamingReduce); `view` is then only
  // where a transport may land them first.
  std::shared_ptr<transport::ByteConsumer> consumer = nullptr;
};

struct Step {
  std::vector<Transfer> transfers;
  std::function<void()> after;  // runs once every transfer of the step has completed
  // Its receives are posted when the step before it starts rather than when it starts
  // itself, so that a peer a step ahead sends straight into their memory, not into an
  // unexpected message's buffer (one allocation and one copy of the message more). The
  // builder sets it only where that memory is free while the step before runs. The first
  // data step's are posted with the agreement's last step: no member sends data before it
  // knows that every call agrees, so a receive into the caller's tensor gets bytes only if
  // they do. A call that fails withdraws those no message has reached (all of them when the
  // calls disagree) and waits for those one streams into (Schedule::fail_when_settled).
  bool receive_early = false;
};

class Schedule final : public engine::BackgroundTask,
                       public std::enable_shared_from_this<Schedule> {
 public:
  // `error`: this member's own arguments are invalid (it still takes part in the
  // fingerprint exchange, so that every member learns it and none waits forever).
  // `fold`: a small all_reduce across hosts whose data rides in the agreement (only when the
  // group is split across hosts and this member's arguments are valid).
  Schedule(const CallSetup& setup, CallDescription call, std::optional<std::string> error,
           std::optional<FoldedReduce> fold = std::nullopt);

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
  // The match key of step `step`'s messages (its sends and its receives alike).
  engine::MatchKey step_key(std::size_t step) const;
  // Posts the receive `t` of step `step`.
  std::shared_ptr<detail::Operation> post_receive(const Transfer& t, std::size_t step);
  // Withdraws the early receives no message has reached; returns whether none is left
  // pending (a message streams into those that are).
  bool withdraw_early();
  bool advance_steps();
  bool advance_rounds();
  void finish(std::exception_ptr error);
  bool fail_when_settled(std::exception_ptr error);
  void judge_exchange();  // after step 0
  void agree_on_tree(HostSplitPtr split);
  // The fold's reduction (`op`: fold_->inside or across) of `inputs` into `out`.
  void fold_reduce(ReduceOp op, std::span<const std::byte* const> inputs, std::byte* out) const;
  void gather_host();    // the leader, after step 0
  void judge_hosts();    // the leader, after step 1
  void judge_down();     // every member, after step 2
  // The calls of every member, from the wires in tree_.down (by group rank), judged.
  void judge_tree_wires();

  engine::Engine& engine_;
  std::vector<int> members_;  // ctx_.group.members points here
  CallContext ctx_;
  std::vector<std::byte> own_wire_;
  std::optional<LaneCall> lane_;
  bool adopted_ = false;     // lane_ came from a blocking call (it has its ticket)
  std::vector<Tensor> list_;  // the plan's list, when it has one
  std::vector<Tensor> wires_;  // peers' fingerprints, by group rank
  // The host tree's agreement (agree_on_tree): a message's wires first, then the fold's
  // payload when it carries one.
  struct Tree {
    // No default member initializers here: with one, clang finds std::optional<Tree> not
    // default-constructible inside Schedule (emplace() fails to compile); emplace()
    // value-initializes, and agree_on_tree sets every field it reads.
    HostSplitPtr split;  // the group's (CallSetup::split)
    const std::vector<int>& mates() const { return split->hosts[static_cast<std::size_t>(split->mine)]; }
    std::vector<Tensor> from_mates;    // the leader: step 0's messages, by place in its host
    Tensor across;                     // the leader: its host's wires [+ partial] (step 1)
    std::vector<Tensor> from_leaders;  // the leader: step 1's messages, by host
    Tensor down;  // every member's wire by group rank [+ result]: the leader's, or received
    // The leader's (judge_hosts; gather_host's for a mate whose input has another size than
    // the calls agree on), thrown after step 2 has told its host.
    std::exception_ptr verdict;
  };
  std::optional<Tree> tree_;
  std::optional<FoldedReduce> fold_;
  std::vector<Step> steps_;    // steps_[0] is the fingerprint exchange
  std::vector<Tensor> kept_;
  std::size_t step_ = 0;
  bool step_started_ = false;
  std::vector<std::shared_ptr<detail::Operation>> ops_;  // the current step's transfers
  std::vector<int> op_peers_;                            // and their peers (receives: >= 0)
  // The next step's receives, posted with this one (Step::receive_early), in its order.
  std::vector<std::shared_ptr<detail::Operation>> early_;
  // start_step's hand-over of early_ to the step it starts: swapped with early_ (and
  // cleared) so that both keep their capacity from step to step.
  std::vector<std::shared_ptr<detail::Operation>> taken_;
  // The error the call fails with once early_ has settled (fail_when_settled).
  std::exception_ptr failing_;
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
