#include "wait/spin.hpp"

#include <sched.h>
#include <unistd.h>

namespace shmdist::wait {

int SpinPolicy::job_cpus(std::optional<int> cpus) {
  if (cpus && *cpus > 0) return *cpus;
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

SpinPolicy SpinPolicy::for_job(std::optional<long> spin_us, std::optional<int> cpus,
                               std::chrono::milliseconds health_check) {
  SpinPolicy p;
  p.cpus = job_cpus(cpus);
  if (spin_us && *spin_us >= 0) p.spin_alone = p.spin_crowded = std::chrono::microseconds(*spin_us);
  p.health_check = health_check;
  return p;
}

}  // namespace shmdist::wait
