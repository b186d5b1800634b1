#include "work.hpp"

#include "tensor_bridge.hpp"

#include <ATen/core/ivalue.h>

#include <algorithm>

namespace shmdist::torch_backend {

using Clock = std::chrono::steady_clock;

ShmWork::ShmWork(std::shared_ptr<Job> job, int rank, int global_rank, c10d::OpType type,
                 c10::ArrayRef<at::Tensor> outputs, std::chrono::milliseconds timeout)
    : c10d::Work(rank, type),
      job_(std::move(job)),
      outputs_(outputs.begin(), outputs.end()),
      timeout_(timeout),
      global_rank_(global_rank) {}

// Dropping the shmdist Work objects needs no lock: an operation still pending is kept alive
// by its engine, and one that is done is no longer referred to by it (the references are
// counted atomically). Nothing else can touch this work any more: this is its last reference.
ShmWork::~ShmWork() = default;

bool ShmWork::done() const {
  std::lock_guard lock(mutex_);
  return completed_;
}

void ShmWork::complete_locked() {
  for (auto& step : on_success_) step();
  on_success_.clear();
  for (const shmdist::Work& w : works_)
    if (members_ && !w.is_send()) {
      const int global = w.source_rank();
      const auto it = std::lower_bound(members_->begin(), members_->end(), global);
      source_ = static_cast<int>(it - members_->begin());
    }
  works_.clear();
  finish();
}

bool ShmWork::fail_locked(std::exception_ptr e) {
  on_success_.clear();
  works_.clear();
  finish(std::move(e));
  return true;
}

// A poll: if another thread is waiting on this work right now, it is not known to be done.
bool ShmWork::isCompleted() {
  std::unique_lock lock(wait_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return done();
  if (done()) return true;
  try {
    for (shmdist::Work& w : works_)
      if (!w.is_completed()) return false;
    for (shmdist::Work& w : works_) w.wait();  // rethrows a failure
    complete_locked();
  } catch (...) {
    fail_locked(std::current_exception());
  }
  return true;
}

bool ShmWork::wait(std::chrono::milliseconds timeout) {
  {
    const bool explicit_limit = timeout != kNoTimeout;
    const auto limit = explicit_limit ? timeout : timeout_;
    const auto start = Clock::now();
    // The subject of this wait's error messages, built only when one is thrown (a wait that
    // completes allocates nothing for it).
    const auto what = [this] {
      return "shm backend: " + c10d::opTypeToString(opType_) + " on rank " +
             std::to_string(global_rank_);
    };
    // Another thread waiting on this same work: wait for it within the limit. No lock held
    // here is one another group's call needs (issue 27.1): the shmdist calls below take the
    // engine's lock and let it go while they wait.
    std::unique_lock lock(wait_mutex_, std::defer_lock);
    if (!lock.try_lock_until(start + limit) && !done()) {
      if (explicit_limit)  // the work stays pending: wait() may be retried
        throw Timeout(what() + " did not complete within the " + std::to_string(limit.count()) +
                      " ms given to wait(); another thread of this process is waiting on it");
      throw Timeout(what() + " timed out: not complete within the process group's timeout of " +
                    std::to_string(limit.count()) + " ms; another thread of this process was "
                    "waiting on the same work all that time");
    }
    if (lock.owns_lock() && !done()) {
      // Without a limit of its own the wait ends where shmdist's own timeout ends, and
      // shmdist's Timeout says what was awaited; only other limits are checked here (and
      // only they need the clock).
      const bool own_limit = explicit_limit || limit != job_->pg.timeout();
      const auto deadline = start + limit;
      bool still_pending = false;
      try {
        for (shmdist::Work& w : works_) {
          if (!own_limit) {
            w.wait();
            continue;
          }
          const auto left = std::max(Clock::duration::zero(), deadline - Clock::now());
          if (w.wait(std::chrono::duration_cast<std::chrono::milliseconds>(left))) continue;
          if (explicit_limit) {  // torch's contract: the work stays pending, wait() may be retried
            still_pending = true;
            break;
          }
          // " timeout " as a word of its own: torch's tests (and users' code written for
          // gloo) recognise a timeout by the regex " (Timed out|closed|timeout) ".
          throw Timeout(what() + " timed out: not complete within the process group's timeout "
                        "of " + std::to_string(limit.count()) +
                        " ms; check that every member of the group makes the matching call");
        }
        if (!still_pending) {
          complete_locked();
          return true;  // completed here, successfully: nothing to rethrow
        }
      } catch (...) {
        fail_locked(std::current_exception());
      }
      if (still_pending)  // thrown outside the try: the work is not failed
        throw Timeout(what() + " did not complete within the " + std::to_string(limit.count()) +
                      " ms given to wait(); it is still pending: wait() again, or check that "
                      "every peer makes the matching call");
    }
  }
  std::lock_guard lock(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

int ShmWork::sourceRank() const {
  std::lock_guard lock(mutex_);
  refuse_unless(completed_ && !exception_ && source_ >= 0, "shm backend: on rank ", global_rank_,
                ": sourceRank() is only known for a completed receive");
  return source_;
}

std::vector<at::Tensor> ShmWork::result() { return {outputs_.begin(), outputs_.end()}; }

// Completes the work first: shmdist makes progress only inside calls, so a future that
// completed later would wait for a call nobody makes.
c10::intrusive_ptr<c10::ivalue::Future> ShmWork::getFuture() {
  auto future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()));
  try {
    wait();
    future->markCompleted(c10::IValue(result()));
  } catch (...) {
    future->setError(std::current_exception());
  }
  return future;
}

namespace {
class CompletedWork : public c10d::Work {
 public:
  CompletedWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type), outputs_(std::move(outputs)) {
    finish();
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto future = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    future->markCompleted(c10::IValue(outputs_));
    return future;
  }

 private:
  std::vector<at::Tensor> outputs_;
};
}  // namespace

c10::intrusive_ptr<c10d::Work> completed_work(int rank, c10d::OpType type,
                                              std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<CompletedWork>(rank, type, std::move(outputs));
}

}  // namespace shmdist::torch_backend
