// shmdist/embedding.hpp: what a runtime that brings its own rendezvous and group bookkeeping
// needs from shmdist. The torch.distributed backend (python/) is one: it joins jobs through
// torch's key-value store, maps torch's sub-groups, which only their members create, onto the
// world's segment, and refuses calls it cannot carry on every member at once. Everything here
// is public and keeps its names (namespace shmdist::embedding); docs/embedding.md describes it.
// (These names were shmdist::detail's in lib/pg/runtime_hooks.hpp; the detail:: spellings
// below keep working.)
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <shmdist/process_group.hpp>

namespace shmdist::embedding {

// A key-value store shared by the ranks of one job (torch's c10d::Store): `set` publishes a
// value, `get` blocks until the key exists (and throws after the store's own timeout).
struct KeyValueStore {
  std::function<void(const std::string& key, const std::string& value)> set;
  std::function<std::string(const std::string& key)> get;
};

// Joins rank `rank` of a job of `world` ranks. In a process started by shmrun (or launch())
// whose launcher segment has not been used yet, on that segment; otherwise rank 0 creates a
// fresh segment under an unguessable name and announces it, with its job key and creator
// pid, through `store`, and the others attach to it. A segment announced by an earlier job
// (its creator gone, its name gone, another job key) is never joined. The name is removed
// from /dev/shm once every rank has attached (or when the join fails).
// `global_of`, if not empty, is the rank each of the job's ranks stands for in error texts (a
// runtime that joins one host's ranks of a job across hosts as a job of their own numbers them
// 0..world-1 here, but every error names their global rank): world entries, by rank.
// `machine_ranks`, if above `world`: the ranks on this machine in all, this job's and those
// of other jobs that share its CPUs (the same runtime's hosts emulated on one machine, or
// containers with their own /dev/shm on one kernel). The job then counts its share of this
// process's CPUs (world x CPUs / machine_ranks, at least 1) unless SHMDIST_LOCAL_CPUS says
// otherwise, so that its waits give the CPU away instead of spinning on one the others need.
ProcessGroup join_through_store(int rank, int world, std::chrono::milliseconds timeout,
                                const KeyValueStore& store, const std::vector<int>& global_of,
                                int machine_ranks);
// The same with this job alone on its machine's CPUs (the signature before machine_ranks,
// kept for programs built against it).
ProcessGroup join_through_store(int rank, int world, std::chrono::milliseconds timeout,
                                const KeyValueStore& store,
                                const std::vector<int>& global_of = {});

// How many CPUs `pg`'s job counts as its ranks' (SHMDIST_LOCAL_CPUS, else its share of the
// machine, else this process's CPUs): more ranks awake than that, and waits give the CPU
// away. For a runtime sizing its own threads beside the job.
int job_cpus(const ProcessGroup& pg);

// For a runtime's own wait that needs every rank of `pg`'s job (torch's store-based barrier,
// which knows nothing of processes): throws PeerFailure naming the rank if one ended
// abnormally, as a blocked shmdist call would; `waiting_for` names that wait in the text.
// Never blocks: call it from the wait's own loop.
void check_peers(const ProcessGroup& pg, const std::string& waiting_for);

// barrier(group) without blocking (torch's barrier(async_op=True)): the same collective as
// ProcessGroup::barrier, counted in the group's sequence; its Work completes once every
// member has made this barrier call.
Work start_barrier(ProcessGroup& pg, const Group& group);

// A collective `call` (a name as shmdist spells it: "all_reduce", "broadcast", ...) on
// `group` whose arguments the runtime rejected itself, with `why`: posted without blocking,
// it makes the other members' matching calls fail at once naming this member (instead of
// waiting for a call that never comes), and its Work fails with InvalidArgument saying
// `why`. Throws InvalidArgument for an unknown `call`.
Work reject_collective(ProcessGroup& pg, const Group& group, const std::string& call,
                       const std::string& why);

// Ids of groups a runtime chooses start here; below are new_group's (1, 2, ... in creation
// order, checked by the engine's group agreement, which does not see these).
inline constexpr std::uint32_t kFirstRuntimeGroupId = 1u << 29;

// A group of `pg` with the given members (global ranks, sorted, unique) and id (at least
// kFirstRuntimeGroupId). Every member builds it with the same members and id, which no other
// group of the job uses; non-members need not build it at all. Throws InvalidArgument for
// bad members or ids.
Group group_with_id(const ProcessGroup& pg, std::vector<int> members, std::uint32_t id);

}  // namespace shmdist::embedding

// The former spellings (lib/pg/runtime_hooks.hpp), for code written against them.
namespace shmdist::detail {
using embedding::check_peers;
using embedding::group_with_id;
using embedding::join_through_store;
using embedding::KeyValueStore;
using embedding::kFirstRuntimeGroupId;
using embedding::reject_collective;
using embedding::start_barrier;
}  // namespace shmdist::detail
