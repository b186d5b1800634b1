// What joining a job hands to pg/: a JoinedWorld, this rank's place in the job (its host's
// segment, its rank, the world) and the transport that reaches every peer. bootstrap/ is
// the one layer that chooses transports: shared memory to the ranks of this host's segment
// (attach_world), and for an mpirun job across hosts a RoutingTransport that reaches the
// other hosts' ranks through MPI (bootstrap/join_hosts.cpp). pg/ builds the engine, the
// groups and the world lane on a JoinedWorld and chooses nothing about transports.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include <shmdist/process_group.hpp>

#include "base/config.hpp"
#include "segment/segment.hpp"
#include "transport/link.hpp"

namespace shmdist::detail {

// Wraps the shared-memory link of this host's segment into the link the engine uses (a
// routing link across hosts), whose transport then decides the rank and world size.
using TransportWrap = std::function<transport::Link(transport::Link)>;

struct JoinedWorld {
  std::shared_ptr<segment::Segment> segment;        // this host's segment
  transport::Link link;   // to every rank of the job: bytes, sleeping, peers' health
  int rank = -1;          // global rank (the link's transport's)
  int segment_rank = -1;  // rank in this host's segment (= rank unless the job spans hosts)
  int world = 0;          // ranks in the job (the transport's)
  // A job across hosts: the host of every global rank, hosts numbered 0, 1, ... in the order
  // of their lowest global rank (collectives reduce inside each host first). Empty when the
  // job is on one host.
  std::vector<int> host_of;
  std::chrono::milliseconds timeout{0};
  bool supervised = false;  // a launcher records how ranks end (shmrun, launch())
  config::Config config;    // the job's SHMDIST_* settings, as the join read them
  std::function<void()> after_destroy;  // e.g. release the identity claim
  std::function<void()> health_hook;    // for engine::Engine::set_health_hook, if set
};

// Attaches `rank` to `segment` through the shared-memory transport, wrapped by `wrap` for a
// job across hosts (`rank` is then the rank in the host's segment, and the wrapped transport
// gives the global rank and world size). `supervised`: a launcher records how ranks end
// (shmrun, launch()); otherwise the transport watches peers' processes. `config`: spin
// policy, health-check interval, single copy. Throws SetupError if the rank's slot is taken.
JoinedWorld attach_world(std::shared_ptr<segment::Segment> segment, int rank,
                         std::chrono::milliseconds timeout, const config::Config& config,
                         bool supervised, const TransportWrap& wrap = {});

// Reads the launcher's environment and joins the job (bootstrap/join.cpp).
JoinedWorld join_from_environment(const InitOptions& options);

}  // namespace shmdist::detail
