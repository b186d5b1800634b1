#include "job/launch_protocol.hpp"

namespace shmdist::job {

std::uint64_t default_ring_size(int ranks) { return segment::default_ring_size(ranks); }

segment::Segment create_job_segment(int ranks, std::uint64_t ring_size) {
  return segment::Segment::create_memfd(ranks, ring_size);
}

std::vector<std::pair<std::string, std::string>> rank_environment(const segment::Segment& seg,
                                                                  int rank,
                                                                  const std::string& name) {
  const std::string world = std::to_string(seg.world_size());
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", world},
          {"LOCAL_RANK", std::to_string(rank)},
          {"LOCAL_WORLD_SIZE", world},
          {"SHMDIST_SEGMENT_FD", std::to_string(seg.fd())},
          {"SHMDIST_SEGMENT", name},  // no name in /dev/shm: for diagnostics only
          {"SHMDIST_JOB_KEY", segment::format_job_key(seg.header().job_key)}};
}

}  // namespace shmdist::job
