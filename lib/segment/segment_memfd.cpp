// Segment::create_memfd: shmrun's segment, a memfd with no name anywhere. A signal or SIGKILL
// at any moment of start-up (even during the preallocation of a large segment) can leave
// nothing behind in /dev/shm; the ranks get the descriptor (SHMDIST_SEGMENT_FD) and the
// memory goes when the last mapping and descriptor do. (Not Boost.Interprocess: every object
// it makes has a name; named objects are segment/named_object.hpp's.)

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <shmdist/errors.hpp>

#include "base/config.hpp"
#include "segment/segment.hpp"

namespace shmdist::segment {
namespace {

std::string mib(std::uint64_t bytes) {
  return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB";
}

// MemAvailable plus free swap from /proc/meminfo, in bytes; 0 if unknown.
std::uint64_t memory_available() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0, total = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:" || key == "SwapFree:") total += kib * 1024;
  }
  return total;
}

}  // namespace

Segment Segment::create_memfd(int world_size, std::uint64_t ring_size) {
  if (world_size < 1 || world_size > kMaxWorldSize)
    throw SetupError("world size " + std::to_string(world_size) + " is out of range: expected 1.." +
                     std::to_string(kMaxWorldSize));
  config::check_ring_size(ring_size, "ring size");
  Segment seg;
  seg.geometry_ = Geometry::compute(static_cast<std::uint32_t>(world_size), ring_size);
  const std::uint64_t total = seg.geometry_.total_size;
  if (const std::uint64_t avail = memory_available(); avail != 0 && avail < total)
    throw SetupError("the shared segment needs " + mib(total) + " of memory but only " +
                     mib(avail) + " are available. Use a smaller --ring-size, or run fewer ranks.");
  // Close-on-exec: launchers decide what children inherit.
  seg.fd_ = memfd_create("shmdist-segment", MFD_CLOEXEC);
  if (seg.fd_ < 0)
    throw SetupError(std::string("cannot create the shared segment (memfd_create): ") +
                     std::strerror(errno));
  seg.size_map_and_init(world_size, ring_size);  // on failure ~Segment closes the memfd
  return seg;
}

}  // namespace shmdist::segment
