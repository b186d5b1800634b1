// What a launcher that starts rank processes gives them (shmrun): the job's segment, a memfd
// with no name anywhere in /dev/shm, and the environment through which each rank finds it
// and joins (bootstrap/join.cpp reads it). The launcher itself needs nothing below the job layer.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "segment/segment.hpp"

namespace shmdist::job {

// The job's shared segment as a launcher holds it: it hands it to its ranks and to the
// JobSupervisor, and never looks inside.
using JobSegment = segment::Segment;

// The most ranks a job may have (the segment's layout).
inline constexpr int kMaxRanks = segment::kMaxWorldSize;

// The ring size a job of `ranks` ranks gets unless told otherwise (segment::default_ring_size:
// 1 MiB, halved until all rings fit in 256 MiB, at least 64 KiB).
std::uint64_t default_ring_size(int ranks);

// The segment of a job of `ranks` ranks with rings of `ring_size` bytes: a memfd, inherited by
// the ranks (a signal at any point of start-up can leave nothing behind in /dev/shm).
JobSegment create_job_segment(int ranks, std::uint64_t ring_size);

// The variables rank `rank` of `seg`'s job is started with: RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE (one host), SHMDIST_SEGMENT_FD, SHMDIST_JOB_KEY and, for diagnostics only,
// SHMDIST_SEGMENT = `name`.
std::vector<std::pair<std::string, std::string>> rank_environment(const JobSegment& seg, int rank,
                                                                  const std::string& name);

}  // namespace shmdist::job
