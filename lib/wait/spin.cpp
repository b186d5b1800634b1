#include "wait/spin.hpp"

#include <sched.h>
#include <unistd.h>

namespace shmdist::wait {

int SpinPolicy::job_cpus(long cpus_override) {
  if (cpus_override > 0) return static_cast<int>(cpus_override);
  cpu_set_t set;
  CPU_ZERO(&set);
  const int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  // A rank pinned to one CPU (shmrun --bind-to core, mpirun's default binding) says nothing
  // about how many CPUs the job has: count the online ones instead.
  if (allowed <= 1) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? static_cast<int>(online) : 1;
  }
  return allowed;
}

SpinPolicy SpinPolicy::for_job(long spin_us_override, long cpus_override) {
  SpinPolicy p;
  p.cpus = job_cpus(cpus_override);
  if (spin_us_override >= 0)
    p.spin_alone = p.spin_crowded = std::chrono::microseconds(spin_us_override);
  return p;
}

}  // namespace shmdist::wait
