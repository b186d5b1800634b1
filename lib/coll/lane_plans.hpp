// Round plans of the collectives that move their data through the world lane (ShmLane).
// Windows of at most slot_size() bytes go through the slots one round at a time, so any size
// works; every member that reduces reads all members' slots in group-rank order, so results
// are those of coll/reduce.hpp whatever the size.
#pragma once

#include <vector>

#include <shmdist/distributed.hpp>

#include "coll/schedule.hpp"

namespace shmdist::coll {

void plan_broadcast(Schedule& sch, const ShmLane& lane, const Tensor& tensor, int root, int me);
// root < 0: every member writes the result into `tensor` (all_reduce); otherwise only root.
void plan_reduce(Schedule& sch, const ShmLane& lane, const Tensor& tensor, ReduceOp op, int root,
                 int me);
// outputs[j] receives member j's input (all_gather, all_gather_into_tensor's parts).
void plan_all_gather(Schedule& sch, const ShmLane& lane, const Tensor& input,
                     const std::vector<Tensor>& outputs);
// parts[j] of every member are reduced into member j's output.
void plan_reduce_scatter(Schedule& sch, const ShmLane& lane, const std::vector<Tensor>& parts,
                         const Tensor& output, ReduceOp op, int me);

}  // namespace shmdist::coll
