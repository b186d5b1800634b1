// The staging buffers of the point-to-point schedules (a stage that receives peers' slices
// before they are reduced), kept for the next call once their call is done.
#pragma once

#include <cstdint>

#include <shmdist/distributed.hpp>

// Under AddressSanitizer no buffer is kept: each stage is malloc'd and freed, so that a
// write into a stage after its call (or past its end) is still caught.
#if defined(__SANITIZE_ADDRESS__)
#define SHMDIST_KEEP_SCRATCH 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHMDIST_KEEP_SCRATCH 0
#endif
#endif
#ifndef SHMDIST_KEEP_SCRATCH
#define SHMDIST_KEEP_SCRATCH 1
#endif

namespace shmdist::coll {

inline constexpr bool kScratchKept = SHMDIST_KEEP_SCRATCH != 0;

// A staging buffer of `count` elements, uninitialized: every element is written (received,
// or reduced into) before it is read, and never shown to the caller. empty() zeroes
// (calloc), which on a 4 MiB all_reduce across hosts was 10% of the call's CPU time.
//
// Its memory comes from the few buffers earlier calls gave back (scratch.cpp: at most 4, of
// 64 MiB together), so that a call in a loop does not map and fault in fresh pages each
// time: glibc serves a buffer this large with mmap (or trims its heap) unless its dynamic
// thresholds moved up, and with them fixed (any M_MMAP_THRESHOLD or M_TRIM_THRESHOLD set, by
// mallopt or GLIBC_TUNABLES) a 1 MiB all_reduce across hosts read 1.6x slower, 144 page
// faults a call on each rank.
Tensor scratch(std::int64_t count, DType dtype);

// Frees every kept buffer (destroy_process_group). Buffers still in use (another process
// group's of this process, a receive that outlived its call) are not touched, and are kept
// again when given back.
void release_scratch();

}  // namespace shmdist::coll
