// The staging buffers of the point-to-point schedules (a stage that receives peers' slices
// before they are reduced), kept for the next call once their call is done.
#pragma once

#include <cstdint>

#include <shmdist/distributed.hpp>

namespace shmdist::coll {

// A staging buffer of `count` elements, uninitialized: every element is written (received,
// or reduced into) before it is read, and never shown to the caller. empty() zeroes
// (calloc), which on a 4 MiB all_reduce across hosts was 10% of the call's CPU time.
//
// Its memory comes from the few buffers earlier calls gave back (scratch.cpp), so that a
// call in a loop does not map and fault in fresh pages each time: glibc serves a buffer this
// large with mmap (or trims its heap) unless its dynamic thresholds moved up, and with them
// fixed (any M_MMAP_THRESHOLD or M_TRIM_THRESHOLD set, by mallopt or GLIBC_TUNABLES) a 1 MiB
// all_reduce across hosts read 1.6x slower, 144 page faults a call on each rank.
Tensor scratch(std::int64_t count, DType dtype);

// Frees every kept buffer (destroy_process_group: a process whose group ended holds none).
// Buffers in use are not touched; they are kept again when given back.
void release_scratch();

}  // namespace shmdist::coll
