#pragma once

#include <shmdist/process_group.hpp>

namespace shmdist::detail {
// Makes `pg` the calling thread's default process group (thread-mode ranks); returns the
// previous one. nullptr restores the process-wide default.
ProcessGroup* set_thread_default(ProcessGroup* pg);
}  // namespace shmdist::detail
