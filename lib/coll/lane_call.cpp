// LaneCall: the lane's rounds for one collective, and the agreement check.

#include "coll/lane_call.hpp"

#include <cstring>

#include <shmdist/distributed.hpp>

#include "engine/group_name.hpp"

namespace shmdist::coll {

std::string call_name(Kind kind, const GroupView& group, std::uint64_t seq) {
  return std::string(kind_name(kind)) + " (call #" + std::to_string(seq) + " on " +
         engine::group_name(group.id) + ")";
}

std::string CallContext::name() const {
  return call_name(static_cast<Kind>(call.fp.kind), group, seq);
}

void judge(const CallContext& ctx, std::span<const CallDescription> calls) {
  if (ctx.own_error) throw InvalidArgument(*ctx.own_error);
  if (auto why = verdict(calls, ctx.group.me, ctx.group.members, [&] { return ctx.name(); }))
    throw InvalidArgument(*why);
}

LaneCall::LaneCall(ShmLane& lane, const CallContext& ctx, const LanePlan& plan,
                   std::span<const std::byte> round1_data)
    : lane_(&lane), ctx_(&ctx), plan_(plan), round1_data_(round1_data) {}

bool LaneCall::advance() {
  bool moved = false;
  for (;;) {
    switch (phase_) {
      case Phase::Queued:
        if (!lane_->is_turn(ticket_)) return moved;
        phase_ = Phase::Writing;
        [[fallthrough]];
      case Phase::Writing: {
        std::byte* slot = lane_->next_slot();
        std::memcpy(slot + ShmLane::kFingerprintAt, &ctx_->call.fp, sizeof(Fingerprint));
        if (k_ == 1 && !round1_data_.empty())
          std::memcpy(slot + segment::kCollSlotHeader, round1_data_.data(), round1_data_.size());
        else if (!ctx_->own_error)
          plan_.write(k_, slot + plan_.at);
        lane_->publish();
        // While the peers catch up; round 1 only once the members agree (a mismatched call
        // writes nothing).
        if (k_ > 1) plan_.local(k_);
        phase_ = Phase::Waiting;
        moved = true;
        [[fallthrough]];
      }
      case Phase::Waiting: {
        if (!lane_->all_arrived()) return moved;
        if (k_ == 1) {
          try {
            check_agreement();
          } catch (...) {
            end();
            throw;
          }
        }
        if (k_ == 1 && !ctx_->own_error) plan_.local(k_);
        if (!ctx_->own_error) plan_.read(k_);
        moved = true;
        if (k_++ == plan_.rounds()) {
          end();
          return true;
        }
        phase_ = Phase::Writing;
        break;
      }
      case Phase::Done:
        return moved;
    }
  }
}

void LaneCall::end() {
  lane_->end_turn();
  phase_ = Phase::Done;
}

// Round 1's slot headers hold the fingerprints: when every peer's is byte for byte this
// member's own (Fingerprint has no padding), the calls agree; anything else (a rejected
// call, all_to_all's counts, a real mismatch) takes the full verdict.
void LaneCall::check_agreement() {
  const int n = ctx_->group.size();
  const Fingerprint& own = ctx_->call.fp;
  bool same = !ctx_->own_error && !has_splits(static_cast<Kind>(own.kind));
  for (int j = 0; j < n && same; ++j)
    if (j != ctx_->group.me) same = std::memcmp(lane_->slot_of(j) + ShmLane::kFingerprintAt, &own, sizeof own) == 0;
  if (same) return;
  std::vector<CallDescription> calls(n);
  for (int j = 0; j < n; ++j) {
    if (j == ctx_->group.me) {
      calls[j] = ctx_->call;
      continue;
    }
    const std::byte* slot = lane_->slot_of(j);
    std::memcpy(&calls[j].fp, slot + ShmLane::kFingerprintAt, sizeof(Fingerprint));
    if (calls[j].fp.magic == kFingerprintMagic && has_splits(static_cast<Kind>(calls[j].fp.kind)))
      calls[j] = decode(slot + segment::kCollSlotHeader, n);
  }
  judge(*ctx_, calls);
}

// Waiting: the peers behind in this call's round. Queued: the call waits for the lane's
// earlier calls, so for the peers those wait for (the lane's round is theirs); among them a
// peer that failed an earlier call by finalizing, whose turn on the lane never ends, so that
// this call too fails with PeerFailure naming it instead of waiting out its timeout.
void LaneCall::awaited(std::vector<int>& out) const {
  if (phase_ == Phase::Waiting || phase_ == Phase::Queued) lane_->awaited(out);
}

}  // namespace shmdist::coll
