// The point-to-point schedules of the reductions (all_reduce, reduce, the reduce-scatters)
// off the world lane: the flat one, and across hosts the leaders' and the columns'. Every
// one of them reduces in the order docs/collectives.md documents (reduce_members' order, in
// reduce_schedules.cpp), so which one a call takes changes no bit of its result.
#pragma once

#include <cstdint>
#include <vector>

#include <shmdist/distributed.hpp>

#include "coll/builder.hpp"
#include "coll/schedule.hpp"

namespace shmdist::coll {

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
// (the stage then holds less than twice the tensor, and no member sends more between hosts than the
// flat schedule): they once read slower than the flat one at 16 MiB (0.75-0.80x), but that
// measured both schedules zeroing their staging buffers every call (8 and 16 MiB); with
// scratch buffers they read faster there in 4 interleaved pairs of 4 (median 25.8 against
// 27.7 ms) and at 32 MiB in 2 of 2 (62-64 against 71-74 ms) on 2 hosts x 2 ranks
// (docs/hosts.md). With more hosts than members a host, below this size only (a stage of
// (k + hosts - 2)/k of the tensor, (hosts - 1)/k of it sent between hosts per member).
constexpr std::uint64_t kColumnsBelow = 16 << 20;

// Step 1 of all_reduce and reduce: member j receives slice j of every other member's input
// and reduces the n contributions into `result` (slice-sized), in group-rank order (across
// hosts: reduce_members' order).
void reduce_slices(Schedule& sch, const Builder& b, const Tensor& input, Tensor result,
                   ReduceOp op, const HostSplitPtr& split);

// Whether every host holds as many of the group's members (the columns' condition).
bool same_size_hosts(const HostSplit& split);

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
// Each step posts its receives as the step before it starts (Step::receive_early).
// So element i is (x0 + x1) + (x2 + x3) on every rank, bitwise reduce_members' order (the
// same reduce_in_order calls on the same inputs; AVG sums inside the hosts and divides the
// sum of the partials by the group's size). Each member sends 1/k of the tensor between hosts
// per other host, against the flat schedule's 2 (n - k) / n.
void reduce_by_columns(Schedule& sch, const Builder& b, const Tensor& tensor, ReduceOp op,
                       const HostSplit& split);

// all_reduce across hosts on the leaders' schedule, folded into the host tree's agreement
// (Schedule::agree_on_tree): each host's leader reduces its host's inputs in group-rank order
// (its host's partial), the leaders exchange their partials (one message per pair, with
// their hosts' fingerprints) and each reduces them in host order; the result comes back
// inside each host with every member's fingerprint. So with hosts [0, 1] and [2, 3], SUM is
// (x0 + x1) + (x2 + x3) on every rank, bitwise: reduce_members' order. AVG sums inside the
// hosts and divides the sum of the partials by the group's size; float16 and bfloat16
// partials are rounded to their dtype. One crossing between hosts per call, where the
// exchange of fingerprints and then the leaders' round took two.
FoldedReduce folded_reduce(const Tensor& tensor, ReduceOp op);

// Step 1 of the reduce-scatters: part j of every member's input goes to member j, which
// reduces the parts into `output` in group-rank order (across hosts: reduce_members' order).
void scatter_reduce(Schedule& sch, const Builder& b, const std::vector<Tensor>& parts,
                    Tensor output, ReduceOp op, const HostSplitPtr& split);

}  // namespace shmdist::coll
