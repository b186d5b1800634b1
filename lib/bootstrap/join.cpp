// Joining a job from the environment: shmrun's variables (an inherited segment descriptor),
// or a foreign launcher's (torchrun, mpirun, PMI), which rendezvous on a named segment.

#include <unistd.h>

#include "base/env.hpp"
#include "bootstrap/join_hosts.hpp"
#include "bootstrap/rendezvous.hpp"
#include "bootstrap/world.hpp"
#include "segment/layout.hpp"

namespace shmdist::detail {
namespace {

constexpr const char* kUseShmrun =
    "Start the program with 'shmrun -n N program' (or torchrun / mpirun, which set RANK and "
    "WORLD_SIZE or OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE).";

struct RankAndWorld {
  int rank = -1;
  int world = -1;
};

// Takes RANK/WORLD_SIZE-style variables, letting InitOptions override them.
RankAndWorld rank_and_world(const InitOptions& options, const char* rank_var,
                            const char* world_var) {
  RankAndWorld rw;
  const auto world = env::get_int(world_var, 1, segment::kMaxWorldSize);
  rw.world = options.world_size >= 0 ? options.world_size : world ? static_cast<int>(*world) : -1;
  if (rw.world < 1 || rw.world > segment::kMaxWorldSize)
    throw SetupError(std::string(world_var) + " is " +
                     (rw.world < 0 ? std::string("not set") : std::to_string(rw.world)) +
                     ": expected the number of ranks, 1 to " +
                     std::to_string(segment::kMaxWorldSize) + ". " + kUseShmrun);
  const auto rank = env::get_int(rank_var, 0, rw.world - 1);
  rw.rank = options.rank >= 0 ? options.rank : rank ? static_cast<int>(*rank) : -1;
  if (rw.rank < 0 || rw.rank >= rw.world)
    throw SetupError(std::string(rank_var) + " is " +
                     (rw.rank < 0 ? std::string("not set") : std::to_string(rw.rank)) +
                     " but the world has " + std::to_string(rw.world) + " ranks: expected 0 to " +
                     std::to_string(rw.world - 1) + ". " + kUseShmrun);
  return rw;
}

// What launchers set once per run (the same for every rank of it, different for the next),
// folded into the identity of torchrun-style jobs: two runs with the same MASTER_ADDR,
// MASTER_PORT and WORLD_SIZE then meet on different segments and never mix. torchrun sets
// TORCHELASTIC_RUN_ID (its --rdzv-id; random per run with --standalone, "none" unless given
// otherwise, which tells nothing apart but harms nothing); Slurm the job and step ids (srun
// starts each step's tasks together); PBS, LSF and Flux their job ids. Empty when none is set.
std::string run_nonce() {
  std::string nonce;
  auto add = [&](const char* what, const char* var) {
    if (auto v = env::get(var)) nonce += std::string(nonce.empty() ? "" : " ") + what + *v;
  };
  add("torchelastic=", "TORCHELASTIC_RUN_ID");
  add("slurm=", "SLURM_JOB_ID");
  add("step=", "SLURM_STEP_ID");
  add("pbs=", "PBS_JOBID");
  add("lsf=", "LSB_JOBID");
  add("flux=", "FLUX_JOB_ID");
  return nonce.empty() ? nonce : " [" + nonce + "]";
}

// A later join of a shmrun job, after destroy_process_group (the ranks' slots in shmrun's
// segment are used up, and its descriptor is closed): the ranks meet on a fresh segment
// named after the job's key, which shmrun made random for this job, and the join's number,
// which every rank counts alike (a rank initializes again only once all ranks destroyed the
// previous group: destroy waits for them). As torch's re-initialization through its store
// does, and as under torchrun: the launcher still reaps the ranks and ends the job when one
// fails, and the ranks watch each other's processes themselves.
JoinedWorld rejoin_shmrun(const InitOptions& options, const config::Config& config, int join) {
  const RankAndWorld rw = rank_and_world(options, "RANK", "WORLD_SIZE");
  if (!config.job_key)
    throw SetupError("rank " + std::to_string(rw.rank) + ": init_process_group after "
                     "destroy_process_group needs SHMDIST_JOB_KEY, which shmrun sets with "
                     "SHMDIST_SEGMENT_FD; it is not set. " + kUseShmrun);
  return join_by_rendezvous(rw.rank, rw.world,
                            "shmrun:" + *config.job_key + "/join " + std::to_string(join),
                            options, config);
}

JoinedWorld join_shmrun(const InitOptions& options, const config::Config& config, int fd) {
  // The descriptor is used by the first join only (then closed); later joins of this
  // process, after destroy_process_group, meet elsewhere.
  static int joins = 0;
  if (joins > 0) {
    JoinedWorld joined = rejoin_shmrun(options, config, joins);
    ++joins;
    return joined;
  }
  const RankAndWorld rw = rank_and_world(options, "RANK", "WORLD_SIZE");
  std::shared_ptr<segment::Segment> seg;
  try {
    seg = std::make_shared<segment::Segment>(segment::Segment::attach_fd(fd, rw.world));
  } catch (const SetupError& e) {
    throw SetupError("SHMDIST_SEGMENT_FD=" + std::to_string(fd) + ": " + e.what() + " " +
                     kUseShmrun);
  }
  ::close(fd);  // the mapping stays; programs this rank starts must not inherit the segment
  if (config.job_key) {
    const std::string found = segment::format_job_key(seg->header().job_key);
    if (*config.job_key != found)
      throw SetupError("the segment behind SHMDIST_SEGMENT_FD belongs to another job (job key " +
                       found + ", expected " + *config.job_key + "). " + kUseShmrun);
  }
  const auto& rc = seg->rank_control(rw.rank);
  if (rc.state.load(std::memory_order_acquire) != 0)
    throw SetupError("rank " + std::to_string(rw.rank) + " of this job already joined (pid " +
                     std::to_string(rc.pid.load()) +
                     "); each rank may call init_process_group once per job");
  JoinedWorld joined =
      attach_world(std::move(seg), rw.rank, options.timeout, config, /*supervised=*/true);
  joins = 1;
  return joined;
}

}  // namespace

JoinedWorld join_from_environment(const InitOptions& options) {
  if (options.init_method != "env://")
    throw InvalidArgument("init_method '" + options.init_method +
                          "' is not supported: shmdist joins jobs through 'env://' only");
  if (options.timeout.count() <= 0)
    throw InvalidArgument("InitOptions::timeout must be positive, got " +
                          std::to_string(options.timeout.count()) + " ms");
  const config::Config config = config::from_environment();
  if (config.segment_fd) return join_shmrun(options, config, *config.segment_fd);

  // Foreign launchers: torchrun-style, Open MPI, PMI.
  if (env::get("OMPI_COMM_WORLD_RANK") || env::get("OMPI_COMM_WORLD_SIZE")) {
    const RankAndWorld rw = rank_and_world(options, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
    if (mpi_job_spans_hosts(rw.world, config))
      return join_across_hosts(rw.rank, rw.world, options, config);
    return join_by_rendezvous(rw.rank, rw.world, mpi_job_id(), options, config);
  }
  if (env::get("PMI_RANK") || env::get("PMI_SIZE")) {
    const RankAndWorld rw = rank_and_world(options, "PMI_RANK", "PMI_SIZE");
    return join_by_rendezvous(rw.rank, rw.world, pmi_job_id(), options, config);
  }
  if (env::get("RANK") || env::get("WORLD_SIZE") || options.rank >= 0) {
    const RankAndWorld rw = rank_and_world(options, "RANK", "WORLD_SIZE");
    const auto addr = env::get("MASTER_ADDR");
    const auto port = env::get("MASTER_PORT");
    if (!addr || !port)
      throw SetupError(
          "RANK and WORLD_SIZE are set but MASTER_ADDR/MASTER_PORT are not: ranks started "
          "without shmrun meet on a segment named after MASTER_ADDR and MASTER_PORT, so set "
          "both (torchrun does), or start the program with 'shmrun -n N program'.");
    env::parse_int("MASTER_PORT", *port, 1, 65535);
    return join_by_rendezvous(rw.rank, rw.world, "torch:" + *addr + ":" + *port + run_nonce(),
                              options, config);
  }
  throw SetupError(
      "this process was not started by a launcher: none of SHMDIST_SEGMENT_FD (shmrun), "
      "RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK (mpirun) or PMI_RANK is set. " +
      std::string(kUseShmrun));
}

}  // namespace shmdist::detail
