// How long a blocked call spins before it sleeps on its doorbell.
#pragma once

#include <chrono>
#include <optional>

#include "base/config.hpp"
#include "base/cpus.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace shmdist::wait {

// How often a blocked call looks at its peers' health (a setting: base/config.hpp).
using config::kDefaultHealthCheck;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// A futex sleep/wake costs 13-30 us one way on this class of VM and a cross-core hand-off
// tens to hundreds of ns, so while every awake rank has a CPU, a blocked call spins long
// enough to cover a typical turnaround. When more ranks are awake than there are CPUs, a
// pure spin would steal the CPU its peer needs, and sleeping at once makes every message
// pay a futex wake-up (the waker's system call and the sleeper's trip through the
// scheduler, both on the CPUs the talking ranks need): so a crowded rank calls sched_yield
// at every idle turn (the CPU goes to a runnable peer at once; with nobody runnable it
// comes straight back) for spin_crowded, long enough to cover a streaming peer's round of
// work, and then sleeps. Open MPI's mpi_yield_when_idle yields the same way, without end.
// "Awake" is counted live (SegmentHeader::sleeping), so 14 idle ranks asleep in a 16-rank
// job do not slow the two that talk.
struct SpinPolicy {
  int cpus = 1;                                        // CPUs the job's ranks share
  std::chrono::nanoseconds spin_alone{std::chrono::microseconds(50)};
  std::chrono::nanoseconds spin_crowded{std::chrono::microseconds(1000)};
  // How often a blocked call looks at peers' health, the job state and its deadline, while
  // spinning or asleep (the job's configuration sets it: SHMDIST_HEALTH_CHECK_MS).
  std::chrono::milliseconds health_check{kDefaultHealthCheck};

  struct Choice {
    std::chrono::nanoseconds spin;
    bool yield;
  };
  Choice choose(int awake_ranks) const {
    return shmdist::cpus::oversubscribed(awake_ranks, cpus) ? Choice{spin_crowded, true}
                                                            : Choice{spin_alone, false};
  }

  // `spin_us` (SHMDIST_SPIN_US) replaces both spin times; `cpus` is the job's CPU count
  // (cpus::for_job: SHMDIST_LOCAL_CPUS, else this process's affinity).
  static SpinPolicy for_job(std::optional<long> spin_us, int cpus,
                            std::chrono::milliseconds health_check);
};

}  // namespace shmdist::wait
