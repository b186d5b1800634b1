#include "coll/reduce_schedules.hpp"

#include <algorithm>
#include <memory>

#include "coll/reduce.hpp"
#include "coll/streaming_reduce.hpp"
#include "coll/scratch.hpp"
#include "coll/tensor_views.hpp"

namespace shmdist::coll {
namespace {

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

}  // namespace

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
  // Mates' slices p (step A) by place, then other hosts' partials (step B) by host, the own
  // place and host left out (the own input and partial are `mine`): apart, since step B's
  // receives are posted while step A runs.
  Tensor stage = scratch(m * (k - 1 + hosts - 1), dtype);
  auto mate_slot = [=](int q) { return (q < p ? q : q - 1) * m; };
  const int own = split.mine;
  auto host_slot = [=](int h) { return (k - 1 + (h < own ? h : h - 1)) * m; };
  sch.keep(tensor);
  sch.keep(stage);
  Step& a = sch.add_step();
  a.receive_early = true;  // with the agreement's last step (Step::receive_early)
  for (int q = 0; q < k; ++q) {
    if (q == p) continue;
    send(a, b.members()[mates[q]],
         view_of(tensor, slice_begin(count, k, q), slice_len(count, k, q)));
    recv(a, b.members()[mates[q]], view_of(stage, mate_slot(q), m));
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
        inputs[q] = q == p ? bytes_of(mine) : bytes_of(stage) + mate_slot(q) * es;
      reduce_in_order(inside, dtype, inputs, bytes_of(mine), static_cast<std::size_t>(m), n);
    };
  }
  // Steps B and C, like A, post their receives when the step before them starts
  // (Step::receive_early), so that a member a step ahead sends straight into them: step B's
  // land in their own part of the stage, step C's in the mates' slices of the tensor, which
  // step A only sent from (its sends are complete before step B starts) and nothing touches
  // again before step C.
  Step& across = sch.add_step();
  across.receive_early = true;
  for (int h = 0; h < hosts; ++h) {
    if (h == own) continue;
    const int peer =
        b.members()[split.hosts[static_cast<std::size_t>(h)][static_cast<std::size_t>(p)]];
    send(across, peer, mine);
    recv(across, peer, view_of(stage, host_slot(h), m));
  }
  across.after = [=] {
    std::vector<const std::byte*> partials(static_cast<std::size_t>(hosts));
    for (int h = 0; h < hosts; ++h)
      partials[h] = h == own ? bytes_of(mine) : bytes_of(stage) + host_slot(h) * es;
    reduce_in_order(op, dtype, partials, bytes_of(mine), static_cast<std::size_t>(m), n);
  };
  Step& c = sch.add_step();
  c.receive_early = true;
  for (int q = 0; q < k; ++q) {
    if (q == p) continue;
    send(c, b.members()[mates[q]], mine);
    recv(c, b.members()[mates[q]],
         view_of(tensor, slice_begin(count, k, q), slice_len(count, k, q)));
  }
}

FoldedReduce folded_reduce(const Tensor& tensor, ReduceOp op) {
  FoldedReduce fold;
  fold.tensor = tensor;
  fold.inside = op == ReduceOp::AVG ? ReduceOp::SUM : op;
  fold.across = op;
  return fold;
}

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

}  // namespace shmdist::coll
