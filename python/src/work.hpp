// The c10d::Work that torch's Python layer waits on: one or more shmdist Work objects (an
// operation may need several), plus what to do once they all succeeded (copy outputs back
// out of staging copies). Progress happens in the calls that test or wait, as everywhere in
// shmdist: there is no background thread.
#pragma once

#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include <shmdist/distributed.hpp>

#include "job.hpp"

namespace shmdist::torch_backend {

class ShmWork : public c10d::Work {
 public:
  // `timeout`: how long a wait() without its own timeout may take (the group's, or the
  // operation's from its options); `engine_timeout`: the job's, after which shmdist itself
  // throws Timeout (with the best message), so waits use it when the two agree.
  // `rank`: the group rank torch's Work carries; `global_rank`: the one errors name.
  // `outputs` (what result() returns) is copied.
  ShmWork(std::shared_ptr<Job> job, int rank, int global_rank, c10d::OpType type,
          c10::ArrayRef<at::Tensor> outputs, std::chrono::milliseconds timeout);
  ~ShmWork() override;

  void add(shmdist::Work work) { works_.push_back(std::move(work)); }
  void on_success(std::function<void()> step) { on_success_.push_back(std::move(step)); }
  // For receives: maps the sender's global rank to the group rank torch expects.
  // (Shared with the process group: a receive copies no member list.)
  void set_source_map(std::shared_ptr<const std::vector<int>> members) {
    members_ = std::move(members);
  }

  bool isCompleted() override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  // With wait_mutex_ held: runs the success steps and marks the work done (or failed).
  void complete_locked();
  bool fail_locked(std::exception_ptr e);
  bool done() const;

  std::shared_ptr<Job> job_;
  // Held by the thread that waits on or tests this work: the state below is its (torch may
  // wait on one work from two threads, e.g. wait() and getFuture()). Never held by anything
  // else, and only for this work; the shmdist calls inside take the engine's lock themselves.
  // Timed: a second waiter waits at most its own limit for the first.
  std::timed_mutex wait_mutex_;
  // Most calls post one shmdist operation: kept inline, without an allocation.
  c10::SmallVector<shmdist::Work, 1> works_;
  std::vector<std::function<void()>> on_success_;
  // What result() returns: mostly one tensor, kept inline (result() builds its vector only
  // when asked, which torch's own wait path does not do).
  c10::SmallVector<at::Tensor, 1> outputs_;
  std::shared_ptr<const std::vector<int>> members_;  // global ranks by group rank (receives)
  std::chrono::milliseconds timeout_;
  int global_rank_;
  int source_ = -1;  // group rank of a completed receive's sender
};

// A completed Work (for calls that finish before returning).
c10::intrusive_ptr<c10d::Work> completed_work(int rank, c10d::OpType type,
                                              std::vector<at::Tensor> outputs);

}  // namespace shmdist::torch_backend
