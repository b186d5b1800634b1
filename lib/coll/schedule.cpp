// Schedule: the step machine of point-to-point collectives.

#include "coll/schedule.hpp"

#include "coll/reduce.hpp"
#include "coll/tensor_views.hpp"

#include <algorithm>
#include <cstring>

namespace shmdist::coll {

std::shared_ptr<detail::Operation> completed_collective() {
  // One per thread (thread-mode ranks share the process), never pending: a Work on it
  // waits for nothing and has no engine to ask.
  thread_local const std::shared_ptr<detail::Operation> done = [] {
    auto op = std::make_shared<detail::Operation>();
    op->kind = detail::Operation::Kind::Collective;
    op->complete();
    return op;
  }();
  return done;
}

int step_tag(std::uint64_t seq, std::size_t step) {
  constexpr int kBase = 1 << 16;  // tags below it are left free
  constexpr std::uint64_t kSeqWindow = 1 << 20;
  return kBase + static_cast<int>((seq % kSeqWindow) * 16 + step);
}

std::vector<int> HostSplit::leaders(int root) const {
  std::vector<int> out;
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    const std::vector<int>& members = hosts[h];
    const bool has_root = root >= 0 && std::find(members.begin(), members.end(), root) != members.end();
    out.push_back(has_root ? root : leader(h));
  }
  return out;
}

HostSplitPtr host_split(const GroupView& group, std::span<const int> host_of) {
  if (host_of.empty()) return nullptr;
  auto split = std::make_shared<HostSplit>();
  std::vector<int> ids;  // host id of split->hosts[i]
  bool shared = false;
  for (int j = 0; j < group.size(); ++j) {
    const int host = host_of[static_cast<std::size_t>(group.members[j])];
    const auto at = std::find(ids.begin(), ids.end(), host);
    if (at == ids.end()) {
      ids.push_back(host);
      split->hosts.push_back({j});
    } else {
      split->hosts[static_cast<std::size_t>(at - ids.begin())].push_back(j);
      shared = true;
    }
    if (j == group.me)
      split->mine = static_cast<int>(std::find(ids.begin(), ids.end(), host) - ids.begin());
  }
  if (split->hosts.size() < 2 || !shared) return nullptr;
  return split;
}

namespace {

// Bytes [0, n) of a byte tensor, sharing it.
Tensor first_bytes(const Tensor& t, std::size_t n) {
  return Tensor::from_blob(bytes_of(t), {static_cast<std::int64_t>(n)}, kUInt8, t.storage_handle());
}

// Wire `i` of a received message of wires (w bytes each), or zeros (a call that is not a
// shmdist collective, so a disagreement) when the message is too short to hold it.
void copy_wire(const Tensor& msg, std::size_t i, std::size_t w, std::byte* to) {
  if (msg.defined() && msg.nbytes() >= (i + 1) * w) std::memcpy(to, bytes_of(msg) + i * w, w);
  else std::memset(to, 0, w);
}

}  // namespace

Schedule::Schedule(const CallSetup& setup, CallDescription call, std::optional<std::string> error,
                   std::optional<FoldedReduce> fold)
    : engine_(*setup.engine), members_(setup.group.members.begin(), setup.group.members.end()) {
  const int n = static_cast<int>(members_.size());
  ctx_.group = setup.group;
  ctx_.group.members = members_;
  ctx_.seq = setup.seq;
  ctx_.call = std::move(call);
  ctx_.call.fp.seq = setup.seq;
  ctx_.call.fp.group_size = static_cast<std::uint32_t>(n);
  ctx_.call.fp.rejected = error ? 1 : 0;
  ctx_.own_error = std::move(error);
  if (has_splits(static_cast<Kind>(ctx_.call.fp.kind)) || !setup.lane) {
    own_wire_.resize(wire_size(n));
    encode(ctx_.call, n, own_wire_.data());
  }
  if (setup.lane && (!has_splits(static_cast<Kind>(ctx_.call.fp.kind)) ||
                     wire_size(n) <= setup.lane->slot_size())) {
    lane_.emplace(*setup.lane, ctx_, LanePlan{}, std::span<const std::byte>(own_wire_));
    return;
  }
  // monitored_barrier keeps the exchange: its group rank 0 names every member it has not
  // heard from, which it learns only by hearing from each directly.
  if (static_cast<Kind>(ctx_.call.fp.kind) != Kind::MonitoredBarrier)
    if (setup.split) {
      if (fold && !ctx_.own_error) fold_ = std::move(fold);
      agree_on_tree(setup.split);
      return;
    }
  Step& exchange = add_step();
  wires_.resize(n);
  const Tensor own = Tensor::from_blob(own_wire_.data(),
                                       {static_cast<std::int64_t>(own_wire_.size())}, kUInt8);
  for (int j = 0; j < n; ++j) {
    if (j == ctx_.group.me) continue;
    wires_[j] = empty({static_cast<std::int64_t>(own_wire_.size())}, kUInt8);
    exchange.transfers.push_back({Transfer::Dir::Send, members_[j], own});
    exchange.transfers.push_back({Transfer::Dir::Recv, members_[j], wires_[j]});
  }
  exchange.after = [this] { judge_exchange(); };
}

void Schedule::set_plan(const LanePlan& plan) {
  LanePlan& p = lane_->plan();
  p = plan;
  if (plan.list) {
    list_ = *plan.list;
    p.list = &list_;
  }
}

void Schedule::adopt(const LaneCall& call) {
  const LanePlan plan = lane_->plan();
  lane_.emplace(call);
  lane_->rebind(ctx_);
  lane_->plan().list = plan.list;
  adopted_ = true;
}

std::shared_ptr<detail::Operation> Schedule::start() {
  handle_ = std::make_shared<detail::Operation>();
  handle_->kind = detail::Operation::Kind::Collective;
  handle_->engine = engine_.weak_from_this();
  handle_->task = weak_from_this();
  handle_->view.nbytes = bytes;
  if (lane_ && !adopted_) lane_->queue();
  auto handle = handle_;
  engine_.add_task(shared_from_this());
  return handle;
}

void Schedule::judge_exchange() {
  const int n = ctx_.group.size();
  std::vector<CallDescription> calls(n);
  for (int j = 0; j < n; ++j)
    calls[j] = j == ctx_.group.me ? ctx_.call
                                  : decode(static_cast<const std::byte*>(wires_[j].data_ptr()), n);
  judge(ctx_, calls);
}

// The agreement of a group split across hosts, along the host tree (HostSplit's hosts and
// leaders, the same on every member whatever its call, so members making different calls
// still exchange the same messages):
//   step 0, inside each host: every member sends its wire [+ its input] to its host's leader;
//   step 1, between hosts: every leader sends its host's wires [+ the host's partial] to
//           every other leader, one message per pair: the only messages between hosts;
//   step 2, inside each host: every leader sends every member's wire [+ the result] to its
//           host's members.
// After step 1 a leader holds every member's wire, after step 2 every member does: each
// judges them with the same verdict() as the exchange, so every member raises the same
// InvalidArgument on a mismatch, and the same messages were sent and received whatever the
// calls, so nothing is left behind and the group goes on. A leader's verdict waits until
// step 2 has told its host. A payload rides only where its sender knows that the calls it
// covers agree (its host's, for a partial; all, for a result), and the receivers take
// messages of any size: a member whose call differs sends other lengths, or none.
void Schedule::agree_on_tree(HostSplitPtr split) {
  const int me = ctx_.group.me;
  const std::size_t w = own_wire_.size(), n = members_.size();
  const std::size_t data = fold_ ? fold_->tensor.nbytes() : 0;
  Tree& t = tree_.emplace();
  t.split = std::move(split);
  const std::vector<std::vector<int>>& hosts = t.split->hosts;
  const std::vector<int>& mates = t.mates();
  const std::size_t lp = t.split->leader_place(static_cast<std::size_t>(t.split->mine));
  const int lead = mates[lp];
  // Sized once: add_step() would invalidate references to earlier steps, and a small call's
  // cost is mostly allocations (each vector grown, each tensor made, is one or more).
  steps_.resize(3);
  const bool leads = me == lead;
  steps_[0].transfers.reserve(leads ? mates.size() - 1 : 1);
  steps_[1].transfers.reserve(leads ? 2 * (hosts.size() - 1) : 0);
  steps_[2].transfers.reserve(leads ? mates.size() - 1 : 1);
  // A receive of any size needs no buffer of its own: one empty tensor's storage serves them
  // all (each Transfer still holds its own copy of the handle).
  static const Tensor no_view = empty({0}, kUInt8);
  auto any_size = [](Step& step, int peer, Tensor* landing) {
    step.transfers.push_back({Transfer::Dir::Recv, peer, no_view, landing});
  };
  if (!leads) {
    Tensor up = empty({static_cast<std::int64_t>(w + data)}, kUInt8);
    std::memcpy(bytes_of(up), own_wire_.data(), w);
    if (data) std::memcpy(bytes_of(up) + w, fold_->tensor.data_ptr(), data);
    steps_[0].transfers.push_back({Transfer::Dir::Send, members_[lead], up});
    any_size(steps_[2], members_[lead], &t.down);
    steps_[2].after = [this] { judge_down(); };
    return;
  }
  t.from_mates.resize(mates.size());
  for (std::size_t i = 0; i < mates.size(); ++i)
    if (i != lp) any_size(steps_[0], members_[mates[i]], &t.from_mates[i]);
  steps_[0].after = [this] { gather_host(); };
  t.across = empty({static_cast<std::int64_t>(mates.size() * w + data)}, kUInt8);
  t.down = empty({static_cast<std::int64_t>(n * w + data)}, kUInt8);
  t.from_leaders.resize(hosts.size());
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    if (static_cast<int>(h) == t.split->mine) continue;
    const int other = members_[static_cast<std::size_t>(t.split->leader(h))];
    steps_[1].transfers.push_back({Transfer::Dir::Send, other, t.across});
    any_size(steps_[1], other, &t.from_leaders[h]);
  }
  steps_[1].after = [this] { judge_hosts(); };
  for (std::size_t i = 0; i < mates.size(); ++i)
    if (i != lp) steps_[2].transfers.push_back({Transfer::Dir::Send, members_[mates[i]], t.down});
  steps_[2].after = [this] {
    if (tree_->verdict) std::rethrow_exception(tree_->verdict);
  };
}

// The leader, its host's messages in: its host's wires into `across`; with a fold, the
// host's partial after them when every mate's call is the leader's own and its input that
// call's size, else the message goes without one (a size that differs, which only a corrupt
// peer sends, is this leader's verdict: it has no partial of its own host either).
void Schedule::gather_host() {
  Tree& t = *tree_;
  const std::vector<int>& mates = t.mates();
  const std::size_t lp = t.split->leader_place(static_cast<std::size_t>(t.split->mine));
  const std::size_t w = own_wire_.size();
  std::memcpy(bytes_of(t.across) + lp * w, own_wire_.data(), w);
  bool agree = true;
  for (std::size_t i = 0; i < mates.size(); ++i) {
    if (i == lp) continue;
    copy_wire(t.from_mates[i], 0, w, bytes_of(t.across) + i * w);
    agree = agree && std::memcmp(bytes_of(t.across) + i * w, own_wire_.data(), w) == 0;
  }
  if (!fold_) return;
  const std::size_t data = fold_->tensor.nbytes();
  for (std::size_t i = 0; i < mates.size() && agree; ++i) {
    if (i == lp) continue;
    const std::size_t got = t.from_mates[i].nbytes();
    if (got == w + data) continue;
    agree = false;
    // The same call as this member's with input of another size: no shmdist rank sends it.
    // Without a partial of its own host the leader cannot reduce (judge_hosts raises this).
    const int who = members_[static_cast<std::size_t>(mates[i])];
    t.verdict = std::make_exception_ptr(
        Error(ctx_.name() + ": global rank " + std::to_string(who) + ", a member on this host, "
              "sent " + std::to_string(got - std::min(got, w)) + " bytes of input, where every "
              "call agreed on " + std::to_string(data) + "; a corrupt peer or mismatched "
              "builds: rebuild every rank from the same version"));
  }
  if (!agree) {
    for (Transfer& x : steps_[1].transfers)
      if (x.dir == Transfer::Dir::Send) x.view = first_bytes(t.across, mates.size() * w);
    return;
  }
  std::byte* partial = bytes_of(t.across) + mates.size() * w;
  if (mates.size() == 1) {
    std::memcpy(partial, fold_->tensor.data_ptr(), data);
    return;
  }
  std::vector<const std::byte*> inputs(mates.size());  // by place: group-rank order
  for (std::size_t i = 0; i < mates.size(); ++i)
    inputs[i] = i == lp ? bytes_of(fold_->tensor) : bytes_of(t.from_mates[i]) + w;
  fold_reduce(fold_->inside, inputs, partial);
}

void Schedule::fold_reduce(ReduceOp op, std::span<const std::byte* const> inputs,
                           std::byte* out) const {
  reduce_in_order(op, fold_->tensor.dtype(), inputs, out,
                  static_cast<std::size_t>(fold_->tensor.numel()), ctx_.group.size());
}

// The leader, the other leaders' messages in: every member's wire into `down`, the verdict
// kept for after step 2; with a fold and agreement, the result of the partials in host order
// into `down` after the wires and into the tensor. Otherwise `down` goes with the wires only.
void Schedule::judge_hosts() {
  Tree& t = *tree_;
  const std::vector<std::vector<int>>& hosts = t.split->hosts;
  const std::size_t w = own_wire_.size(), n = members_.size();
  for (std::size_t h = 0; h < hosts.size(); ++h)
    for (std::size_t i = 0; i < hosts[h].size(); ++i) {
      std::byte* to = bytes_of(t.down) + static_cast<std::size_t>(hosts[h][i]) * w;
      if (static_cast<int>(h) == t.split->mine) std::memcpy(to, bytes_of(t.across) + i * w, w);
      else copy_wire(t.from_leaders[h], i, w, to);
    }
  bool with_result = false;
  try {
    judge_tree_wires();
    if (t.verdict) std::rethrow_exception(t.verdict);  // gather_host's: a corrupt mate
    if (fold_) {
      const std::size_t data = fold_->tensor.nbytes();
      std::vector<const std::byte*> partials(hosts.size());
      for (std::size_t h = 0; h < hosts.size(); ++h) {
        const Tensor& msg = static_cast<int>(h) == t.split->mine ? t.across : t.from_leaders[h];
        const std::size_t at = hosts[h].size() * w;
        if (msg.nbytes() != at + data)
          throw Error(ctx_.name() + ": the leader of another host, global rank " +
                      std::to_string(members_[static_cast<std::size_t>(t.split->leader(h))]) +
                      ", sent " + std::to_string(msg.nbytes() - std::min(msg.nbytes(), at)) +
                      " bytes of its host's partial, where every call agreed on " +
                      std::to_string(data) + "; a corrupt peer or mismatched builds: rebuild "
                      "every rank from the same version");
        partials[h] = bytes_of(msg) + at;
      }
      std::byte* result = bytes_of(t.down) + n * w;
      fold_reduce(fold_->across, partials, result);
      std::memcpy(bytes_of(fold_->tensor), result, data);
      with_result = true;
    }
  } catch (...) {
    t.verdict = std::current_exception();
  }
  if (fold_ && !with_result)
    for (Transfer& x : steps_[2].transfers) x.view = first_bytes(t.down, n * w);
}

// A member that is not its host's leader, the leader's message in: the same verdict as every
// member's; with a fold and agreement, the result into the tensor.
void Schedule::judge_down() {
  Tree& t = *tree_;
  const std::size_t w = own_wire_.size(), n = members_.size();
  const Tensor got = t.down;
  if (!got.defined() || got.nbytes() < n * w) {  // too short for every wire: zeros for those missing
    t.down = empty({static_cast<std::int64_t>(n * w)}, kUInt8);
    for (std::size_t j = 0; j < n; ++j) copy_wire(got, j, w, bytes_of(t.down) + j * w);
  }
  judge_tree_wires();
  if (!fold_) return;
  const std::size_t data = fold_->tensor.nbytes();
  const int lead = t.split->leader(static_cast<std::size_t>(t.split->mine));
  if (got.nbytes() != n * w + data)
    throw Error(ctx_.name() + ": this host's leader, global rank " +
                std::to_string(members_[static_cast<std::size_t>(lead)]) +
                ", sent no result although every member's call agreed: it failed after the "
                "agreement (its own exception says why)");
  std::memcpy(bytes_of(fold_->tensor), bytes_of(got) + n * w, data);
}

void Schedule::judge_tree_wires() {
  const int n = ctx_.group.size();
  const std::size_t w = own_wire_.size();
  std::vector<CallDescription> calls(n);
  for (int j = 0; j < n; ++j)
    calls[j] = j == ctx_.group.me ? ctx_.call
                                  : decode(bytes_of(tree_->down) + static_cast<std::size_t>(j) * w, n);
  judge(ctx_, calls);
}

engine::MatchKey Schedule::step_key(std::size_t step) const {
  return {ctx_.group.id, ctx_.group.sig, step_tag(ctx_.seq, step), transport::kInternalChannel};
}

void Schedule::start_step() {
  const engine::MatchKey key = step_key(step_);
  const Step& step = steps_[step_];
  // This step's receives, when the step before posted them (receive_early): all of them.
  std::vector<std::shared_ptr<detail::Operation>>& posted = taken_;
  posted.swap(early_);
  early_.clear();
  ops_.clear();
  op_peers_.clear();
  ops_.reserve(step.transfers.size());
  op_peers_.reserve(step.transfers.size());
  first_pending_ = 0;
  std::size_t next_posted = 0;
  for (const Transfer& t : step.transfers) {
    if (t.dir == Transfer::Dir::Send) {
      ops_.push_back(engine_.isend(t.view, t.peer, key));
      op_peers_.push_back(-1);
    } else {
      ops_.push_back(next_posted < posted.size() ? std::move(posted[next_posted++])
                                                 : post_receive(t, step_));
      op_peers_.push_back(t.peer);
    }
  }
  posted.clear();
  const std::size_t next = step_ + 1;
  if (next < steps_.size() && steps_[next].receive_early)
    for (const Transfer& t : steps_[next].transfers)
      if (t.dir == Transfer::Dir::Recv) early_.push_back(post_receive(t, next));
}

std::shared_ptr<detail::Operation> Schedule::post_receive(const Transfer& t, std::size_t step) {
  static const std::vector<int> no_candidates;
  return engine_.irecv(t.view, t.peer, step_key(step), no_candidates, t.landing != nullptr,
                       t.consumer);
}

bool Schedule::advance() {
  if (finished_) return false;
  bool moved = false;
  if (lane_ && !lane_->done()) {
    try {
      moved = lane_->advance();
    } catch (...) {
      finish(std::current_exception());
      return true;
    }
    if (!lane_->done()) return moved;
    if (steps_.empty()) {
      finish(nullptr);
      return true;
    }
  }
  return advance_steps() || moved;
}

bool Schedule::advance_steps() {
  if (failing_) return fail_when_settled(failing_);
  bool moved = false;
  for (;;) {
    if (!step_started_) {
      step_started_ = true;  // first: a step whose start throws is not started again
      moved = true;
      try {
        start_step();
      } catch (...) {
        fail_when_settled(std::current_exception());
        return true;
      }
    }
    while (first_pending_ < ops_.size() && !ops_[first_pending_]->pending()) ++first_pending_;
    if (first_pending_ < ops_.size()) return moved;
    for (const auto& op : ops_) {
      if (op->status == detail::Operation::Status::Failed) {
        fail_when_settled(op->error);
        return true;
      }
    }
    for (std::size_t i = 0; i < ops_.size(); ++i)
      if (Tensor* landing = steps_[step_].transfers[i].landing) *landing = ops_[i]->keep;
    try {
      if (steps_[step_].after) steps_[step_].after();
    } catch (...) {
      fail_when_settled(std::current_exception());
      return true;
    }
    moved = true;
    step_started_ = false;
    if (++step_ == steps_.size()) {
      finish(nullptr);
      return true;
    }
  }
}

bool Schedule::withdraw_early() {
  bool settled = true;
  for (const auto& op : early_)
    if (op->pending() && !engine_.cancel_receive(*op)) settled = false;
  return settled;
}

// The call fails with `error` once the next step's receives, posted early, have settled:
// those still waiting for their message are withdrawn (with honest peers, all of them when
// the calls disagree: nobody sends data then), but one a message already streams into (a
// peer a step ahead, when this member's step failed) is let finish, so that no byte lands in
// the caller's tensor after its Work failed. Returns whether the call is finished.
bool Schedule::fail_when_settled(std::exception_ptr error) {
  if (!withdraw_early()) {
    failing_ = std::move(error);
    return false;
  }
  finish(std::move(error));
  return true;
}

void Schedule::awaited_peers(std::vector<int>& out) const {
  if (finished_) return;
  if (lane_ && !lane_->done()) {
    lane_->awaited(out);
    return;
  }
  if (failing_) {  // only the early receives a message streams into (fail_when_settled)
    if (step_ + 1 >= steps_.size()) return;
    std::size_t i = 0;
    for (const Transfer& t : steps_[step_ + 1].transfers)
      if (t.dir == Transfer::Dir::Recv && i < early_.size() && early_[i++]->pending())
        out.push_back(t.peer);
    return;
  }
  if (!step_started_) return;
  for (std::size_t i = first_pending_; i < ops_.size(); ++i)
    if (op_peers_[i] >= 0 && ops_[i]->pending()) out.push_back(op_peers_[i]);
}

void Schedule::finish(std::exception_ptr error) {
  if (finished_) return;
  finished_ = true;
  if (handle_) {
    if (error) handle_->fail(std::move(error));
    else handle_->complete();
  }
  ops_.clear();
  // Early receives still posted (abandon(): the engine failed its receives already, so
  // normally none): withdrawn, as fail_when_settled does.
  withdraw_early();
  early_.clear();
  taken_.clear();
  failing_ = nullptr;
  steps_.clear();
  kept_.clear();
  wires_.clear();
  tree_.reset();
  fold_.reset();
}

}  // namespace shmdist::coll
