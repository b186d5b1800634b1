// The job's CPUs, answered once for everybody: how many CPUs the job's ranks may use, and
// whether more ranks want to run than that. The spin policy (wait/spin.hpp), the engine's
// direct receive, the world lane's collectives (coll/) and shmrun's --bind-to core all ask
// here, so that an affinity mask or SHMDIST_LOCAL_CPUS means the same to each of them.
#pragma once

#include <optional>
#include <vector>

namespace shmdist::cpus {

// The CPUs the calling thread may run on (its affinity mask, which a process inherits from
// taskset, cgroups' cpusets, mpirun or shmrun --bind-to core), ascending; {0} if the mask
// cannot be read.
std::vector<int> allowed();

// How many CPUs the job's ranks share: `local_cpus` (SHMDIST_LOCAL_CPUS, config::Config::
// local_cpus) when set; else how many the calling thread may run on, or, when that is one
// (a rank pinned to a core, as shmrun --bind-to core and mpirun's default binding do, which
// says nothing about the job's share), the online CPUs. At least 1.
int for_job(std::optional<int> local_cpus);

// The CPUs a host's `host_ranks` ranks may count on when the machine also runs other hosts'
// ranks of the job, `machine_ranks` in all (hosts emulated on one machine, containers or
// mount namespaces of one kernel with a /dev/shm each): this process's CPUs (as for_job
// counts them) in proportion, at least 1. nullopt when the host has the machine alone or the
// share is not fewer than for_job would count: a host's ranks that spin as if they had every
// CPU take the CPUs the other hosts' ranks need.
std::optional<int> machine_share(int host_ranks, int machine_ranks);

// Whether `ranks` ranks that want to run at the same time are more than `cpus` CPUs can run:
// then a waiting rank gives its CPU away instead of spinning on it.
constexpr bool oversubscribed(int ranks, int cpus) { return ranks > cpus; }

}  // namespace shmdist::cpus
