#pragma once

#include <functional>
#include <memory>

#include <shmdist/process_group.hpp>

namespace shmdist::detail {
// Makes `pg` the calling thread's default process group (thread-mode ranks); returns the
// previous one. nullptr restores the process-wide default.
ProcessGroup* set_thread_default(ProcessGroup* pg);
// How a rank of launch() joins again after destroy_process_group (lib/job/launch.cpp): called
// by init_process_group on the calling thread, whose default group (set above) is destroyed;
// returns the rank's group in a fresh job among the same ranks. Empty: refused. Returns the
// previous one.
using Rejoin = std::function<std::shared_ptr<ProcessGroup::Impl>(const InitOptions&)>;
Rejoin set_thread_rejoin(Rejoin rejoin);
// The calling thread's default process group (what the free functions act on); throws
// NotInitialized before init_process_group. For tests that look inside a rank's job.
ProcessGroup& default_process_group();
}  // namespace shmdist::detail
