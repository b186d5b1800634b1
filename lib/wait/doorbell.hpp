// A rank's doorbell: one futex word that every peer can ring, and an `armed` word saying the
// owner may be asleep. Both live in the owner's control block in the shared segment
// (segment/layout.hpp, RankControl); this layer only needs their addresses.
//
// The owner sleeps on it when it waits for anything (data from any peer, space in a ring to
// any peer). The protocol is an event count; no wake-up can be lost:
//
//   waiter (owner)                          notifier (a peer)
//   seq = doorbell_seq (acquire)            publish data/space (release store)
//   armed = 1                               fence(seq_cst)                    [F_n]
//   fence(seq_cst)                 [F_w]    if armed: ++doorbell_seq, FUTEX_WAKE
//   re-check every condition
//   FUTEX_WAIT(doorbell_seq, seq)
//
// The two seq_cst fences are totally ordered. If F_w comes first, the notifier's load after
// F_n sees armed == 1, bumps the sequence and wakes: FUTEX_WAIT then either sees a changed
// word and returns at once, or is already queued and gets woken. If F_n comes first, the
// waiter's re-check after F_w sees the published data and does not sleep. Either way the
// waiter cannot sleep through a publication. Without the fences, x86 may let each side's
// load pass its own earlier store (StoreLoad reordering) and both would miss each other.
//
// The notifier pays one fence and one load of a line that is rarely written; it makes a
// system call only when the owner is really asleep (armed), so the fast path has none.
// Where the kernel allows, F_n is only a compiler barrier and F_w a membarrier(2) as well
// (wait/fence.hpp says why that pair orders like two seq_cst fences): the owner that issues
// the heavy F_w says so in a third word (`heavy`), which notifiers read before choosing.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>

#include "wait/fence.hpp"
#include "wait/futex.hpp"

namespace shmdist::wait {

// The two words of one doorbell.
struct DoorbellWords {
  std::atomic<std::uint32_t>* seq = nullptr;    // the futex word, bumped by every wake-up
  std::atomic<std::uint32_t>* armed = nullptr;  // nonzero while the owner may sleep
  // Nonzero: every arm() of the owner issues a heavy fence (membarrier), so notifiers of a
  // registered process may use a light one. Set once when the owner joins, before it can
  // arm, and cleared only if a membarrier ever fails; a notifier that reads 0 uses a full
  // fence, which is always correct.
  std::atomic<std::uint32_t>* heavy = nullptr;
};

// Unconditional wake-up (the launcher uses it on abort; notifiers when the owner is armed).
inline void wake(std::atomic<std::uint32_t>& seq) {
  seq.fetch_add(1, std::memory_order_release);
  futex_wake(seq, INT_MAX);
}

// Notifier side, after the fence F_n that follows the publication: wakes the owner if armed.
inline void wake_if_armed(DoorbellWords owner) {
  if (owner.armed->load(std::memory_order_relaxed) != 0) wake(*owner.seq);
}

// Waiter side.
class Doorbell {
 public:
  Doorbell() = default;
  // `sleeping` counts the job's armed ranks (SegmentHeader::sleeping): spin policies read it
  // to tell how many ranks compete for the CPUs right now. It is a statistic, not part of
  // the wake-up protocol, so relaxed updates are enough.
  // `heavy`: arm() issues membarrier (wait/fence.hpp) and announces it in own.heavy.
  Doorbell(DoorbellWords own, std::atomic<std::uint32_t>& sleeping, bool heavy = false)
      : own_(own), sleeping_(&sleeping), heavy_(heavy && own.heavy != nullptr) {}

  // Tells notifiers whether this owner's arm() issues heavy fences. Call it once the owner
  // holds its slot (never for a slot another process may own). Relaxed is enough: a notifier
  // that does not see it yet reads 0 and uses a full fence.
  void announce() {
    if (own_.heavy) own_.heavy->store(heavy_ ? 1 : 0, std::memory_order_relaxed);
  }

  // Announces that the owner may sleep. After this, re-check every condition, then sleep()
  // with the returned sequence (or disarm() if something turned up).
  //
  // Several threads of the owner may be armed at once (threads of one rank, each waiting in
  // its own call; engine/engine_lock.hpp). arm() and disarm() are then serialized by the
  // owner's lock, which is why armers_ is a plain counter, while sleep() runs outside it.
  // `armed` is 1 while any thread is armed: set by the first arm(), cleared by the last
  // disarm(). Every arm() still issues its own F_w, and that is enough for a thread that
  // found `armed` set by another one: that store happens before this F_w (through the lock),
  // so a notifier whose load of `armed` reads an older value is coherence-ordered before the
  // store, and C++20 [atomics.order] (4.4) then puts its F_n before this F_w in the single
  // total order, i.e. this thread's re-check sees the notifier's publication. The last
  // disarm() comes after every armed thread has stopped sleeping, so no store of 0 can hide
  // a sleeper. FUTEX_WAKE wakes every sleeper (wake() wakes INT_MAX).
  std::uint32_t arm() {
    const std::uint32_t seq = own_.seq->load(std::memory_order_acquire);
    if (armers_++ == 0) {
      own_.armed->store(1, std::memory_order_relaxed);
      sleeping_->fetch_add(1, std::memory_order_relaxed);  // the rank, not each thread
    }
    if (!heavy_) {
      std::atomic_thread_fence(std::memory_order_seq_cst);  // F_w
    } else if (!heavy_fence()) [[unlikely]] {                // F_w, and membarrier
      // Cannot happen once registered; if it does, notifiers go back to full fences (one
      // that already chose a light one may be missed: this sleep then ends at its timeout).
      heavy_ = false;
      own_.heavy->store(0, std::memory_order_relaxed);
    }
    return seq;
  }
  void sleep(std::uint32_t seq, std::chrono::nanoseconds timeout) {
    futex_wait(*own_.seq, seq, timeout);
  }
  void disarm() {
    if (--armers_ != 0) return;
    own_.armed->store(0, std::memory_order_relaxed);
    sleeping_->fetch_sub(1, std::memory_order_relaxed);
  }
  // Wakes every thread of the owner asleep on its own doorbell (a change one of its threads
  // made, which no peer rings for). Called with the owner's lock held, like arm().
  void wake_own() {
    if (armers_ != 0) wake(*own_.seq);
  }

 private:
  DoorbellWords own_;
  std::atomic<std::uint32_t>* sleeping_ = nullptr;
  bool heavy_ = false;
  std::uint32_t armers_ = 0;  // the owner's threads between arm() and disarm()
};

}  // namespace shmdist::wait
