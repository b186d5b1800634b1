// The state behind a ProcessGroup: its segment, engine and groups.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include <shmdist/process_group.hpp>

#include "engine/engine.hpp"
#include "pg/group_info.hpp"
#include "segment/segment.hpp"

namespace shmdist {

struct ProcessGroup::Impl {
  std::shared_ptr<segment::Segment> segment;
  std::shared_ptr<engine::Engine> engine;
  int rank = -1;
  int world = 0;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<const detail::GroupInfo> world_group;
  std::uint32_t next_group_id = 1;
  bool destroyed = false;
  std::function<void()> after_destroy;  // e.g. release a rendezvous name

  // Builds the group state for `rank` of the job in `segment`. `supervised`: a launcher
  // records how ranks end (shmrun, launch()); otherwise peers' processes are watched.
  Impl(std::shared_ptr<segment::Segment> segment, int rank, std::chrono::milliseconds timeout,
       long spin_us_override, bool supervised);
};

namespace detail {
struct ProcessGroupAccess {
  static ProcessGroup make(std::shared_ptr<ProcessGroup::Impl> impl) {
    return ProcessGroup(std::move(impl));
  }
  static ProcessGroup::Impl& impl(const ProcessGroup& pg) { return pg.impl(); }
};

// Reads the launcher's environment and joins the job (pg/join.cpp).
std::shared_ptr<ProcessGroup::Impl> join_from_environment(const InitOptions& options);
}  // namespace detail

}  // namespace shmdist
