// Thin wrappers over futex(2) for words in shared memory: shared futexes (no
// FUTEX_PRIVATE_FLAG), because waiter and waker are usually different processes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace shmdist::wait {

// Sleeps while *word == expected, at most `timeout`. Returns on wake-up, timeout, a changed
// value or a signal; callers re-check their condition in every case.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                std::chrono::nanoseconds timeout);

// Wakes up to `count` waiters sleeping on `word`.
void futex_wake(std::atomic<std::uint32_t>& word, int count);

}  // namespace shmdist::wait
