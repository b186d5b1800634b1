// The shmdist job behind one torch world: the shmdist ProcessGroup that every torch process
// group mapped onto this segment uses (the world and its new_group sub-groups).
//
// torch calls a backend from any Python thread, with the GIL released, while a shmdist
// ProcessGroup (and its Work objects) is used by one thread at a time: every call into
// `pg`, including waiting on and testing its Work, holds `mutex`. The mutex gives the
// happens-before edges between successive users, so the engine sees one thread at a time.
#pragma once

#include <memory>
#include <mutex>

#include <shmdist/process_group.hpp>

namespace shmdist::torch_backend {

struct Job {
  explicit Job(ProcessGroup group) : pg(std::move(group)) {}
  // destroy_process_group: finishes pending sends, waits for the other ranks, reports
  // messages that were never received. Later calls on any group of the job raise.
  void destroy() {
    std::lock_guard lock(mutex);
    if (pg.is_initialized()) pg.destroy();
  }

  std::mutex mutex;
  ProcessGroup pg;
};

}  // namespace shmdist::torch_backend
