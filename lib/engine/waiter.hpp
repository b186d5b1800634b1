// The waiter: the one waiting loop every blocking call goes through (Waiter::block_until).
// It knows what a wait is for (WaitFocus: what the hang report shows, whom the wait needs),
// asks its caller's until() whether the wait is over, and moves everything else through the
// owner's progress hook (the engine's); it knows nothing of what the call is (a receive, a
// collective's rounds): callers above the engine (lib/coll/) pass what they know in.
//
// Phase 1 spins, making progress on everything (so a full ring's sender keeps draining its
// own inbound rings, and streams in flight keep moving), for the SpinPolicy's time after the
// last thing that moved (progress, or the caller's own call: until() returning Look::Moved);
// with more ranks awake than CPUs (or as the caller's spin choice says: a call every one of
// whose ranks must run) it yields the CPU at every turn that found nothing (and spins longer:
// a yield costs the others nothing). Phase 2 publishes what the call is blocked on (hang
// reports), arms the doorbell, re-checks with a full scan and sleeps; it wakes when a peer
// rings, or every health-check interval (100 ms) to look at peers' health, the job state and
// the deadline.
// Data never waits for that interval: it always comes with a wake-up (wait/doorbell.hpp),
// which the lost-wake-up stress test checks by making the interval an hour.
//
// Threads (engine/engine_lock.hpp): the caller holds the engine's lock, unless it is a unit
// test driving the engine from one thread (`shared` is then false and nothing below touches
// the lock). until(), progress and every check run under it. At every idle turn of the spin a
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
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/background.hpp"
#include "engine/engine_lock.hpp"
#include "segment/layout.hpp"
#include "transport/peers.hpp"
#include "transport/transport.hpp"
#include "transport/waker.hpp"
#include "wait/spin.hpp"

namespace shmdist::engine {

using Clock = std::chrono::steady_clock;
using transport::MatchKey;

// Codes for BlockedInfo::op (shown in hang reports): they live beside the shared record.
using segment::blocked_op_name;
using segment::BlockedOp;
using segment::kBlockedBarrier;
using segment::kBlockedCollective;
using segment::kBlockedDestroy;
using segment::kBlockedRecv;
using segment::kBlockedSend;
using segment::kBlockedWait;

// What a wait is for: what the hang report shows (op, peer, key, bytes), and which peers it
// depends on, for peer checks and error texts.
struct WaitFocus {
  std::uint32_t op = 0;  // BlockedOp
  int peer = -1;         // the one peer it needs, or -1
  const std::vector<int>* candidates = nullptr;  // any-source: the group's members (global)
  MatchKey key;
  std::uint64_t bytes = 0;
  // A call that knows whom it still waits for (a collective): it names the wait in errors,
  // and a silent peer it still waits for fails the wait.
  const WaitSubject* subject = nullptr;
};

// What a wait's until() returns when it does more than look (a call that drives itself, as a
// collective's rounds on the world lane): Moved restarts the spin time, so that a long call
// that keeps moving round after round does not fall asleep between its rounds. An until()
// returning bool means Done or Idle.
enum class Look : std::uint8_t { Idle, Moved, Done };

// How a wait spins before it sleeps, when its caller knows better than the count of ranks
// awake right now (SpinPolicy::choose(awake ranks), the default): a call every one of whose
// N ranks must run before it can end passes choose(N), crowded however many sleep now.
using SpinChoice = std::optional<wait::SpinPolicy::Choice>;

class Waiter {
 public:
  // `transport`, `waker`, `peers` (the engine's link), `lock`, `spin` and `all_peers` (every
  // rank but this one) belong to the owner (the engine) and outlive the waiter. The waker
  // and the peers are called only once a wait found nothing (slow paths).
  Waiter(transport::Transport& transport, transport::Waker& waker, transport::Peers& peers,
         EngineLock& lock, const wait::SpinPolicy& spin, const std::vector<int>& all_peers)
      : transport_(&transport), waker_(&waker), peers_(&peers), lock_(lock), spin_(spin),
        all_peers_(all_peers), rank_(transport.rank()) {}

  // Spins, then sleeps, until until() says Done (true) or the deadline (false), making
  // progress on every pending operation meanwhile through `owner`, which provides
  //   bool progress(int preferred, bool full_scan)  (whether anything moved)
  //   std::size_t pending_operations()              (for the hang report)
  // (a template parameter: no virtual call). Throws PeerFailure when the wait cannot succeed,
  // and whatever until() throws.
  template <class Until, class Owner>
  bool block_until(Until&& until, Owner&& owner, const WaitFocus& focus, Clock::duration limit,
                   SpinChoice spin = std::nullopt);

  // Throws PeerFailure if a peer ended abnormally or the job was aborted (check_peers of the
  // engine), naming `waiting_for`.
  void check_peers(const std::string& waiting_for);
  [[noreturn]] void throw_timeout(const WaitFocus& focus, Clock::duration waited);
  std::string describe(const WaitFocus& focus) const;
  // After a change made by this thread alone that another thread's sleeping wait may be
  // waiting for (a send withdrawn from the head of its destination's queue, operations
  // failed): wakes the rank's sleepers, which no peer would wake for it.
  void wake_sleepers();
  // Engine::set_health_hook.
  void set_health_hook(std::function<void()> hook) { health_hook_ = std::move(hook); }

 private:
  template <class Until>
  static Look look_at(Until& until) {
    if constexpr (std::is_same_v<std::invoke_result_t<Until&>, Look>) return until();
    else return until() ? Look::Done : Look::Idle;
  }
  void publish_blocked(const WaitFocus& focus, std::size_t pending_ops);
  void check_failures(const WaitFocus& focus);
  template <class What>
  void fail_on_abnormal_end(What&& what);
  int rank() const { return rank_; }

  transport::Transport* transport_;
  transport::Waker* waker_;
  transport::Peers* peers_;
  EngineLock& lock_;
  const wait::SpinPolicy& spin_;
  const std::vector<int>& all_peers_;
  int rank_;
  // Threads of this rank asleep in block_until (between arm and disarm). Under lock_.
  int sleepers_ = 0;
  // Waits of this rank's threads that published what they are blocked on. Under lock_.
  int blocked_waits_ = 0;
  std::function<void()> health_hook_;  // set_health_hook
};

template <class Until, class Owner>
bool Waiter::block_until(Until&& until, Owner&& owner, const WaitFocus& focus,
                         Clock::duration limit, SpinChoice spin) {
  // What the caller waits for is often there already: no clock read, no bookkeeping.
  if (look_at(until) == Look::Done) return true;
  if (owner.progress(focus.peer, false) && look_at(until) == Look::Done) return true;
  const bool shared = lock_.held_by_this_thread();
  const auto started = Clock::now();
  const auto deadline = started + limit;
  bool published = false;
  // The rank's record of what it is blocked on (hang reports) is one per rank: with several
  // threads blocked, the latest one's wait is shown, and it is cleared when the last leaves.
  struct ClearBlocked {
    Waiter* w;
    bool* published;
    ~ClearBlocked() {
      if (*published && --w->blocked_waits_ == 0) w->peers_->clear_blocked();
    }
  } clear_on_exit{this, &published};

  for (auto now = started;; now = Clock::now()) {
    // Phase 1: spin (briefly, yielding, if more ranks are awake than there are CPUs).
    const wait::SpinPolicy::Choice how = spin ? *spin : spin_.choose(waker_->awake_ranks());
    auto spin_until = now + how.spin;
    auto next_check = now + spin_.health_check;
    for (unsigned iter = 1;; ++iter) {
      Look look = look_at(until);
      if (look == Look::Done) return true;
      // Another thread waits to enter (a call on another group): let it in now, then look
      // again (its progress may have completed this wait). No `continue`: two threads that
      // wait at once pass the lock to each other at every turn, and each turn must still
      // make progress and reach the deadline check.
      if (shared && lock_.contended()) [[unlikely]] {
        lock_.let_others_in();
        const Look again = look_at(until);
        if (again == Look::Done) return true;
        if (again == Look::Moved) look = Look::Moved;
      }
      if (look == Look::Moved)  // the call moved: spin on
        spin_until = Clock::now() + how.spin;
      if (owner.progress(focus.peer, false)) {
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
      publish_blocked(focus, owner.pending_operations());
      ++blocked_waits_;
      published = true;
    }
    for (;;) {
      const std::uint32_t token = waker_->arm();
      bool ready = false;
      try {
        // until() may throw; a call that moved goes back to spinning, as one that is done
        // leaves.
        ready = owner.progress(focus.peer, true) || look_at(until) != Look::Idle;
      } catch (...) {
        waker_->disarm();
        throw;
      }
      if (ready) {
        waker_->disarm();
        break;  // back to spinning: more is likely to follow
      }
      try {
        check_failures(focus);
      } catch (...) {
        waker_->disarm();
        throw;
      }
      now = Clock::now();
      if (now >= deadline) {
        waker_->disarm();
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
        waker_->sleep(token, nap);
      } else {
        waker_->sleep(token, nap);
      }
      --sleepers_;
      waker_->disarm();
    }
  }
}

}  // namespace shmdist::engine
