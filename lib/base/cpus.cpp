#include "base/cpus.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

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

std::optional<int> machine_share(int host_ranks, int machine_ranks) {
  if (host_ranks <= 0 || machine_ranks <= host_ranks) return std::nullopt;
  const int cpus = for_job(std::nullopt);
  const int share = std::max(1, static_cast<int>(static_cast<long long>(cpus) * host_ranks /
                                                 machine_ranks));
  if (share >= cpus) return std::nullopt;
  return share;
}

}  // namespace shmdist::cpus
