// How long a blocked call spins before it sleeps on its doorbell.
#pragma once

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace shmdist::wait {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

struct SpinPolicy {
  std::chrono::nanoseconds spin{0};  // spin this long before arming the doorbell
  bool yield = false;                // call sched_yield while spinning (oversubscribed)
  // How often a blocked call looks at peers' health, the job state and its deadline, while
  // spinning or asleep (SHMDIST_HEALTH_CHECK_MS overrides it, for tests).
  std::chrono::milliseconds health_check{100};

  // A futex sleep/wake costs 20-30 us one way on this class of VM and a cross-core hand-off
  // tens of ns, so with a CPU per rank we spin long enough to cover a typical turnaround.
  // With more ranks than CPUs a spinning rank steals the CPU its peer needs: spin briefly,
  // yield, and sleep soon. `spin_us_override` >= 0 (SHMDIST_SPIN_US) replaces the time;
  // `cpus_override` > 0 (SHMDIST_LOCAL_CPUS, set by launchers) is the job's CPU count.
  static SpinPolicy for_job(int local_ranks, long spin_us_override = -1, long cpus_override = -1);
  // CPUs the job's ranks share on this host.
  static int job_cpus(long cpus_override = -1);
};

}  // namespace shmdist::wait
