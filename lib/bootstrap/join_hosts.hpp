// Joining an mpirun job whose ranks may sit on several hosts (API.md §9): ranks are grouped
// by host identity, each host's ranks meet on their own segment (named from the job and the
// host), and ranks on different hosts talk through MPI (transport/mpi_transport.hpp).
#pragma once

#include <memory>
#include <string>

#include "base/config.hpp"
#include "bootstrap/world.hpp"

namespace shmdist::detail {

// This process's host identity: SHMDIST_HOST_ID (config.host_id) if set, else the kernel's
// boot id, else the host name.
std::string host_identity(const config::Config& config);

// Whether an mpirun job of `world` ranks needs the multi-host path: SHMDIST_HOST_ID is set,
// or Open MPI says fewer ranks share this node than the job has (OMPI_COMM_WORLD_LOCAL_SIZE).
// Only then is MPI initialised; a job on one host uses shared memory only.
bool mpi_job_spans_hosts(int world, const config::Config& config);

JoinedWorld join_across_hosts(int rank, int world, const InitOptions& options,
                              const config::Config& config);

}  // namespace shmdist::detail
