// The public embedding interface (shmdist/embedding.hpp) that needs a ProcessGroup's state:
// the group built on bootstrap's join through a runtime's store, the peers check, groups with
// given ids. (start_barrier and reject_collective are with the collectives, pg/group_collectives.cpp.)

#include <shmdist/embedding.hpp>

#include "bootstrap/store_join.hpp"
#include "pg/impl.hpp"

namespace shmdist::embedding {
using detail::GroupInfo;
using detail::ProcessGroupAccess;
using detail::join_world_through_store;
using detail::members_signature;

ProcessGroup join_through_store(int rank, int world, std::chrono::milliseconds timeout,
                                const KeyValueStore& store, const std::vector<int>& global_of,
                                int machine_ranks) {
  return ProcessGroupAccess::make(std::make_shared<ProcessGroup::Impl>(
      join_world_through_store(rank, world, timeout, store, global_of, machine_ranks)));
}

ProcessGroup join_through_store(int rank, int world, std::chrono::milliseconds timeout,
                                const KeyValueStore& store, const std::vector<int>& global_of) {
  return join_through_store(rank, world, timeout, store, global_of, 0);
}

int job_cpus(const ProcessGroup& pg) {
  return ProcessGroupAccess::impl(pg).engine->spin_policy().cpus;
}

void check_peers(const ProcessGroup& pg, const std::string& waiting_for) {
  engine::Engine& engine = *ProcessGroupAccess::impl(pg).engine;
  const auto entry = engine.enter("check_peers");
  engine.check_peers(waiting_for);
}

Group group_with_id(const ProcessGroup& pg, std::vector<int> members, std::uint32_t id) {
  ProcessGroup::Impl& s = ProcessGroupAccess::impl(pg);
  if (id < kFirstRuntimeGroupId)
    throw InvalidArgument("group_with_id: id " + std::to_string(id) + " is below " +
                          std::to_string(kFirstRuntimeGroupId) +
                          ", where new_group numbers its groups; choose an id from there up");
  if (members.empty())
    throw InvalidArgument("group_with_id: expected at least one member, got none");
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= s.world)
      throw InvalidArgument("group_with_id: rank " + std::to_string(members[i]) +
                            " is outside the world [0, " + std::to_string(s.world) + ")");
    if (i > 0 && members[i] <= members[i - 1])
      throw InvalidArgument("group_with_id: expected sorted, unique global ranks, found " +
                            std::to_string(members[i - 1]) + " before " +
                            std::to_string(members[i]));
  }
  auto info = std::make_shared<GroupInfo>();
  info->owner = &s;
  info->id = id;
  info->members = std::move(members);
  info->sig = members_signature(info->members);
  info->my_rank = info->group_rank_of(s.rank);
  return ProcessGroupAccess::make_group(std::move(info));
}

}  // namespace shmdist::embedding
