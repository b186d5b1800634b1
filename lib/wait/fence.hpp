// Asymmetric fences for the doorbell protocol (wait/doorbell.hpp): the frequent side (a
// notifier, after every publication) pays only a compiler barrier, the rare side (a waiter,
// about to sleep) pays a membarrier(2) system call that puts a full memory barrier on every
// CPU running a thread of a registered process. Linux's membarrier(2) and folly's
// asymmetric_thread_fence_{light,heavy} are this idea.
//
// Why a light fence L in a notifier and a heavy fence H in a waiter order like two seq_cst
// fences (the C++ memory model has no membarrier, so this is the contract of the system
// call, stated as the model's fence rule): when H returns, every thread of a registered
// process has executed a full barrier at some point B during H (a running thread by an
// interrupt, a thread that is not running at its next context switch, which is a barrier).
// So each L, being a point in its thread's program order that the compiler may not move
// accesses across (atomic_signal_fence(seq_cst)), is either before B or after it: if before,
// the notifier's stores sequenced before L are visible to the waiter's loads after H; if
// after, the waiter's stores sequenced before H are visible to the notifier's loads after L.
// That is exactly what the protocol needs of the two seq_cst fences F_n and F_w.
//
// The light fence is safe only when BOTH hold: this process is registered (otherwise H does
// not reach our CPUs), and the waiter issues H (it says so in its control block, see
// RankControl::heavy_fences). Each side falls back to a full fence when it cannot know.
#pragma once

#include <atomic>

namespace shmdist::wait {

// Registers this process for membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) (idempotent, cheap
// after the first call in a process). True if the kernel supports it and registration
// succeeded: this process's notifiers may then use light fences towards waiters that issue
// heavy ones, and its waiters can issue heavy ones. Call it in the process that uses the
// result (registration is per process and not inherited by fork).
bool register_asymmetric_fences();

// The waiter's side: a full fence, then membarrier(GLOBAL_EXPEDITED). Returns false if the
// system call failed (then only the full fence was issued).
bool heavy_fence();

// The notifier's side: light if the waiter issues heavy fences and this process registered.
inline void notifier_fence(bool light) {
  if (light) std::atomic_signal_fence(std::memory_order_seq_cst);
  else std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace shmdist::wait
