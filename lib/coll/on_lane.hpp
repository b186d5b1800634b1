// A collective whose data moves on the world lane (coll/shm_lane.hpp), from its builder:
// blocking, in the caller's frame through a LaneCall and the engine's waiter; async, or cut
// short, as a background Schedule.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <shmdist/distributed.hpp>

#include "base/cpus.hpp"
#include "coll/builder.hpp"
#include "coll/lane_call.hpp"
#include "coll/lane_plans.hpp"
#include "coll/schedule.hpp"
#include "engine/engine.hpp"

namespace shmdist::coll {

// What a blocking lane call tells the engine's waiter about itself: its name, whom it waits for.
class BlockedCall final : public engine::WaitSubject {
 public:
  BlockedCall(const LaneCall& call, const CallContext& ctx) : call_(call), ctx_(ctx) {}
  void awaited_peers(std::vector<int>& out) const override { call_.awaited(out); }
  std::string describe() const override { return ctx_.name(); }

 private:
  const LaneCall& call_;
  const CallContext& ctx_;
};

// A blocking lane call in the engine's waiter: the hang report shows a collective of `bytes`
// (named by `what`, which also says whom it waits for); every advance() that moved is a
// Look::Moved (the spin time restarts); it spins as for every member of the world awake,
// however many sleep now (run_on_lane says why). Out of line: inlined into run_on_lane, GCC 12
// warns (-Wmaybe-uninitialized, a false positive) about the Builder of barrier().
void wait_on_lane(const CallSetup& s, LaneCall& call, const BlockedCall& what,
                  std::uint64_t bytes);

// Polls of the lane before a blocking call enters the engine's waiting loop.
inline constexpr int kLanePolls = 256;

// A collective whose data moves on the world lane (b.ok()). Blocking: in the caller's frame,
// without allocating; if the wait ends early (Timeout, PeerFailure) the call goes on in a
// background schedule, as every unfinished collective does. Async: a background schedule.
// `keep(sch)` hands a schedule the tensors the plan points into.
// `published`: the ticket of a one-round call whose round 1 the caller already published
// (small_all_reduce), 0 for a call that queues on the lane.
template <class Keep>
Completion run_on_lane(const CallSetup& s, Builder& b, const LanePlan& plan, std::uint64_t bytes,
                       Keep&& keep, std::uint64_t published = 0) {
  if (!s.blocking) {
    auto sch = b.make();
    keep(*sch);
    sch->set_plan(plan);
    return finish(sch, bytes);
  }
  const CallContext ctx = b.take_context();
  auto background = [&] {  // the same call, as a Schedule (Schedule fills in seq and size)
    auto sch = std::make_shared<Schedule>(s, ctx.call, std::nullopt);
    keep(*sch);
    sch->set_plan(plan);
    return sch;
  };
  LaneCall call(*s.lane, ctx, plan);
  if (published)
    call.resume(published);
  else
    call.queue();
  const BlockedCall what(call, ctx);
  try {
    // Most calls of a busy job find their peers there or arriving at once: a short poll of
    // the lane alone first (it delays progress on other operations by a few microseconds at
    // most), then the engine's waiting loop (progress, health checks, timeout, sleep). Not
    // when the world has more ranks than there are CPUs: every round needs every member to
    // run, so a peer needs this CPU (even one asleep now: it is woken for this round): the
    // engine's waiter spins as for every member awake (crowded: it yields the CPU at every
    // idle turn), and each round that moves (Look::Moved) restarts its spin time before it
    // sleeps. The hang report shows a collective of `bytes`.
    const bool crowded = cpus::oversubscribed(s.lane->world(), s.lane->cpus());
    if (!crowded && !published && call.spin(kLanePolls)) return completed_collective();
    wait_on_lane(s, call, what, bytes);
  } catch (...) {
    if (!call.done()) {
      auto sch = background();
      sch->adopt(call);
      finish(sch, bytes);
    }
    throw;
  }
  return completed_collective();
}

// A small blocking all_reduce on the world lane (issue 29: 16 B at 2 ranks; the common call
// of an inference loop), as one straight sequence: the very round 1 run_on_lane's LaneCall
// would run (the same fingerprint bytes as the Builder's, the payload inline after it in the
// slot's header line, plan_reduce's direct reduction of every member's input, the peers'
// from their slots and its own from the tensor, in group-rank order into the tensor),
// without building the Builder's description, the CallContext, the LanePlan and the
// LaneCall that a bigger call needs, which cost more instructions than the round itself at
// this size. It runs only when the lane is idle (no earlier call holds or
// awaits a turn) and the arguments are valid; whenever anything is not plain (the peers are
// not there within kLanePolls polls, or, when the world is crowded, after one yield of the
// CPU; a peer's fingerprint differs), the general call takes over from the wait
// (LaneCall::resume): the engine's waiter, the health checks, the timeout, the verdict on
// disagreeing members. nullopt: not taken, nothing done.
// Orderings: ShmLane's own (publish()'s release store of the round flag after the plain slot
// writes, all_arrived()'s acquire loads of the peers' flags before the plain reads of their
// slots; shm_lane.hpp proves the round protocol), the same calls in the same order as
// LaneCall::advance makes them.
std::optional<Completion> small_all_reduce(const CallSetup& s, Tensor& tensor, ReduceOp op);

}  // namespace shmdist::coll
