// The shmdist job behind one torch world: the shmdist ProcessGroup that every torch process
// group mapped onto this segment uses (the world and its new_group sub-groups).
//
// torch calls a backend from any Python thread, with the GIL released. A shmdist
// ProcessGroup takes calls from several threads at once (its engine's lock, which a call
// lets go of while it waits: docs/semantics.md "Threads"), so calls into `pg` take no lock
// here: a thread waiting for its group's collective never keeps another thread's call on
// another group from being posted and progressing (issue 27.1: two threads, two groups, each
// waiting with a lock the other one needed, hung for good).
//
// `mutex` only orders the job's end (destroy) against group creation and against the peer
// check of torch's store-based barrier; it is never held while a call waits for peers, except
// by destroy itself. Lock order: `mutex`, then the engine's lock.
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
