#pragma once

#include <shmdist/process_group.hpp>

namespace shmdist::detail {
// Makes `pg` the calling thread's default process group (thread-mode ranks); returns the
// previous one. nullptr restores the process-wide default.
ProcessGroup* set_thread_default(ProcessGroup* pg);
// The calling thread's default process group (what the free functions act on); throws
// NotInitialized before init_process_group. For tests that look inside a rank's job.
ProcessGroup& default_process_group();
}  // namespace shmdist::detail
