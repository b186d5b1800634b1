// The state behind a ProcessGroup: its segment, engine and groups.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include <shmdist/process_group.hpp>

#include "coll/shm_lane.hpp"
#include "engine/engine.hpp"
#include "pg/config.hpp"
#include "pg/group_info.hpp"
#include "segment/segment.hpp"

namespace shmdist::transport {
class ShmTransport;
}

namespace shmdist {

namespace detail {
// Wraps the shared-memory transport of this host's segment into the transport the engine
// uses (a RoutingTransport across hosts), which then decides the rank and world size.
using TransportWrap = std::function<std::unique_ptr<transport::Transport>(
    std::unique_ptr<transport::ShmTransport>)>;
}  // namespace detail

struct ProcessGroup::Impl {
  std::shared_ptr<segment::Segment> segment;
  std::shared_ptr<engine::Engine> engine;
  int rank = -1;          // global rank
  int segment_rank = -1;  // rank in this host's segment (= rank unless the job spans hosts)
  int world = 0;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<const detail::GroupInfo> world_group;
  std::uint32_t next_group_id = 1;
  // By group id: collectives called so far. A map: ids need not be small (runtimes that
  // bring their own groups choose them, see shmdist/embedding.hpp).
  std::unordered_map<std::uint32_t, std::uint64_t> collective_seq;
  std::unique_ptr<coll::ShmLane> world_lane;  // the world group's collectives
  bool destroyed = false;
  bool supervised = false;
  std::function<void()> after_destroy;  // e.g. release a rendezvous name

  // Builds the group state for `rank` of the job in `segment`. `supervised`: a launcher
  // records how ranks end (shmrun, launch()); otherwise peers' processes are watched.
  // `config`: the job's SHMDIST_* settings (spin policy, health-check interval).
  // `wrap` (jobs across hosts): `rank` is the local rank in the host's segment, and the
  // wrapped transport gives the global rank and world size.
  Impl(std::shared_ptr<segment::Segment> segment, int rank, std::chrono::milliseconds timeout,
       const config::Config& config, bool supervised, const detail::TransportWrap& wrap = {});

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

// Reads the launcher's environment and joins the job (pg/join.cpp).
std::shared_ptr<ProcessGroup::Impl> join_from_environment(const InitOptions& options);
}  // namespace detail

}  // namespace shmdist
