#include "wait/spin.hpp"

#include <sched.h>

namespace shmdist::wait {

SpinPolicy SpinPolicy::for_job(int local_ranks, long spin_us_override) {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  SpinPolicy p;
  const bool oversubscribed = local_ranks > cpus;
  p.spin = oversubscribed ? std::chrono::microseconds(2) : std::chrono::microseconds(50);
  p.yield = oversubscribed;
  if (spin_us_override >= 0) p.spin = std::chrono::microseconds(spin_us_override);
  return p;
}

}  // namespace shmdist::wait
