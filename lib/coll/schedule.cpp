// Schedule: the step machine of point-to-point collectives.

#include "coll/schedule.hpp"

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

Schedule::Schedule(const CallSetup& setup, CallDescription call, std::optional<std::string> error)
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

void Schedule::start_step() {
  static const std::vector<int> no_candidates;
  const engine::MatchKey key{ctx_.group.id, ctx_.group.sig, step_tag(ctx_.seq, step_),
                            transport::kInternalChannel};
  ops_.clear();
  op_peers_.clear();
  first_pending_ = 0;
  for (const Transfer& t : steps_[step_].transfers) {
    if (t.dir == Transfer::Dir::Send) {
      ops_.push_back(engine_.isend(t.view, t.peer, key));
      op_peers_.push_back(-1);
    } else {
      ops_.push_back(engine_.irecv(t.view, t.peer, key, no_candidates));
      op_peers_.push_back(t.peer);
    }
  }
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
  bool moved = false;
  for (;;) {
    if (!step_started_) {
      start_step();
      step_started_ = true;
      moved = true;
    }
    while (first_pending_ < ops_.size() && !ops_[first_pending_]->pending()) ++first_pending_;
    if (first_pending_ < ops_.size()) return moved;
    for (const auto& op : ops_) {
      if (op->status == detail::Operation::Status::Failed) {
        finish(op->error);
        return true;
      }
    }
    try {
      if (steps_[step_].after) steps_[step_].after();
    } catch (...) {
      finish(std::current_exception());
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

void Schedule::awaited_peers(std::vector<int>& out) const {
  if (finished_) return;
  if (lane_ && !lane_->done()) {
    lane_->awaited(out);
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
  steps_.clear();
  kept_.clear();
  wires_.clear();
}

}  // namespace shmdist::coll
