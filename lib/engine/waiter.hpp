// Engine::block_until: the one waiting loop every blocking call goes through.
//
// Phase 1 spins, making progress on everything (so a full ring's sender keeps draining its
// own inbound rings, and streams in flight keep moving), for the SpinPolicy's time after the
// last thing that moved (a collective's own rounds count, WaitFocus::moves); with more ranks
// awake than CPUs (or, for a collective on the lane, more members than CPUs: WaitFocus::crowd)
// it yields the CPU at every turn that found nothing (and spins longer: a yield costs the
// others nothing). Phase 2 publishes what the call is blocked on (hang reports), arms
// the doorbell, re-checks with a full scan and sleeps; it wakes when a peer rings, or every
// health-check interval (100 ms) to look at peers' health, the job state and the deadline.
// Data never waits for that interval: it always comes with a wake-up (wait/doorbell.hpp),
// which the lost-wake-up stress test checks by making the interval an hour.
//
// Threads (engine/engine_lock.hpp): the caller holds the engine's lock, unless it is a unit
// test driving the engine from one thread (`shared` is then false and nothing below touches
// the lock). done(), progress and every check run under it. At every idle turn of the spin a
// waiting thread is let in; the sleep happens with the lock released, so other threads'
// calls (on other groups) post, progress and complete meanwhile; the lock is taken back
// before anything is looked at again. Several threads may sleep at once: the doorbell counts
// its armed threads (wait/doorbell.hpp), and a peer's ring wakes all of them. A thread's
// operation completed by another thread's progress is seen without a lost wake-up: the
// completion consumed a peer's publication, and either that publication was visible to this
// thread's re-check (made under the lock after its arm(), so after or before the other
// thread's progress: then it saw the data, or saw its operation done) or its notifier saw
// `armed` and rang. A change no peer rings for (a withdrawn send) wakes the sleepers itself
// (wake_sleepers).
#pragma once

#include <sched.h>

#include <algorithm>

#include "engine/engine.hpp"

namespace shmdist::engine {

template <class Done>
bool Engine::block_until(Done&& done, const WaitFocus& focus, Clock::duration limit) {
  // What the caller waits for is often there already: no clock read, no bookkeeping.
  if (done()) return true;
  if (progress(focus.peer, false) && done()) return true;
  const bool shared = lock_.held_by_this_thread();
  const auto started = Clock::now();
  const auto deadline = started + limit;
  bool published = false;
  // The rank's record of what it is blocked on (hang reports) is one per rank: with several
  // threads blocked, the latest one's wait is shown, and it is cleared when the last leaves.
  struct ClearBlocked {
    Engine* e;
    bool* published;
    ~ClearBlocked() {
      if (*published && --e->blocked_waits_ == 0) e->transport_->clear_blocked();
    }
  } clear_on_exit{this, &published};

  for (auto now = started;; now = Clock::now()) {
    // Phase 1: spin (briefly, yielding, if more ranks are awake than there are CPUs).
    const wait::SpinPolicy::Choice how =
        spin_.choose(std::max(transport_->awake_ranks(), focus.crowd));
    auto spin_until = now + how.spin;
    auto next_check = now + spin_.health_check;
    std::uint64_t moves_seen = focus.moves ? *focus.moves : 0;
    for (unsigned iter = 1;; ++iter) {
      if (done()) return true;
      // Another thread waits to enter (a call on another group): let it in now, then look
      // again (its progress may have completed this wait). No `continue`: two threads that
      // wait at once pass the lock to each other at every turn, and each turn must still
      // make progress and reach the deadline check.
      if (shared && lock_.contended()) [[unlikely]] {
        lock_.let_others_in();
        if (done()) return true;
      }
      if (focus.moves && *focus.moves != moves_seen) {  // the call moved: spin on
        moves_seen = *focus.moves;
        spin_until = Clock::now() + how.spin;
      }
      if (progress(focus.peer, false)) {
        spin_until = Clock::now() + how.spin;
        continue;
      }
      // Crowded (more ranks awake than CPUs): give the CPU away at every idle turn, as
      // Open MPI's mpi_yield_when_idle does, so that a peer with work runs instead of us and
      // nobody pays a futex wake-up for a reply that comes within the spin time.
      if (how.yield) {
        sched_yield();
      } else {
        wait::cpu_relax();
        if ((iter & 63) != 0) continue;
      }
      now = Clock::now();
      if (now >= deadline) return false;
      if (now >= next_check) {
        check_failures(focus);
        next_check = now + spin_.health_check;
      }
      if (now >= spin_until) break;
    }
    // Phase 2: sleep on the doorbell (wait/doorbell.hpp explains why no wake-up is lost).
    if (!published) {
      publish_blocked(focus);
      ++blocked_waits_;
      published = true;
    }
    for (;;) {
      const std::uint32_t token = transport_->arm();
      bool ready = false;
      try {
        ready = progress(focus.peer, true) || done();  // done() may throw (wait_until)
      } catch (...) {
        transport_->disarm();
        throw;
      }
      if (ready) {
        transport_->disarm();
        break;  // back to spinning: more is likely to follow
      }
      try {
        check_failures(focus);
      } catch (...) {
        transport_->disarm();
        throw;
      }
      now = Clock::now();
      if (now >= deadline) {
        transport_->disarm();
        return false;
      }
      const auto nap = std::min<Clock::duration>(deadline - now, spin_.health_check);
      ++sleepers_;
      if (shared) {
        // Asleep without the lock. The guard takes it back however sleep() ends, so that
        // every path out of here (disarm, the caller's withdraw) runs under it.
        struct Relock {
          EngineLock& lock;
          ~Relock() { lock.reacquire(); }
        } relock{lock_};
        lock_.release();
        transport_->sleep(token, nap);
      } else {
        transport_->sleep(token, nap);
      }
      --sleepers_;
      transport_->disarm();
    }
  }
}

template <class Done>
void Engine::wait_until(Done&& done, const BackgroundTask& task, std::uint64_t bytes,
                        CollectiveWait how) {
  WaitFocus focus{kBlockedCollective, -1, nullptr, {}, bytes, &task, how.crowd, how.moves};
  if (!block_until(done, focus, timeout_)) throw_timeout(focus, timeout_);
}

}  // namespace shmdist::engine
