// The collectives' builders, one per row of coll/kinds.hpp: each checks its arguments, then
// takes the route the table's chooser gives (choose_route: the world lane's plan, or the
// point-to-point schedule the row describes, built here). Every reduction is evaluated in
// group-rank order by coll/reduce.hpp, on either route.

#include "coll/collectives.hpp"

#include <sched.h>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <numeric>

#include "base/cpus.hpp"
#include "coll/lane_plans.hpp"
#include "coll/reduce.hpp"
#include "coll/streaming_reduce.hpp"
#include "engine/engine.hpp"

namespace shmdist::coll {
namespace {

std::byte* bytes_of(const Tensor& t) {
  return static_cast<std::byte*>(const_cast<void*>(t.data_ptr()));
}

// Elements [offset, offset + count) of t's storage, as a 1-d tensor that shares it.
Tensor view_of(const Tensor& t, std::int64_t offset, std::int64_t count) {
  return Tensor::from_blob(bytes_of(t) + offset * static_cast<std::int64_t>(element_size(t.dtype())),
                           {count}, t.dtype());
}

// Member j's slice of `count` elements split as evenly as possible among n members.
std::int64_t slice_begin(std::int64_t count, int n, int j) { return count * j / n; }
std::int64_t slice_len(std::int64_t count, int n, int j) {
  return slice_begin(count, n, j + 1) - slice_begin(count, n, j);
}

// A schedule's staging buffer of `count` elements, uninitialized: every element is written
// (received, or reduced into) before it is read, and never shown to the caller. empty()
// zeroes (calloc), which on a 4 MiB all_reduce across hosts was 10% of the call's CPU time
// (the 2 MiB stage reused from the heap is memset each call).
Tensor scratch(std::int64_t count, DType dtype) {
  const std::size_t nbytes = static_cast<std::size_t>(count) * element_size(dtype);
  std::shared_ptr<void> owner(std::malloc(std::max<std::size_t>(nbytes, 1)),
                              [](void* p) { std::free(p); });
  if (!owner) throw std::bad_alloc();
  return Tensor::from_blob(owner.get(), {count}, dtype, owner);
}

void copy_elements(const Tensor& from, const Tensor& to) {
  if (from.nbytes() && bytes_of(from) != bytes_of(to))
    std::memmove(bytes_of(to), bytes_of(from), from.nbytes());
}

// "(3, 2)", "(4,)", "()": a shape as Python (and gloo's message) writes it.
std::string shape_tuple(const std::vector<std::int64_t>& sizes) {
  std::string text = "(";
  for (std::size_t d = 0; d < sizes.size(); ++d) text += (d ? ", " : "") + std::to_string(sizes[d]);
  return text + (sizes.size() == 1 ? ",)" : ")");
}

// A call's fingerprint, each field set here only (Fingerprint has no padding: peers compare
// the bytes): the Builder sets them as it checks the arguments, small_all_reduce, which
// builds no Builder, through the same functions, so both send the same bytes for one call.
void fingerprint_call(Fingerprint& fp, const CallSetup& s, Kind kind) {
  fp.kind = std::uint8_t(kind);
  fp.seq = s.seq;
  fp.group_size = static_cast<std::uint32_t>(s.group.size());
}
void fingerprint_data(Fingerprint& fp, DType dtype, std::int64_t count) {
  fp.dtype = std::uint8_t(dtype);
  fp.count = count;
}
void fingerprint_op(Fingerprint& fp, ReduceOp op) { fp.op = std::uint8_t(static_cast<int>(op)); }

// Collects the call's description and the first problem with this member's arguments.
class Builder {
 public:
  Builder(const CallSetup& s, Kind kind) : s_(s), kind_(kind) { fingerprint_call(call_.fp, s, kind); }

  int n() const { return s_.group.size(); }
  int me() const { return s_.group.me; }
  bool ok() const { return !error_; }
  // The data move on the world lane (coll/kinds.hpp's chooser, the one place that decides).
  bool on_lane() const { return choose_route(kind_, s_.lane != nullptr, ok()) == Route::Lane; }
  std::span<const int> members() const { return s_.group.members; }

  void fail(const std::string& why) {
    if (!error_) error_ = call_name(kind_, s_.group, s_.seq) + ": " + why;
  }
  bool tensor(const Tensor& t, const char* role) {
    if (!t.defined())
      fail(std::string("the ") + role + " is undefined (default-constructed); pass a tensor "
           "made with zeros(), empty(), tensor({...}) or from_blob()");
    return ok();
  }
  void describe(DType dtype, std::int64_t count) { fingerprint_data(call_.fp, dtype, count); }
  void op(ReduceOp op, DType dtype) {
    fingerprint_op(call_.fp, op);
    if (auto why = unsupported(op, dtype)) fail(*why);
  }
  // The root's group rank, or -1 (and a failure) if it is not a member.
  int root(int global_root, const char* role) {
    for (int j = 0; j < n(); ++j)
      if (members()[j] == global_root) return call_.fp.root = j;
    std::string list;
    for (int m : members()) list += (list.empty() ? "" : ", ") + std::to_string(m);
    fail(std::string(role) + " rank " + std::to_string(global_root) + " is not a member of the "
         "group (global ranks " + list + "); " + role + " is a global rank of a member");
    return -1;
  }
  // One tensor per member, each defined, of `dtype` and, unless `like` is null, of the
  // shape of `like` (the call's single tensor, named `like_role`): gloo refuses another
  // shape with the same element count too, and a user who passes one has mixed up the
  // outputs (a silent reshape would hand back rows where columns were meant).
  bool list(const std::vector<Tensor>& l, const char* role, DType dtype, const Tensor* like,
            const char* like_role) {
    if (static_cast<int>(l.size()) != n()) {
      fail(std::string(role) + " has " + std::to_string(l.size()) + " tensors; it needs one per "
           "group member (" + std::to_string(n()) + ")");
      return false;
    }
    for (int j = 0; j < n() && ok(); ++j) {
      const std::string entry = std::string(role) + "[" + std::to_string(j) + "]";
      if (!l[j].defined()) fail(entry + " is undefined");
      else if (l[j].dtype() != dtype)
        fail(entry + " is " + std::string(dtype_name(l[j].dtype())) + " but must be " +
             std::string(dtype_name(dtype)) + " like the other tensors of the call");
      else if (like && l[j].numel() != like->numel())
        fail(entry + " has " + std::to_string(l[j].numel()) + " elements but must have " +
             std::to_string(like->numel()));
      else if (like && l[j].sizes() != like->sizes())
        fail("on rank " + std::to_string(members()[me()]) + ", " + entry + " has shape " +
             shape_tuple(l[j].sizes()) + " but " + like_role + " has shape " +
             shape_tuple(like->sizes()) + ": invalid tensor size at index " + std::to_string(j) +
             " (expected " + shape_tuple(like->sizes()) + ", got " + shape_tuple(l[j].sizes()) +
             "); give every tensor of " + role + " the shape of " + like_role +
             " (reshape or view them; the element counts already agree)");
    }
    return ok();
  }
  void splits(std::vector<std::int64_t> sends, std::vector<std::int64_t> recvs) {
    call_.send_counts = std::move(sends);
    call_.recv_counts = std::move(recvs);
  }

  std::shared_ptr<Schedule> make(std::optional<FoldedReduce> fold = std::nullopt) {
    return std::make_shared<Schedule>(s_, call_, error_, std::move(fold));
  }
  // The call as a blocking lane call sees it (only when ok()), moved out of the builder.
  CallContext take_context() {
    CallContext ctx;
    ctx.group = s_.group;
    ctx.seq = s_.seq;
    ctx.call = std::move(call_);  // its fingerprint has seq and group size (fingerprint_call)
    return ctx;
  }

 private:
  const CallSetup& s_;
  Kind kind_;
  CallDescription call_;
  std::optional<std::string> error_;
};

void send(Step& step, int peer, Tensor view) {
  step.transfers.push_back({Transfer::Dir::Send, peer, std::move(view)});
}
void recv(Step& step, int peer, Tensor view) {
  step.transfers.push_back({Transfer::Dir::Recv, peer, std::move(view)});
}

// all_reduce across hosts takes the leaders' schedule (folded_reduce) below this size, and
// from it on the columns' (reduce_by_columns) when the hosts hold as many members each, else
// the flat one (reduce_slices), all in the same order: measured on 2 emulated hosts x 2 ranks
// over TCP (docs/hosts.md), the leaders' fewer messages between hosts win for small tensors;
// for large ones every member moving its part at once wins (the leaders' schedule was 2-4x
// slower than the flat one from 128 KiB up; folded into the agreement, still about 2x slower
// from 64 KiB to 1 MiB, and the flat one about 1.2x slower at 32 KiB; the columns' read
// 1.2-2.4x slower than the leaders' at 8-32 KiB in two loaded runs). Since a payload of up
// to 128 KiB crosses in eager pieces (transport/mpi_transport.hpp, kMpiPiecedMax), the
// leaders' one crossing also wins at 64-80 KiB (64 KiB: 123-126 against the columns'
// 143-146 us, 72 KiB 143-150 against 168-172, 3 interleaved rounds of 1000 calls), ties at
// 88 KiB and loses from 96 KiB (189 against 191-210; 128 KiB 326-445 against 220-258).
constexpr std::uint64_t kLeadersBelow = 96 * 1024;
// The columns' serve every larger size when the hosts are no more than each host's members
// (the stage then holds at most the tensor, and no member sends more between hosts than the
// flat schedule): they once read slower than the flat one at 16 MiB (0.75-0.80x), but that
// measured both schedules zeroing their staging buffers every call (8 and 16 MiB); with
// scratch buffers they read faster there in 4 interleaved pairs of 4 (median 25.8 against
// 27.7 ms) and at 32 MiB in 2 of 2 (62-64 against 71-74 ms) on 2 hosts x 2 ranks
// (docs/hosts.md). With more hosts than members a host, below this size only (a stage of
// hosts/k times the slice, (hosts - 1)/k of the tensor sent between hosts per member).
constexpr std::uint64_t kColumnsBelow = 16 << 20;

// Reduces the members' inputs (by group rank) in the documented order: with a split, each
// host's inputs in group-rank order, then the host partials in host order, the partials
// rounded to the dtype (the leaders' schedule computes exactly this); without, group-rank
// order. `out` may be one of the inputs. Across hosts it goes block by block, so that the
// partials stay in the cache and a large slice needs no large buffer (a fresh buffer of the
// slice's size cost the 16 MiB all_reduce half its speed: page faults).
void reduce_members(ReduceOp op, DType dtype, std::span<const std::byte* const> inputs,
                    std::byte* out, std::size_t count, int n,
                    const HostSplitPtr& split) {
  if (!split) return reduce_in_order(op, dtype, inputs, out, count, n);
  constexpr std::size_t kBlock = 4096;  // elements: 32 KiB of float64 partials per host
  const ReduceOp inside = op == ReduceOp::AVG ? ReduceOp::SUM : op;
  const std::size_t hosts = split->hosts.size(), es = element_size(dtype);
  const std::size_t block = std::min(count, kBlock);
  Tensor stage = scratch(static_cast<std::int64_t>(block * hosts), dtype);
  std::vector<const std::byte*> partials(hosts), members;
  for (std::size_t at = 0; at < count; at += block) {
    const std::size_t len = std::min(block, count - at);
    for (std::size_t h = 0; h < hosts; ++h) {
      const std::vector<int>& host = split->hosts[h];
      if (host.size() == 1) {
        partials[h] = inputs[static_cast<std::size_t>(host[0])] + at * es;
        continue;
      }
      members.clear();
      for (int j : host) members.push_back(inputs[static_cast<std::size_t>(j)] + at * es);
      std::byte* partial = bytes_of(stage) + h * block * es;
      reduce_in_order(inside, dtype, members, partial, len, n);
      partials[h] = partial;
    }
    reduce_in_order(op, dtype, partials, out + at * es, len, n);
  }
}

// Step 1 of all_reduce and reduce: member j receives slice j of every other member's input
// and reduces the n contributions into `result` (slice-sized), in group-rank order (across
// hosts: reduce_members' order).
void reduce_slices(Schedule& sch, const Builder& b, const Tensor& input, Tensor result,
                   ReduceOp op, const HostSplitPtr& split) {
  const int n = b.n(), me = b.me();
  const std::int64_t count = input.numel();
  const std::int64_t m = slice_len(count, n, me);
  Tensor stage = scratch(m * n, input.dtype());
  Step& step = sch.add_step();
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    send(step, b.members()[j], view_of(input, slice_begin(count, n, j), slice_len(count, n, j)));
    recv(step, b.members()[j], view_of(stage, j * m, m));
  }
  sch.keep(stage);
  step.after = [=] {
    std::vector<const std::byte*> inputs(n);
    for (int r = 0; r < n; ++r)
      inputs[r] = r == me ? bytes_of(input) + slice_begin(count, n, me) * element_size(input.dtype())
                          : bytes_of(stage) + r * m * element_size(input.dtype());
    reduce_members(op, input.dtype(), inputs, bytes_of(result), static_cast<std::size_t>(m), n,
                   split);
  };
}

// sends[j] goes to member j and recvs[j] comes from it; this member's own pair is a local copy
// (all_gather, all_gather_into_tensor and the all_to_alls over point-to-point).
void exchange(Schedule& sch, const Builder& b, const std::vector<Tensor>& sends,
              const std::vector<Tensor>& recvs) {
  Step& step = sch.add_step();
  for (int j = 0; j < b.n(); ++j) {
    sch.keep(sends[j]);
    sch.keep(recvs[j]);
    if (j == b.me()) continue;
    send(step, b.members()[j], sends[j]);
    recv(step, b.members()[j], recvs[j]);
  }
  Tensor from = sends[b.me()], to = recvs[b.me()];
  step.after = [from, to] { copy_elements(from, to); };
}

// all_reduce across hosts from kLeadersBelow up, when every host holds the same
// number k of the group's members (the columns: a host's member at place p, in group-rank
// order, is column p): three data steps after the host tree's agreement, each member doing
// 1/k of the work, where the flat schedule sends 2 (n - 1) slices of 1/n per member, most of
// them between hosts. With hosts [0, 1] and [2, 3] (k = 2):
//   step A, inside each host: member p gets slice p (of k) of every mate's input and reduces
//           its host's inputs in group-rank order into its own slice: the host's partial of
//           slice p, rounded to the dtype;
//   step B, between hosts: member p swaps its partial with column p of every other host (one
//           message per pair, the only ones between hosts) and reduces the partials in host
//           order into slice p;
//   step C, inside each host: every member sends its slice of the result to its mates.
// So element i is (x0 + x1) + (x2 + x3) on every rank, bitwise reduce_members' order (the
// same reduce_in_order calls on the same inputs; AVG sums inside the hosts and divides the
// sum of the partials by the group's size). Each member sends 1/k of the tensor between hosts
// per other host, against the flat schedule's 2 (n - k) / n.
bool same_size_hosts(const HostSplit& split) {
  return std::all_of(split.hosts.begin(), split.hosts.end(),
                     [&](const std::vector<int>& h) { return h.size() == split.hosts[0].size(); });
}

void reduce_by_columns(Schedule& sch, const Builder& b, const Tensor& tensor, ReduceOp op,
                       const HostSplit& split) {
  const int n = b.n(), me = b.me();
  const std::vector<int>& mates = split.hosts[static_cast<std::size_t>(split.mine)];
  const int k = static_cast<int>(mates.size());
  const int hosts = static_cast<int>(split.hosts.size());
  const int p = static_cast<int>(std::find(mates.begin(), mates.end(), me) - mates.begin());
  const std::int64_t count = tensor.numel();
  const std::int64_t m = slice_len(count, k, p);
  const DType dtype = tensor.dtype();
  const std::size_t es = element_size(dtype);
  Tensor mine = view_of(tensor, slice_begin(count, k, p), m);
  // Mates' slices p (step A), then other hosts' partials (step B), by place / host; the own
  // entry stays unused (the own input and partial are `mine`).
  Tensor stage = scratch(m * std::max(k, hosts), dtype);
  sch.keep(tensor);
  sch.keep(stage);
  Step& a = sch.add_step();
  for (int q = 0; q < k; ++q) {
    if (q == p) continue;
    send(a, b.members()[mates[q]],
         view_of(tensor, slice_begin(count, k, q), slice_len(count, k, q)));
    recv(a, b.members()[mates[q]], view_of(stage, q * m, m));
  }
  const ReduceOp inside = op == ReduceOp::AVG ? ReduceOp::SUM : op;
  if (k == 2) {
    // One mate: its slice is reduced into `mine` as it streams out of the ring, the mate's
    // input first iff it precedes this member in group-rank order, so the slice is read once
    // where it lies instead of copied into the stage and read again (a transport that lands
    // bytes first, single copy or MPI, lands them in the stage, reduced from there). With more
    // mates the group-rank order needs them all at hand, so they wait in the stage. Either
    // way `mine` changes only within this call: if it fails, the tensor's contents are
    // unspecified, as torch's are.
    const int q = 1 - p;
    a.transfers.back().consumer = std::make_shared<StreamingReduce>(
        tensor, bytes_of(mine), static_cast<std::size_t>(m), dtype, inside, n, q < p);
  } else {
    a.after = [=] {
      std::vector<const std::byte*> inputs(static_cast<std::size_t>(k));
      for (int q = 0; q < k; ++q)
        inputs[q] = q == p ? bytes_of(mine) : bytes_of(stage) + q * m * es;
      reduce_in_order(inside, dtype, inputs, bytes_of(mine), static_cast<std::size_t>(m), n);
    };
  }
  Step& across = sch.add_step();
  for (int h = 0; h < hosts; ++h) {
    if (h == split.mine) continue;
    const int peer =
        b.members()[split.hosts[static_cast<std::size_t>(h)][static_cast<std::size_t>(p)]];
    send(across, peer, mine);
    recv(across, peer, view_of(stage, h * m, m));
  }
  const int own = split.mine;
  across.after = [=] {
    std::vector<const std::byte*> partials(static_cast<std::size_t>(hosts));
    for (int h = 0; h < hosts; ++h)
      partials[h] = h == own ? bytes_of(mine) : bytes_of(stage) + h * m * es;
    reduce_in_order(op, dtype, partials, bytes_of(mine), static_cast<std::size_t>(m), n);
  };
  Step& c = sch.add_step();
  for (int q = 0; q < k; ++q) {
    if (q == p) continue;
    send(c, b.members()[mates[q]], mine);
    recv(c, b.members()[mates[q]],
         view_of(tensor, slice_begin(count, k, q), slice_len(count, k, q)));
  }
}

// all_reduce across hosts on the leaders' schedule, folded into the host tree's agreement
// (Schedule::agree_on_tree): each host's leader reduces its host's inputs in group-rank order
// (its host's partial), the leaders exchange their partials (one message per pair, with
// their hosts' fingerprints) and each reduces them in host order; the result comes back
// inside each host with every member's fingerprint. So with hosts [0, 1] and [2, 3], SUM is
// (x0 + x1) + (x2 + x3) on every rank, bitwise: reduce_members' order. AVG sums inside the
// hosts and divides the sum of the partials by the group's size; float16 and bfloat16
// partials are rounded to their dtype. One crossing between hosts per call, where the
// exchange of fingerprints and then the leaders' round took two.
FoldedReduce folded_reduce(const Tensor& tensor, ReduceOp op) {
  FoldedReduce fold;
  fold.tensor = tensor;
  fold.inside = op == ReduceOp::AVG ? ReduceOp::SUM : op;
  fold.across = op;
  return fold;
}

// Broadcast across hosts from a leader: each host's leader sends `tensor` to its host's
// other members.
void spread_inside_host(Schedule& sch, const Builder& b, const HostSplit& split, int lead,
                        const Tensor& tensor) {
  Step& out = sch.add_step();
  for (int j : split.hosts[static_cast<std::size_t>(split.mine)]) {
    if (j == lead) continue;
    if (b.me() == lead) send(out, b.members()[j], tensor);
    else if (b.me() == j) recv(out, b.members()[lead], tensor);
  }
}

Completion finish(const std::shared_ptr<Schedule>& sch, std::uint64_t bytes) {
  sch->bytes = bytes;
  return sch->start();
}

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

// Polls of the lane before a blocking call enters the engine's waiting loop.
constexpr int kLanePolls = 256;

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

}  // namespace

Completion broadcast(const CallSetup& s, Tensor& tensor, int root) {
  Builder b(s, Kind::Broadcast);
  int r = -1;
  if (b.tensor(tensor, "tensor")) {
    b.describe(tensor.dtype(), tensor.numel());
    r = b.root(root, "src");
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_broadcast(*s.lane, tensor, r, b.me()), tensor.nbytes(),
                       [&](Schedule& sch) { sch.keep(tensor); });
  auto sch = b.make();
  if (b.ok() && tensor.numel() > 0) {
    if (const HostSplitPtr& split = s.split) {
      // The root sends to its host's members and to the other hosts' leaders, which pass it
      // on inside their hosts: one message to each other host.
      sch->keep(tensor);
      const std::vector<int> leaders = split->leaders(r);
      Step& first = sch->add_step();
      for (std::size_t h = 0; h < split->hosts.size(); ++h) {
        const bool root_host = leaders[h] == r;
        for (int j : split->hosts[h]) {
          if (j == r || (!root_host && j != leaders[h])) continue;  // reached in step 2
          if (b.me() == r) send(first, b.members()[j], tensor);
          else if (b.me() == j) recv(first, b.members()[r], tensor);
        }
      }
      const int lead = leaders[static_cast<std::size_t>(split->mine)];
      if (lead != r) spread_inside_host(*sch, b, *split, lead, tensor);
      return finish(sch, tensor.nbytes());
    }
  }
  if (b.ok()) {
    sch->keep(tensor);
    Step& step = sch->add_step();
    if (b.me() == r) {
      for (int j = 0; j < b.n(); ++j)
        if (j != r) send(step, b.members()[j], tensor);
    } else {
      recv(step, b.members()[r], tensor);
    }
  }
  return finish(sch, b.ok() ? tensor.nbytes() : 0);
}

Completion reject(const CallSetup& s, Kind kind, const std::string& why) {
  Builder b(s, kind);
  b.fail(why);
  return finish(b.make(), 0);
}

Completion all_reduce(const CallSetup& s, Tensor& tensor, ReduceOp op) {
  if (s.blocking && s.lane && tensor.defined())
    if (std::optional<Completion> done = small_all_reduce(s, tensor, op)) return std::move(*done);
  Builder b(s, Kind::AllReduce);
  if (b.tensor(tensor, "tensor")) {
    b.describe(tensor.dtype(), tensor.numel());
    b.op(op, tensor.dtype());
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_reduce(*s.lane, tensor, op, -1, b.me()), tensor.nbytes(),
                       [&](Schedule& sch) { sch.keep(tensor); });
  const HostSplitPtr& split = s.split;
  if (b.ok() && split && tensor.numel() > 0 && tensor.nbytes() < kLeadersBelow)
    return finish(b.make(folded_reduce(tensor, op)), tensor.nbytes());
  auto sch = b.make();
  if (b.ok() && split && same_size_hosts(*split) &&
      (tensor.nbytes() < kColumnsBelow ||
       split->hosts.size() <= split->hosts[static_cast<std::size_t>(split->mine)].size())) {
    reduce_by_columns(*sch, b, tensor, op, *split);
  } else if (b.ok()) {
    const int n = b.n(), me = b.me();
    const std::int64_t count = tensor.numel();
    sch->keep(tensor);
    reduce_slices(*sch, b, tensor,
                  view_of(tensor, slice_begin(count, n, me), slice_len(count, n, me)), op, split);
    Step& out = sch->add_step();
    for (int j = 0; j < n; ++j) {
      if (j == me) continue;
      send(out, b.members()[j], view_of(tensor, slice_begin(count, n, me), slice_len(count, n, me)));
      recv(out, b.members()[j], view_of(tensor, slice_begin(count, n, j), slice_len(count, n, j)));
    }
  }
  return finish(sch, b.ok() ? tensor.nbytes() : 0);
}

Completion reduce(const CallSetup& s, Tensor& tensor, int root, ReduceOp op) {
  Builder b(s, Kind::Reduce);
  int r = -1;
  if (b.tensor(tensor, "tensor")) {
    b.describe(tensor.dtype(), tensor.numel());
    b.op(op, tensor.dtype());
    r = b.root(root, "dst");
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_reduce(*s.lane, tensor, op, r, b.me()), tensor.nbytes(),
                       [&](Schedule& sch) { sch.keep(tensor); });
  auto sch = b.make();
  // Across hosts: the flat schedule at every size, reduced host by host (the leaders' was
  // not measurably faster for reduce, docs/hosts.md).
  const HostSplitPtr& split = s.split;
  if (b.ok()) {
    const int n = b.n(), me = b.me();
    const std::int64_t count = tensor.numel();
    const std::int64_t m = slice_len(count, n, me);
    sch->keep(tensor);
    // Only the root's tensor is written: the others reduce into a private buffer.
    Tensor result = me == r ? view_of(tensor, slice_begin(count, n, me), m) : scratch(m, tensor.dtype());
    sch->keep(result);
    reduce_slices(*sch, b, tensor, result, op, split);
    Step& out = sch->add_step();
    if (me == r) {
      for (int j = 0; j < n; ++j)
        if (j != me)
          recv(out, b.members()[j], view_of(tensor, slice_begin(count, n, j), slice_len(count, n, j)));
    } else {
      send(out, b.members()[r], result);
    }
  }
  return finish(sch, b.ok() ? tensor.nbytes() : 0);
}

Completion all_gather(const CallSetup& s, std::vector<Tensor>& outputs, const Tensor& input) {
  Builder b(s, Kind::AllGather);
  if (b.tensor(input, "tensor")) {
    b.describe(input.dtype(), input.numel());
    b.list(outputs, "tensor_list", input.dtype(), &input, "tensor");
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_all_gather(*s.lane, input, &outputs, nullptr),
                       input.nbytes() * b.n(), [&](Schedule& sch) { sch.keep(input); });
  auto sch = b.make();
  if (b.ok()) exchange(*sch, b, std::vector<Tensor>(b.n(), input), outputs);
  return finish(sch, b.ok() ? input.nbytes() * b.n() : 0);
}

Completion all_gather_into_tensor(const CallSetup& s, Tensor& output, const Tensor& input) {
  Builder b(s, Kind::AllGatherIntoTensor);
  if (b.tensor(input, "input") && b.tensor(output, "output")) {
    b.describe(input.dtype(), input.numel());
    if (output.dtype() != input.dtype())
      b.fail("output is " + std::string(dtype_name(output.dtype())) + " but input is " +
             std::string(dtype_name(input.dtype())) + "; they must have the same dtype");
    else if (output.numel() != input.numel() * b.n())
      b.fail("output has " + std::to_string(output.numel()) + " elements; it must have group "
             "size x input elements = " + std::to_string(b.n()) + " x " +
             std::to_string(input.numel()));
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_all_gather(*s.lane, input, nullptr, bytes_of(output)),
                       input.nbytes() * b.n(), [&](Schedule& sch) {
                         sch.keep(input);
                         sch.keep(output);
                       });
  auto sch = b.make();
  if (b.ok()) {
    const std::int64_t k = input.numel();
    std::vector<Tensor> parts;
    for (int j = 0; j < b.n(); ++j) parts.push_back(view_of(output, j * k, k));
    sch->keep(output);
    exchange(*sch, b, std::vector<Tensor>(b.n(), input), parts);
  }
  return finish(sch, b.ok() ? input.nbytes() * b.n() : 0);
}

Completion gather(const CallSetup& s, const Tensor& input, std::vector<Tensor>& outputs, int root) {
  Builder b(s, Kind::Gather);
  int r = -1;
  if (b.tensor(input, "tensor")) {
    b.describe(input.dtype(), input.numel());
    r = b.root(root, "dst");
    if (b.ok() && b.me() == r) b.list(outputs, "gather_list", input.dtype(), &input, "tensor");
  }
  auto sch = b.make();
  if (b.ok()) {
    sch->keep(input);
    Step& step = sch->add_step();
    if (b.me() == r) {
      for (int j = 0; j < b.n(); ++j) {
        sch->keep(outputs[j]);
        if (j != r) recv(step, b.members()[j], outputs[j]);
      }
      Tensor own = outputs[r];
      step.after = [input, own] { copy_elements(input, own); };
    } else {
      send(step, b.members()[r], input);
    }
  }
  return finish(sch, b.ok() ? input.nbytes() : 0);
}

Completion scatter(const CallSetup& s, Tensor& output, const std::vector<Tensor>& inputs, int root) {
  Builder b(s, Kind::Scatter);
  int r = -1;
  if (b.tensor(output, "tensor")) {
    b.describe(output.dtype(), output.numel());
    r = b.root(root, "src");
    if (b.ok() && b.me() == r) b.list(inputs, "scatter_list", output.dtype(), &output, "tensor");
  }
  auto sch = b.make();
  if (b.ok()) {
    sch->keep(output);
    Step& step = sch->add_step();
    if (b.me() == r) {
      for (int j = 0; j < b.n(); ++j) {
        sch->keep(inputs[j]);
        if (j != r) send(step, b.members()[j], inputs[j]);
      }
      Tensor own = inputs[r];
      step.after = [own, output] { copy_elements(own, output); };
    } else {
      recv(step, b.members()[r], output);
    }
  }
  return finish(sch, b.ok() ? output.nbytes() : 0);
}

namespace {
// Step 1 of the reduce-scatters: part j of every member's input goes to member j, which
// reduces the parts into `output` in group-rank order (across hosts: reduce_members' order).
void scatter_reduce(Schedule& sch, const Builder& b, const std::vector<Tensor>& parts,
                    Tensor output, ReduceOp op, const HostSplitPtr& split) {
  const int n = b.n(), me = b.me();
  const std::int64_t m = output.numel();
  Tensor stage = scratch(m * n, output.dtype());
  sch.keep(stage);
  sch.keep(output);
  Step& step = sch.add_step();
  for (int j = 0; j < n; ++j) {
    sch.keep(parts[j]);
    if (j == me) continue;
    send(step, b.members()[j], parts[j]);
    recv(step, b.members()[j], view_of(stage, j * m, m));
  }
  Tensor own = parts[me];
  step.after = [=] {
    std::vector<const std::byte*> inputs(n);
    for (int r = 0; r < n; ++r)
      inputs[r] = r == me ? bytes_of(own) : bytes_of(stage) + r * m * element_size(output.dtype());
    reduce_members(op, output.dtype(), inputs, bytes_of(output), static_cast<std::size_t>(m), n,
                   split);
  };
}
}  // namespace

Completion reduce_scatter(const CallSetup& s, Tensor& output, const std::vector<Tensor>& inputs,
                          ReduceOp op) {
  Builder b(s, Kind::ReduceScatter);
  if (b.tensor(output, "output")) {
    b.describe(output.dtype(), output.numel());
    b.op(op, output.dtype());
    if (b.ok()) b.list(inputs, "input_list", output.dtype(), &output, "output");
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_reduce_scatter(*s.lane, &inputs, nullptr, output, op, b.me()),
                       output.nbytes() * b.n(), [&](Schedule& sch) { sch.keep(output); });
  auto sch = b.make();
  if (b.ok()) {
    scatter_reduce(*sch, b, inputs, output, op, s.split);
  }
  return finish(sch, b.ok() ? output.nbytes() * b.n() : 0);
}

Completion reduce_scatter_tensor(const CallSetup& s, Tensor& output, const Tensor& input,
                                 ReduceOp op) {
  Builder b(s, Kind::ReduceScatterTensor);
  if (b.tensor(output, "output") && b.tensor(input, "input")) {
    b.describe(output.dtype(), output.numel());
    b.op(op, output.dtype());
    if (input.dtype() != output.dtype())
      b.fail("input is " + std::string(dtype_name(input.dtype())) + " but output is " +
             std::string(dtype_name(output.dtype())) + "; they must have the same dtype");
    else if (input.numel() != output.numel() * b.n())
      b.fail("input has " + std::to_string(input.numel()) + " elements; it must have group "
             "size x output elements = " + std::to_string(b.n()) + " x " +
             std::to_string(output.numel()));
  }
  if (b.on_lane())
    return run_on_lane(s, b, plan_reduce_scatter(*s.lane, nullptr, bytes_of(input), output, op, b.me()),
                       input.nbytes(), [&](Schedule& sch) {
                         sch.keep(input);
                         sch.keep(output);
                       });
  auto sch = b.make();
  if (b.ok()) {
    std::vector<Tensor> parts;
    for (int j = 0; j < b.n(); ++j) parts.push_back(view_of(input, j * output.numel(), output.numel()));
    sch->keep(input);
    scatter_reduce(*sch, b, parts, output, op, s.split);
  }
  return finish(sch, b.ok() ? input.nbytes() : 0);
}


Completion all_to_all(const CallSetup& s, std::vector<Tensor>& outputs,
                      const std::vector<Tensor>& inputs) {
  Builder b(s, Kind::AllToAll);
  if (!inputs.empty() && inputs[0].defined()) {
    const DType dtype = inputs[0].dtype();
    b.describe(dtype, 0);
    if (b.list(inputs, "input_list", dtype, nullptr, nullptr) &&
        b.list(outputs, "output_list", dtype, nullptr, nullptr)) {
      std::vector<std::int64_t> sends, recvs;
      for (int j = 0; j < b.n(); ++j) {
        sends.push_back(inputs[j].numel());
        recvs.push_back(outputs[j].numel());
      }
      b.splits(std::move(sends), std::move(recvs));
    }
  } else {
    b.list(inputs, "input_list", kFloat32, nullptr, nullptr);
    b.fail("input_list[0] is undefined or missing");
  }
  auto sch = b.make();
  if (b.ok()) exchange(*sch, b, inputs, outputs);
  std::uint64_t bytes = 0;
  for (const Tensor& t : inputs) bytes += t.defined() ? t.nbytes() : 0;
  return finish(sch, bytes);
}

namespace {
// Rows per member along dim 0 (equal splits when `splits` is empty), or a failure.
std::vector<std::int64_t> rows_per_member(Builder& b, const Tensor& t, const char* role,
                                          const std::vector<std::int64_t>& splits) {
  const std::int64_t rows = t.sizes()[0];
  const int n = b.n();
  if (splits.empty()) {
    if (rows % n != 0) {
      b.fail(std::string(role) + " has " + std::to_string(rows) + " rows along dim 0, which do "
             "not split equally among " + std::to_string(n) + " members; pass split sizes");
      return {};
    }
    return std::vector<std::int64_t>(n, rows / n);
  }
  if (static_cast<int>(splits.size()) != n) {
    b.fail(std::string(role) + "_split_sizes has " + std::to_string(splits.size()) +
           " entries; it needs one per group member (" + std::to_string(n) + ")");
    return {};
  }
  std::int64_t sum = 0;
  for (std::int64_t v : splits) {
    if (v < 0) {
      b.fail(std::string(role) + "_split_sizes holds the negative size " + std::to_string(v));
      return {};
    }
    sum += v;
  }
  if (sum != rows) {
    b.fail(std::string(role) + "_split_sizes add up to " + std::to_string(sum) + " rows but " +
           role + " has " + std::to_string(rows) + " along dim 0");
    return {};
  }
  return splits;
}

std::int64_t row_elements(const Tensor& t) {
  std::int64_t e = 1;
  for (std::size_t d = 1; d < t.sizes().size(); ++d) e *= t.sizes()[d];
  return e;
}
}  // namespace

Completion all_to_all_single(const CallSetup& s, Tensor& output, const Tensor& input,
                             const std::vector<std::int64_t>& output_splits,
                             const std::vector<std::int64_t>& input_splits) {
  Builder b(s, Kind::AllToAllSingle);
  std::vector<std::int64_t> in_rows, out_rows;
  if (b.tensor(input, "input") && b.tensor(output, "output")) {
    b.describe(input.dtype(), 0);
    if (input.dim() < 1 || output.dim() < 1)
      b.fail("input and output need at least one dimension (they are split along dim 0)");
    else if (input.dtype() != output.dtype())
      b.fail("output is " + std::string(dtype_name(output.dtype())) + " but input is " +
             std::string(dtype_name(input.dtype())) + "; they must have the same dtype");
    else if (row_elements(input) != row_elements(output))
      b.fail("a row (dim 0 entry) of input has " + std::to_string(row_elements(input)) +
             " elements but one of output has " + std::to_string(row_elements(output)));
    if (b.ok()) in_rows = rows_per_member(b, input, "input", input_splits);
    if (b.ok()) out_rows = rows_per_member(b, output, "output", output_splits);
  }
  std::vector<Tensor> sends, recvs;
  if (b.ok()) {
    const std::int64_t row = row_elements(input);
    std::vector<std::int64_t> send_counts, recv_counts;
    std::int64_t in_at = 0, out_at = 0;
    for (int j = 0; j < b.n(); ++j) {
      send_counts.push_back(in_rows[j] * row);
      recv_counts.push_back(out_rows[j] * row);
      sends.push_back(view_of(input, in_at, in_rows[j] * row));
      recvs.push_back(view_of(output, out_at, out_rows[j] * row));
      in_at += in_rows[j] * row;
      out_at += out_rows[j] * row;
    }
    b.splits(std::move(send_counts), std::move(recv_counts));
  }
  auto sch = b.make();
  if (b.ok()) {
    sch->keep(input);
    sch->keep(output);
    exchange(*sch, b, sends, recvs);
  }
  return finish(sch, b.ok() ? input.nbytes() : 0);
}

// On the world lane one round whose slots carry only the fingerprints; on a sub-group the
// fingerprint exchange alone (every member hears from every other before it completes).
Completion barrier(const CallSetup& s) {
  Builder b(s, Kind::Barrier);
  if (b.on_lane()) return run_on_lane(s, b, LanePlan{}, 0, [](Schedule&) {});
  return finish(b.make(), 0);
}

void monitored_barrier(const CallSetup& s, std::chrono::milliseconds timeout, bool wait_all) {
  Builder b(s, Kind::MonitoredBarrier);
  auto sch = b.make();
  Completion done = finish(sch, 0);
  if (s.engine->wait(*done, timeout)) return;
  std::vector<int> missing;
  sch->awaited_peers(missing);
  std::sort(missing.begin(), missing.end());
  if (!wait_all && missing.size() > 1) missing.erase(missing.begin() + 1, missing.end());
  std::string list;
  for (int m : missing) list += (list.empty() ? "" : ", ") + std::to_string(m);
  const bool one = missing.size() == 1;
  const std::string ms = std::to_string(timeout.count()) + " ms";
  const std::string me = std::to_string(s.engine->rank());
  // Our words first, then gloo's for the same event: code and tests written for gloo
  // (torch's own among them) recognise a failed monitored barrier by gloo's sentences.
  const std::string gloo_words =
      timeout.count() == 0 ? "Rank " + me + " timed out in monitoredBarrier after 0 ms"
                           : (one ? "Rank " : "Ranks ") + list +
                                 " failed to pass monitoredBarrier in " + ms;
  throw Timeout(call_name(Kind::MonitoredBarrier, s.group, s.seq) + " on rank " + me + ": " +
                (one ? "rank " : "ranks ") + list + (one ? " has" : " have") +
                " not arrived within " + ms +
                (wait_all ? "" : " (the first missing rank; pass wait_all_ranks=true for all)") +
                ". In gloo's words: " + gloo_words + ".");
}

}  // namespace shmdist::coll
