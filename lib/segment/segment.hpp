// A mapping of one job's shared segment in this process: creation (in a memfd, in a named
// object of segment/named_object.hpp, or anonymous for fork/thread launches), attach and
// validation. Holds no pointers into shared memory other than its own mapping base.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "segment/layout.hpp"

namespace shmdist::segment {

// The default ring size for a world: the largest power of two up to 1 MiB that keeps all
// world*(world-1) rings within 256 MiB, but at least 64 KiB (64 ranks: 64 KiB rings, 252 MiB).
std::uint64_t default_ring_size(int world_size);

// A job key as launchers pass it to ranks (SHMDIST_JOB_KEY): 16 lower-case hex digits.
std::string format_job_key(std::uint64_t job_key);

// The ring sizes a job accepts, and parsing them from text: base/config.hpp
// (config::check_ring_size), base/byte_size.hpp.

class Segment {
 public:
  Segment() = default;
  Segment(Segment&&) noexcept;
  Segment& operator=(Segment&&) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  // Sizes, preallocates, maps and initialises the (empty) shared-memory file behind `fd`. On
  // success the Segment owns `fd` (fd()); on failure (SetupError) it stays the caller's. For
  // objects created by the caller: the rendezvous (which locks it while it is incomplete) or
  // a memfd. (Named objects: segment/named_object.hpp, the one path, which locks an object
  // while it is incomplete.)
  static Segment create_on_fd(int fd, int world_size, std::uint64_t ring_size);
  // Creates a memfd (no name anywhere, close-on-exec), preallocates and initialises it: what
  // shmrun hands its ranks as SHMDIST_SEGMENT_FD. Nothing can be left behind in /dev/shm.
  static Segment create_memfd(int world_size, std::uint64_t ring_size);
  // Creates an anonymous shared mapping (inherited across fork, shared by threads). No name.
  static Segment create_anonymous(int world_size, std::uint64_t ring_size);
  // Maps the descriptor of a segment (inherited, or of a named object) and validates it
  // (SetupError on any mismatch). The descriptor stays the caller's.
  static Segment attach_fd(int fd, int expected_world_size);

  // Checks a mapped header against the size of its mapping and an expected world size.
  // Untrusted input: used by attach and by the fuzz target.
  // Returns the geometry it checked (read once: the header may change under us).
  static Geometry validate(const void* base, std::size_t mapped_size, int expected_world_size);

  SegmentHeader& header() const { return *static_cast<SegmentHeader*>(base_); }
  RankControl& rank_control(int rank) const;
  RingControl& ring_control(int src, int dst) const;
  std::byte* ring_data(int src, int dst) const;
  std::byte* coll_slot(int rank, int parity) const;  // its kCollSlotHeader, then the data
  const Geometry& geometry() const { return geometry_; }
  int world_size() const { return static_cast<int>(geometry_.world_size); }
  std::uint64_t ring_size() const { return geometry_.ring_size; }

  int fd() const { return fd_; }
  // Closes the descriptor (the mapping stays valid).
  void close_fd();
  bool valid() const { return base_ != nullptr; }

  // The rank each slot stands for in texts: a segment holding one host's ranks of a job
  // across hosts numbers them by their index on the host, but every error names the global
  // rank (`global_of`, by slot). Set before any rank of this process uses the segment; local
  // to this process (not in the shared layout).
  void name_ranks(std::vector<int> global_of) { rank_names_ = std::move(global_of); }
  int rank_name(int slot) const {
    return slot >= 0 && static_cast<std::size_t>(slot) < rank_names_.size() ? rank_names_[slot]
                                                                            : slot;
  }

 private:
  void map_and_init(int world_size, std::uint64_t ring_size);
  void size_map_and_init(int world_size, std::uint64_t ring_size);
  void* base_ = nullptr;
  std::size_t size_ = 0;
  Geometry geometry_;
  int fd_ = -1;
  std::vector<int> rank_names_;  // empty: slot = rank
};

}  // namespace shmdist::segment
