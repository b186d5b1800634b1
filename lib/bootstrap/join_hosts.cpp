#include "bootstrap/join_hosts.hpp"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <set>

#include "base/cpus.hpp"
#include "base/env.hpp"
#include "bootstrap/rendezvous.hpp"
#include "transport/mpi_transport.hpp"
#include "transport/routing_transport.hpp"
#include "transport/shm_transport.hpp"

namespace shmdist::detail {

namespace {
// The running kernel's boot id: the same for every process of one machine (its containers
// and mount namespaces too), different on every other. Empty if it cannot be read.
std::string boot_id() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (boot && std::getline(boot, id)) return id;
  return {};
}
}  // namespace

std::string host_identity(const config::Config& config) {
  if (config.host_id) return *config.host_id;
  if (const std::string id = boot_id(); !id.empty()) return "boot:" + id;
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof name - 1) == 0 && name[0]) return "host:" + std::string(name);
  throw SetupError("cannot tell which host this rank runs on (no boot id, no host name); set "
                   "SHMDIST_HOST_ID");
}

bool mpi_job_spans_hosts(int world, const config::Config& config) {
  if (config.host_id) return true;
  const auto local = env::get_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, INT_MAX);
  return local && *local < world;
}

namespace {
std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  gethostname(name, sizeof name - 1);
  return name;
}
}  // namespace

JoinedWorld join_across_hosts(int rank, int world, const InitOptions& options,
                              const config::Config& config) {
  auto session = transport::MpiSession::start();
  if (session->size() != world || session->rank() != rank)
    throw SetupError("MPI says this is rank " + std::to_string(session->rank()) + " of " +
                     std::to_string(session->size()) + " but the environment (or InitOptions) "
                     "says rank " + std::to_string(rank) + " of " + std::to_string(world) +
                     "; under mpirun leave InitOptions::rank and world_size unset");
  const std::string me = host_identity(config);
  const std::vector<std::string> ids = session->allgather(me);
  // For error texts the real host name beside the identity, and each rank's kernel boot id,
  // which tells the hosts that share one machine (below): one exchange of "<boot id>\n<name>",
  // before the rendezvous, so that a rank whose join fails leaves no collective behind.
  // The same exchange carries each rank's wire format (transport::mpi_wire_format): a job
  // whose ranks run builds that cut MPI messages differently is refused here, naming them.
  const std::string machine = boot_id();
  const std::string wire = transport::mpi_wire_format();
  std::vector<std::string> names =
      session->allgather(machine + '\n' + wire + '\n' + host_name());
  std::vector<std::string> machines(world);
  std::string differ;
  for (int r = 0; r < world; ++r) {
    const auto next_line = [&] {
      const std::size_t cut = std::min(names[r].find('\n'), names[r].size());
      std::string line = names[r].substr(0, cut);
      names[r].erase(0, std::min(cut + 1, names[r].size()));
      return line;
    };
    machines[r] = next_line();
    const std::string theirs = next_line();
    if (theirs != wire && differ.empty())
      differ = "rank " + std::to_string(r) + " runs \"" + theirs + "\" but rank " +
               std::to_string(rank) + " runs \"" + wire + "\"";
  }
  if (!differ.empty())
    throw SetupError("the ranks of this job run different builds of shmdist: " + differ +
                     "; they would read each other's messages wrong. Install the same build "
                     "on every host.");
  std::vector<std::string> hosts(world);
  for (int r = 0; r < world; ++r)
    hosts[r] = ids[r].rfind("boot:", 0) == 0 ? names[r] : ids[r] + " on " + names[r];
  std::vector<int> local_members, remote;
  for (int r = 0; r < world; ++r) (ids[r] == me ? local_members : remote).push_back(r);
  int local_rank = 0;
  while (local_members[local_rank] != rank) ++local_rank;

  TransportWrap wrap = [&](transport::Link shm) {
    return transport::make_routing_link(rank, local_members, hosts, std::move(shm),
                                        transport::make_mpi_transport(session, remote));
  };
  // One segment per host, named from the job and the host identity.
  // Its slots are numbered by local rank; every text names the global rank.
  JoinedWorld joined =
      join_by_rendezvous(local_rank, static_cast<int>(local_members.size()),
                         mpi_job_id() + "/host:" + me, options, config, wrap, local_members);
  // Hosts that share this machine (SHMDIST_HOST_ID set apart on one kernel) share its CPUs:
  // this host's ranks count their share (cpus::machine_share), as SHMDIST_LOCAL_CPUS would
  // say, unless that is set. Otherwise each host's waits spin as if it had every CPU, and a
  // rank waiting for its leader keeps a CPU that the leaders' exchange needs.
  if (!joined.config.local_cpus && !machine.empty()) {
    const auto machine_ranks = std::count(machines.begin(), machines.end(), machine);
    joined.config.local_cpus = cpus::machine_share(static_cast<int>(local_members.size()),
                                                   static_cast<int>(machine_ranks));
  }
  // Every rank has every rank's identity, so all number the hosts alike: by lowest rank.
  std::vector<std::string> seen;
  for (int r = 0; r < world; ++r) {
    const auto at = std::find(seen.begin(), seen.end(), ids[r]);
    joined.host_of.push_back(static_cast<int>(at - seen.begin()));
    if (at == seen.end()) seen.push_back(ids[r]);
  }
  return joined;
}

}  // namespace shmdist::detail
