// Joining a job whose ranks were started by another launcher (torchrun, mpirun, PMI): the
// ranks meet on a shared segment named from the job's identity and the user id. Rank 0 claims
// the identity (identity_claim.hpp) and creates the segment, replacing whatever an earlier
// job of that identity left; the others attach to the segment of the claim's holder only; all
// wait for the full set; the name is removed as soon as every rank has attached. When two
// jobs are started with one identity, the second rank 0 to claim it fails, and a job still
// forming then (or whose rank finds its slot taken) is aborted, and so is a running job when
// a rank that began to join before it had all its ranks reports finding it running
// (identity_claim.hpp). Not ruled out: ranks started with identical variables are
// indistinguishable, so one job's rank 0 and the other's rank 1 that finish meeting before
// the others begin to join form a job (as with torch's TCPStore); only distinct identities
// prevent it, and a run id that the launcher sets is part of the identity (join.cpp,
// docs/other-launchers.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/world.hpp"

namespace shmdist::detail {

// Identity of an Open MPI job (its jobid) / a PMI job, for the rendezvous name.
std::string mpi_job_id();
std::string pmi_job_id();

// The segment name for a job identity and world size ("shmdist-<uid>-[<tag>-]rv-<hash>",
// shm_object_name), with this tag / with this process's SHMDIST_SHM_TAG.
std::string rendezvous_name(const std::string& job_id, int world_size, const std::string& shm_tag);
std::string rendezvous_name(const std::string& job_id, int world_size);

// A rank of `seg` other than `self` that claimed its slot and died, or -1 if the segment's
// creator died, or -2 if neither; sets `pid` to the dead process. Ranks publish their pid
// right after claiming their slot (0: not yet, counts as alive). For the waits until every
// rank has attached, which no launcher watches.
int dead_participant(const segment::Segment& seg, int self, int& pid);

// `global_of` (a job across hosts: the global rank of each local rank) names ranks in texts.
// `check`, if given, is called every 50 ms while this rank waits for the others and may
// throw to give up (launch(): a rank that will never come).
JoinedWorld join_by_rendezvous(int rank, int world_size, const std::string& job_id,
                               const InitOptions& options, const config::Config& config,
                               const TransportWrap& wrap = {},
                               const std::vector<int>& global_of = {},
                               const std::function<void()>& check = {});

}  // namespace shmdist::detail
