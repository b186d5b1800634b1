#include "coll/on_lane.hpp"

#include <sched.h>

#include <cstring>

#include "coll/reduce.hpp"
#include "coll/tensor_views.hpp"

namespace shmdist::coll {

[[gnu::noinline]] void wait_on_lane(const CallSetup& s, LaneCall& call, const BlockedCall& what,
                                    std::uint64_t bytes) {
  const engine::WaitFocus focus{engine::kBlockedCollective, -1, nullptr, {}, bytes, &what};
  s.engine->wait_until(
      [&] {
        const bool moved = call.advance();
        return call.done() ? engine::Look::Done : moved ? engine::Look::Moved : engine::Look::Idle;
      },
      focus, s.engine->spin_policy().choose(s.lane->world()));
}

std::optional<Completion> small_all_reduce(const CallSetup& s, Tensor& tensor, ReduceOp op) {
  ShmLane& lane = *s.lane;
  const std::size_t bytes = tensor.nbytes();
  if (bytes > std::min(ShmLane::kInlineLimit, lane.slot_size() / 8 * 8) || !lane.idle() ||
      unsupported(op, tensor.dtype()))
    return std::nullopt;
  // Builder::take_context's fingerprint, through the Builder's own functions.
  Fingerprint fp;
  fingerprint_call(fp, s, Kind::AllReduce);
  fingerprint_data(fp, tensor.dtype(), tensor.numel());
  fingerprint_op(fp, op);
  const std::uint64_t ticket = lane.take_ticket();  // the lane is idle: this call's turn
  std::byte* const data = bytes_of(tensor);
  std::byte* const slot = lane.next_slot();
  std::memcpy(slot + ShmLane::kFingerprintAt, &fp, sizeof fp);
  if (bytes) std::memcpy(slot + ShmLane::kInlineAt, data, bytes);
  lane.publish();
  const int n = lane.world();
  {
    bool arrived = lane.all_arrived();
    if (cpus::oversubscribed(n, lane.cpus())) {
      // Crowded: a peer that has yet to publish may need this very CPU, so hand it over at
      // once (as the engine's waiter would at its first idle turn, a thousand or so
      // instructions of setting up later), and look once more when it comes back.
      if (!arrived) {
        sched_yield();
        arrived = lane.all_arrived();
      }
    } else {
      for (int i = 0; !arrived && i < kLanePolls; ++i) arrived = lane.all_arrived();
    }
    bool same = arrived;  // LaneCall::check_agreement's fast test
    for (int j = 0; j < n && same; ++j)
      if (j != s.group.me)
        same = std::memcmp(lane.slot_of(j) + ShmLane::kFingerprintAt, &fp, sizeof fp) == 0;
    if (same) {
      const std::byte* inline_inputs[16];
      std::vector<const std::byte*> heap;
      const std::byte** inputs =
          n <= 16 ? inline_inputs : (heap.resize(static_cast<std::size_t>(n)), heap.data());
      for (int j = 0; j < n; ++j) inputs[j] = lane.data_of(j, ShmLane::kInlineAt);
      inputs[s.group.me] = data;  // its own input, still there (LanePlan::read says why)
      reduce_in_order(op, tensor.dtype(), {inputs, static_cast<std::size_t>(n)}, data,
                      bytes / element_size(tensor.dtype()), n);
      lane.end_turn();
      return completed_collective();
    }
  }
  Builder b(s, Kind::AllReduce);
  b.tensor(tensor, "tensor");
  b.describe(tensor.dtype(), tensor.numel());
  b.op(op, tensor.dtype());
  return run_on_lane(s, b, plan_reduce(lane, tensor, op, -1, b.me()), bytes,
                     [&](Schedule& sch) { sch.keep(tensor); }, ticket);
}

}  // namespace shmdist::coll
