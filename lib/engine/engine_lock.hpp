// The lock that lets several threads of one rank use its Engine at once (MPI_THREAD_MULTIPLE:
// a torch process group per thread, or one C++ Group per thread, over the same ranks).
//
// Every call into the engine holds it (Engine::enter, at the ProcessGroup's entry points),
// so the engine, its transport and the collectives above them see one thread at a time: the
// lock's release/acquire pair gives the happens-before edges between successive holders. A
// call that has to wait never keeps it while it does nothing (Engine::block_until): it lets
// a waiting thread in at every turn of its spin (let_others_in) and releases it while it
// sleeps on the doorbell. So the lock is only ever held for a bounded stretch of work that
// does not wait for a peer (the longest: a single-copy sender whose send gave up, waiting
// for a receiver's copy out of its buffer, shm_offers.cpp), and a call on one group never
// waits for a call on another group to finish.
//
// Which thread drives progress: whichever holds the lock. progress() serves every pending
// operation of the rank, whoever posted it, so a thread that sleeps is never needed for its
// own operation to move: another thread's progress may complete it, and then a peer's
// doorbell ring (its publication came after this thread armed) or the re-check under the lock
// tells it (waiter.hpp).
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>

#include "wait/futex.hpp"

namespace shmdist::engine {

class EngineLock {
 public:
  using Clock = std::chrono::steady_clock;

  // Takes the lock, waiting at most until `deadline`; false if another thread held it all
  // that time. The entry of every call: no wait for the lock outlives the call's timeout.
  // Takes the lock if it is free right now (no clock read, no waiting): the common entry
  // of a single-threaded rank, which acquire_until would make read the clock first.
  bool try_acquire() {
    if (!try_lock()) return false;
    return took();
  }
  bool acquire_until(Clock::time_point deadline) {
    if (try_lock()) [[likely]]
      return took();
    contenders_.fetch_add(1, std::memory_order_relaxed);
    const bool got = lock_slow(deadline);
    contenders_.fetch_sub(1, std::memory_order_relaxed);
    if (!got) return false;
    handoffs_.fetch_add(1, std::memory_order_relaxed);
    return took();
  }
  // Takes the lock back inside a call that let it go while it waited. Unbounded, and that is
  // safe: every holder releases it within a stretch of non-blocking work (see above), and
  // the call checks its own deadline as soon as it has it again.
  void reacquire() {
    if (try_lock()) {
      took();
      return;
    }
    contenders_.fetch_add(1, std::memory_order_relaxed);
    lock_slow(std::nullopt);
    contenders_.fetch_sub(1, std::memory_order_relaxed);
    handoffs_.fetch_add(1, std::memory_order_relaxed);
    took();
  }
  void release() {
    owner_.store(std::thread::id{}, std::memory_order_relaxed);
    // Release: every change the holder made happens before the next holder's acquire.
    if (word_.exchange(kFree, std::memory_order_release) == kWaited) wait::futex_wake(word_, 1);
  }

  // Whether the calling thread holds the lock. Relaxed is enough: owner_ holds this thread's
  // id only if this very thread stored it (sequenced before this load); no other thread can
  // store that value, so a stale read can only be another id or none, both meaning "no".
  bool held_by_this_thread() const {
    return owner_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }
  // Whether another thread waits for the lock. A hint, read at every turn of a spin: a stale
  // value costs one more turn before the holder lets it in, never correctness.
  bool contended() const { return contenders_.load(std::memory_order_relaxed) != 0; }

  // A holder with nothing to do lets a waiting thread in: releases the lock, gives the CPU
  // away until another thread took it (or nobody waits any more: a waiter gave up), and takes
  // it back as a contender itself, so that the thread now holding it lets it back in at its
  // own next idle turn. A plain unlock-lock would hand it straight back to the spinner: the
  // woken waiter needs microseconds to run, the spinner's next lock takes nanoseconds.
  void let_others_in() {
    const std::uint64_t seen = handoffs_.load(std::memory_order_relaxed);
    release();
    while (contenders_.load(std::memory_order_relaxed) != 0 &&
           handoffs_.load(std::memory_order_relaxed) == seen)
      sched_yield();
    reacquire();
  }

  // What the holder is doing ("all_reduce"), for the Timeout of a thread that could not get
  // in. Written by the holder under the lock; read by a waiter without it, hence atomic
  // (string literals only, so the pointer stays valid).
  void set_call(const char* call) { call_.store(call, std::memory_order_relaxed); }
  const char* call() const { return call_.load(std::memory_order_relaxed); }

 private:
  // The mutex itself: one futex word (U. Drepper, "Futexes Are Tricky", mutex 3), not
  // std::timed_mutex, whose timed lock (pthread_mutex_clocklock) ThreadSanitizer does not
  // see as an acquisition; it sees these atomics. kWaited: held, and a thread may be asleep
  // on the word, so the release must wake one.
  static constexpr std::uint32_t kFree = 0, kHeld = 1, kWaited = 2;
  bool try_lock() {
    std::uint32_t expected = kFree;
    return word_.compare_exchange_strong(expected, kHeld, std::memory_order_acquire,
                                         std::memory_order_relaxed);
  }
  // Marks the word kWaited and sleeps until it is taken (acquire: pairs with release()'s
  // exchange), or until `deadline`. A waiter that gives up leaves kWaited behind: the next
  // release then makes one wake-up for nobody, which is harmless.
  bool lock_slow(std::optional<Clock::time_point> deadline) {
    while (word_.exchange(kWaited, std::memory_order_acquire) != kFree) {
      std::chrono::nanoseconds left = std::chrono::seconds(1);  // unbounded: look again
      if (deadline) {
        left = std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - Clock::now());
        if (left.count() <= 0) return false;
      }
      wait::futex_wait(word_, kWaited, left);
    }
    return true;
  }
  bool took() {
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    return true;
  }

  std::atomic<std::uint32_t> word_{kFree};
  std::atomic<std::thread::id> owner_{};
  std::atomic<std::uint32_t> contenders_{0};  // threads blocked in acquire_until / reacquire
  std::atomic<std::uint64_t> handoffs_{0};    // acquisitions by a thread that had to wait
  std::atomic<const char*> call_{""};
};

}  // namespace shmdist::engine
