// Joining a job through a key-value store that a runtime brings (torch's c10d::Store, for
// the torch.distributed backend; pg/embedding.cpp builds the group on it, for the public
// shmdist/embedding.hpp).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <shmdist/embedding.hpp>

#include "bootstrap/world.hpp"

namespace shmdist::detail {

using embedding::KeyValueStore;  // torch's c10d::Store, as the runtime hands it in

// Joins rank `rank` of a job of `world` ranks (shmdist/embedding.hpp, join_through_store,
// says how; `global_of` names the ranks in texts, Segment::name_ranks; `machine_ranks` sets
// the job's CPU share, cpus::machine_share). Throws InvalidArgument for a bad rank, world,
// timeout or global_of.
JoinedWorld join_world_through_store(int rank, int world, std::chrono::milliseconds timeout,
                                     const KeyValueStore& store,
                                     const std::vector<int>& global_of = {},
                                     int machine_ranks = 0);

}  // namespace shmdist::detail
