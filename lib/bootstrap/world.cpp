#include "bootstrap/world.hpp"

#include "transport/shm_transport.hpp"

namespace shmdist::detail {

JoinedWorld attach_world(std::shared_ptr<segment::Segment> segment, int rank,
                         std::chrono::milliseconds timeout, const config::Config& config,
                         bool supervised, const TransportWrap& wrap) {
  JoinedWorld joined;
  const bool threads = segment->header().flags & segment::kThreadMode;
  const std::uint64_t single_copy =
      config.single_copy.value_or(threads ? config::kDefaultSingleCopy : 0);
  transport::Link shm =
      transport::make_shm_link(segment, rank, supervised, config.health_check, single_copy);
  joined.link = wrap ? wrap(std::move(shm)) : std::move(shm);
  joined.rank = joined.link.bytes->rank();
  joined.world = joined.link.bytes->world_size();
  joined.segment_rank = rank;
  joined.segment = std::move(segment);
  joined.timeout = timeout;
  joined.supervised = supervised;
  joined.config = config;
  return joined;
}

}  // namespace shmdist::detail
