// Schedule: the step machine of point-to-point collectives.

#include "coll/schedule.hpp"

#include <cstring>

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
  if (setup.lane && wire_size(n) <= setup.lane->slot_size()) {
    lane_ = setup.lane;
    phase_ = LanePhase::Queued;
    return;
  }
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
  exchange.after = [this] { judge_exchange(); };
}

std::shared_ptr<detail::Operation> Schedule::start() {
  handle_ = std::make_shared<detail::Operation>();
  handle_->kind = detail::Operation::Kind::Collective;
  handle_->engine = engine_.weak_from_this();
  handle_->task = weak_from_this();
  handle_->view.nbytes = bytes;
  if (lane_) ticket_ = lane_->take_ticket();
  auto handle = handle_;
  engine_.add_task(shared_from_this());
  return handle;
}

void Schedule::judge_exchange() {
  const int n = group_.size();
  std::vector<CallDescription> calls(n);
  for (int j = 0; j < n; ++j)
    calls[j] = j == group_.me ? call_ : decode(static_cast<const std::byte*>(wires_[j].data_ptr()), n);
  judge(calls);
}

// Round 1's slot headers hold the fingerprints; all_to_all's counts are in its data.
void Schedule::judge_lane() {
  const int n = group_.size();
  std::vector<CallDescription> calls(n);
  for (int j = 0; j < n; ++j) {
    if (j == group_.me) {
      calls[j] = call_;
      continue;
    }
    const std::byte* slot = lane_->slot_of(group_.members[j]);
    std::memcpy(&calls[j].fp, slot, sizeof(Fingerprint));
    if (calls[j].fp.magic == kFingerprintMagic && has_splits(static_cast<Kind>(calls[j].fp.kind)))
      calls[j] = decode(slot + segment::kCollSlotHeader, n);
  }
  judge(calls);
}

void Schedule::judge(const std::vector<CallDescription>& calls) {
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
  if (phase_ != LanePhase::Done) {
    moved = advance_rounds();
    if (phase_ != LanePhase::Done || finished_) return moved;
    if (steps_.empty()) {
      finish(nullptr);
      return true;
    }
  }
  return advance_steps() || moved;
}

// The lane's rounds as a state machine that never blocks: each phase returns when what it
// needs from the peers is not there yet, and resumes there on the next call.
bool Schedule::advance_rounds() {
  bool moved = false;
  const int n = group_.size();
  for (;;) {
    switch (phase_) {
      case LanePhase::Queued:
        if (!lane_->is_turn(ticket_)) return moved;
        phase_ = LanePhase::Writing;
        [[fallthrough]];
      case LanePhase::Writing: {
        if (!lane_->can_write()) return moved;
        std::byte* slot = lane_->next_slot();
        std::memcpy(slot, &call_.fp, sizeof(Fingerprint));
        std::byte* data = slot + segment::kCollSlotHeader;
        if (round_k_ == 1 && has_splits(static_cast<Kind>(call_.fp.kind)))
          std::memcpy(data, own_wire_.data(), own_wire_.size());
        else if (!own_error_ && plan_.write)
          plan_.write(round_k_, data);
        lane_->publish();
        phase_ = LanePhase::Waiting;
        moved = true;
        [[fallthrough]];
      }
      case LanePhase::Waiting: {
        if (!lane_->all_arrived()) return moved;
        try {
          if (round_k_ == 1) judge_lane();
          if (plan_.read) {
            round_data_.resize(n);
            for (int j = 0; j < n; ++j)
              round_data_[j] = lane_->slot_of(group_.members[j]) + segment::kCollSlotHeader;
            plan_.read(round_k_, round_data_);
          }
        } catch (...) {
          lane_->release();
          lane_->end_turn();
          phase_ = LanePhase::Done;
          finish(std::current_exception());
          return true;
        }
        lane_->release();
        moved = true;
        if (round_k_++ == plan_.rounds) {
          lane_->end_turn();
          phase_ = LanePhase::Done;
          return true;
        }
        phase_ = LanePhase::Writing;
        break;
      }
      case LanePhase::Done:
        return moved;
    }
  }
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
  if (phase_ == LanePhase::Writing || phase_ == LanePhase::Waiting) {
    lane_->awaited(out, phase_ == LanePhase::Writing);
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
