// The state behind a ProcessGroup: its segment, engine and groups, built on the world a join
// gave (bootstrap/world.hpp: segment, transport, rank).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include <shmdist/process_group.hpp>

#include "bootstrap/world.hpp"
#include "coll/shm_lane.hpp"
#include "engine/engine.hpp"
#include "pg/group_info.hpp"
#include "segment/segment.hpp"
#include "transport/link.hpp"

namespace shmdist {

namespace coll {
struct HostSplit;
}

struct ProcessGroup::Impl {
  std::shared_ptr<segment::Segment> segment;
  std::shared_ptr<engine::Engine> engine;
  int rank = -1;          // global rank
  int segment_rank = -1;  // rank in this host's segment (= rank unless the job spans hosts)
  int world = 0;
  std::vector<int> host_of;  // a job across hosts: every global rank's host (JoinedWorld)
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<const detail::GroupInfo> world_group;
  std::uint32_t next_group_id = 1;
  // By group id: collectives called so far. A map: ids need not be small (runtimes that
  // bring their own groups choose them, see shmdist/embedding.hpp).
  // The world group (id 0), the common case, counts apart: no hash lookup per call.
  std::unordered_map<std::uint32_t, std::uint64_t> collective_seq;
  std::uint64_t world_collective_seq = 0;
  // A job across hosts: by group (id << 32 | sig), how its members sit on the hosts
  // (coll::host_split, made at the group's first collective; null: the flat schedule serves).
  std::unordered_map<std::uint64_t, std::shared_ptr<const coll::HostSplit>> host_splits;
  std::unique_ptr<coll::ShmLane> world_lane;  // the world group's collectives
  bool destroyed = false;
  bool supervised = false;
  std::function<void()> after_destroy;  // e.g. release a rendezvous name

  // Builds the engine, the world group and (when the segment holds the whole world) the
  // world lane on a joined world: bootstrap/ chose its transport (join_from_environment,
  // join_world_through_store, or attach_world for a segment a launcher made).
  explicit Impl(detail::JoinedWorld joined);

  // The rank ends without destroy_process_group (pg/process_group.cpp): never waits for the
  // peers. `exit_status`: the process's exit status when known (exit, return from main).
  void end_without_destroy(std::optional<int> exit_status);
};

namespace detail {
struct ProcessGroupAccess {
  static ProcessGroup make(std::shared_ptr<ProcessGroup::Impl> impl) {
    return ProcessGroup(std::move(impl));
  }
  static ProcessGroup::Impl& impl(const ProcessGroup& pg) { return pg.impl(); }
  // Also after destroy (impl() throws then): for what a destroyed group was.
  static const ProcessGroup::Impl* impl_or_null(const ProcessGroup& pg) { return pg.impl_.get(); }
  static Group make_group(std::shared_ptr<const GroupInfo> info) { return Group(std::move(info)); }
  static Work make_work(std::shared_ptr<Operation> op) { return Work(std::move(op)); }
};

// The group `g` names for `call`, checked to be this process group's and to contain this rank
// (throws InvalidArgument otherwise). Defined in process_group.cpp.
const GroupInfo& member_group(const ProcessGroup::Impl& s, const Group& g, const char* call);
}  // namespace detail

}  // namespace shmdist
