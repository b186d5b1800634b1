#include "base/cpus.hpp"

#include <sched.h>
#include <unistd.h>

namespace shmdist::cpus {

std::vector<int> allowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

int for_job(std::optional<int> local_cpus) {
  if (local_cpus && *local_cpus > 0) return *local_cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  const int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  if (allowed <= 1) {
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? static_cast<int>(online) : 1;
  }
  return allowed;
}

}  // namespace shmdist::cpus
