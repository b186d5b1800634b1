// Schedule: the step machine of point-to-point collectives.

#include "coll/schedule.hpp"

namespace shmdist::coll {

std::string call_name(Kind kind, const GroupView& group, std::uint64_t seq) {
  return std::string(kind_name(kind)) + " (call #" + std::to_string(seq) + " on " +
         (group.id == 0 ? std::string("the world group") : "group #" + std::to_string(group.id)) +
         ")";
}

int step_tag(std::uint64_t seq, std::size_t step) {
  constexpr int kBase = 1 << 16;  // barrier() uses tags 0..log2(world) on the same channel
  constexpr std::uint64_t kSeqWindow = 1 << 20;
  return kBase + static_cast<int>((seq % kSeqWindow) * 16 + step);
}

Schedule::Schedule(const CallSetup& setup, CallDescription call, std::optional<std::string> error)
    : engine_(*setup.engine),
      group_(setup.group),
      seq_(setup.seq),
      call_(std::move(call)),
      own_error_(std::move(error)),
      what_(call_name(static_cast<Kind>(call_.fp.kind), group_, seq_)) {
  const int n = group_.size();
  call_.fp.seq = seq_;
  call_.fp.group_size = static_cast<std::uint32_t>(n);
  call_.fp.rejected = own_error_ ? 1 : 0;
  own_wire_.resize(wire_size(n));
  encode(call_, n, own_wire_.data());
  Step& exchange = add_step();
  wires_.resize(n);
  const Tensor own = Tensor::from_blob(own_wire_.data(),
                                       {static_cast<std::int64_t>(own_wire_.size())}, kUInt8);
  for (int j = 0; j < n; ++j) {
    if (j == group_.me) continue;
    wires_[j] = empty({static_cast<std::int64_t>(own_wire_.size())}, kUInt8);
    exchange.transfers.push_back({Transfer::Dir::Send, group_.members[j], own});
    exchange.transfers.push_back({Transfer::Dir::Recv, group_.members[j], wires_[j]});
  }
  exchange.after = [this] { judge(); };
}

std::shared_ptr<detail::Operation> Schedule::start() {
  handle_ = std::make_shared<detail::Operation>();
  handle_->kind = detail::Operation::Kind::Collective;
  handle_->engine = engine_.weak_from_this();
  handle_->task = weak_from_this();
  handle_->view.nbytes = bytes;
  auto handle = handle_;
  engine_.add_task(shared_from_this());
  return handle;
}

void Schedule::judge() {
  const int n = group_.size();
  std::vector<CallDescription> calls(n);
  for (int j = 0; j < n; ++j)
    calls[j] = j == group_.me ? call_ : decode(static_cast<const std::byte*>(wires_[j].data_ptr()), n);
  if (own_error_) throw InvalidArgument(*own_error_);
  if (auto why = verdict(calls, group_.me, group_.members, what_)) throw InvalidArgument(*why);
}

void Schedule::start_step() {
  static const std::vector<int> no_candidates;
  const engine::MatchKey key{group_.id, group_.sig, step_tag(seq_, step_), transport::kInternalChannel};
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
  if (finished_ || !step_started_) return;
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
