// The doorbells of a job's ranks in its segment (segment/layout.hpp, RankControl line 0), as
// the wait layer sees them: one rank's words, and the notifier over every rank's.
#pragma once

#include "segment/segment.hpp"
#include "wait/doorbell.hpp"
#include "wait/notifier.hpp"

namespace shmdist::segment {

inline wait::DoorbellWords doorbell_of(RankControl& rc) {
  return {&rc.doorbell_seq, &rc.armed, &rc.heavy_fences};
}

// The control blocks are one array by rank (Segment::rank_control), hence the stride.
// `asymmetric`: this process registered for membarrier (wait::register_asymmetric_fences).
inline wait::Notifier notifier_of(Segment& segment, bool asymmetric) {
  return wait::Notifier(doorbell_of(segment.rank_control(0)), sizeof(RankControl), asymmetric);
}

}  // namespace shmdist::segment
