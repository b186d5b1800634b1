#include "segment/segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <utility>

#include <shmdist/errors.hpp>

#include "base/config.hpp"

namespace shmdist::segment {
namespace {

std::string mib(std::uint64_t bytes) {
  return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB";
}

std::uint64_t random_u64() {
  std::uint64_t v = 0;
  if (getrandom(&v, sizeof v, 0) != sizeof v)
    throw SetupError(std::string("getrandom failed: ") + std::strerror(errno));
  return v;
}

void check_world_size(int world_size) {
  if (world_size < 1 || world_size > kMaxWorldSize)
    throw SetupError("world size " + std::to_string(world_size) + " is out of range: expected 1.." +
                     std::to_string(kMaxWorldSize));
}

// Fails early, with the numbers, when /dev/shm cannot hold the segment.
void check_room(std::uint64_t needed) {
  struct statvfs st {};
  if (statvfs("/dev/shm", &st) != 0) return;  // no /dev/shm to ask: let fallocate decide
  const std::uint64_t avail = std::uint64_t{st.f_bavail} * st.f_frsize;
  if (avail < needed)
    throw SetupError("the shared segment needs " + mib(needed) + " in /dev/shm but only " +
                     mib(avail) + " are free. Free space in /dev/shm, give the container more "
                     "(docker --shm-size), use a smaller --ring-size, or run fewer ranks.");
}

// Maps a segment with an inaccessible guard page right after it, so that a read or write
// past its end (its last ring is the last thing in it) faults at once instead of touching
// whatever mapping happens to follow. Unmap with unmap_guarded. (Not Boost.Interprocess's
// mapped_region, which cannot map in front of a reserved page: segment/named_object.hpp.)
void* map_guarded(std::size_t size, int flags, int fd) {
  void* reserve = mmap(nullptr, size + kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
  if (reserve == MAP_FAILED) return MAP_FAILED;
  void* base = mmap(reserve, size, PROT_READ | PROT_WRITE, flags | MAP_FIXED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    munmap(reserve, size + kPage);
    errno = err;
  }
  return base;
}

void unmap_guarded(void* base, std::size_t size) { munmap(base, size + kPage); }

}  // namespace

std::uint64_t default_ring_size(int world_size) {
  const std::uint64_t rings = world_size > 1 ? std::uint64_t(world_size) * (world_size - 1) : 1;
  std::uint64_t size = std::uint64_t{1} << 20;
  while (size > (std::uint64_t{64} << 10) && rings * size > (std::uint64_t{256} << 20)) size >>= 1;
  return size;
}

std::string format_job_key(std::uint64_t job_key) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(job_key));
  return text;
}

// The ring sizes a job accepts (base/config.hpp) are ones the layout can hold.
static_assert(config::kMinRingSize == kMinRingSize && config::kMaxRingSize == kMaxRingSize);

Segment::Segment(Segment&& o) noexcept { *this = std::move(o); }

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    this->~Segment();
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    geometry_ = o.geometry_;
    fd_ = std::exchange(o.fd_, -1);
    rank_names_ = std::move(o.rank_names_);
  }
  return *this;
}

Segment::~Segment() {
  if (base_) unmap_guarded(base_, size_);
  base_ = nullptr;
  close_fd();
}

void Segment::close_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

RankControl& Segment::rank_control(int rank) const {
  auto* p = static_cast<std::byte*>(base_) + geometry_.rank_control_offset;
  return reinterpret_cast<RankControl*>(static_cast<void*>(p))[rank];
}

RingControl& Segment::ring_control(int src, int dst) const {
  auto* p = static_cast<std::byte*>(base_) + geometry_.ring_control_offset;
  return reinterpret_cast<RingControl*>(static_cast<void*>(p))[geometry_.ring_index(src, dst)];
}

std::byte* Segment::coll_slot(int rank, int parity) const {
  return static_cast<std::byte*>(base_) + geometry_.coll_slot(rank, parity);
}

std::byte* Segment::ring_data(int src, int dst) const {
  return static_cast<std::byte*>(base_) + geometry_.ring_data_offset +
         geometry_.ring_index(src, dst) * geometry_.ring_size;
}

// Constructs the layout in freshly zeroed memory (placement new value-initialises atomics).
void Segment::map_and_init(int world_size, std::uint64_t ring_size) {
  auto* h = new (base_) SegmentHeader{};
  h->layout_version = kLayoutVersion;
  h->header_size = sizeof(SegmentHeader);
  h->world_size = static_cast<std::uint32_t>(world_size);
  h->line_size = kLine;
  h->ring_size = ring_size;
  h->total_size = geometry_.total_size;
  h->rank_control_offset = geometry_.rank_control_offset;
  h->ring_control_offset = geometry_.ring_control_offset;
  h->ring_data_offset = geometry_.ring_data_offset;
  h->coll_slot_offset = geometry_.coll_slot_offset;
  h->coll_slot_size = geometry_.coll_slot_size;
  h->job_key = random_u64();
  h->creator_pid = getpid();
  h->failed_rank.store(-1, std::memory_order_relaxed);
  for (int r = 0; r < world_size; ++r) {
    auto* rc = new (&rank_control(r)) RankControl{};
    rc->blocked.peer.store(-1, std::memory_order_relaxed);
  }
  for (int s = 0; s < world_size; ++s)
    for (int d = 0; d < world_size; ++d)
      if (s != d) new (&ring_control(s, d)) RingControl{};
  for (int r = 0; r < world_size; ++r)
    for (int parity = 0; parity < 2; ++parity) new (coll_slot(r, parity)) CollSlotHead{};
  // The magic number goes last, with release: a process that opens the segment by name
  // while we initialise it sees magic == 0 ("not ready yet") or a complete layout.
  std::atomic_ref<std::uint64_t>(h->magic).store(kMagic, std::memory_order_release);
}

Segment Segment::create_on_fd(int fd, int world_size, std::uint64_t ring_size) {
  check_world_size(world_size);
  config::check_ring_size(ring_size, "ring size");
  Segment seg;
  seg.geometry_ = Geometry::compute(static_cast<std::uint32_t>(world_size), ring_size);
  check_room(seg.geometry_.total_size);
  seg.fd_ = fd;
  try {
    seg.size_map_and_init(world_size, ring_size);
  } catch (...) {
    seg.fd_ = -1;  // the caller's again (it may still hold a lock on it, or unlink its name)
    throw;
  }
  return seg;
}

// Sizes the object behind fd_ to the geometry, preallocates it (no SIGBUS later), maps it and
// initialises the layout.
void Segment::size_map_and_init(int world_size, std::uint64_t ring_size) {
  const auto total = static_cast<off_t>(geometry_.total_size);
  if (ftruncate(fd_, total) != 0)
    throw SetupError("cannot size the shared segment to " + mib(geometry_.total_size) + ": " +
                     std::strerror(errno));
  if (int err = posix_fallocate(fd_, 0, total); err != 0)
    throw SetupError("cannot reserve " + mib(geometry_.total_size) +
                     " for the shared segment in /dev/shm: " + std::strerror(err) +
                     ". Free space in /dev/shm, use a smaller --ring-size, or run fewer ranks.");
  size_ = geometry_.total_size;
  base_ = map_guarded(size_, MAP_SHARED, fd_);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw SetupError(std::string("cannot map the shared segment: ") + std::strerror(errno));
  }
  map_and_init(world_size, ring_size);
}

Segment Segment::create_anonymous(int world_size, std::uint64_t ring_size) {
  check_world_size(world_size);
  config::check_ring_size(ring_size, "ring size");
  Segment seg;
  seg.geometry_ = Geometry::compute(static_cast<std::uint32_t>(world_size), ring_size);
  seg.size_ = seg.geometry_.total_size;
  seg.base_ = map_guarded(seg.size_, MAP_SHARED | MAP_ANONYMOUS, -1);
  if (seg.base_ == MAP_FAILED) {
    seg.base_ = nullptr;
    throw SetupError("cannot map an anonymous segment of " + mib(seg.size_) + ": " +
                     std::strerror(errno));
  }
#ifdef MADV_POPULATE_WRITE
  // Commit the memory now so that a shortage is an error here, not a SIGBUS later.
  if (madvise(seg.base_, seg.size_, MADV_POPULATE_WRITE) != 0 && errno != EINVAL)
    throw SetupError("cannot commit " + mib(seg.size_) + " for the shared segment: " +
                     std::strerror(errno));
#endif
  seg.map_and_init(world_size, ring_size);
  // Thread mode shares this one mapping: touch every page now, before any rank starts (see
  // prefault() in transport/shm_transport.cpp for why first touches are moved out of the
  // traffic).
  auto* p = static_cast<volatile unsigned char*>(seg.base_);
  for (std::size_t off = 0; off < seg.size_; off += kPage) p[off] = p[off];
  return seg;
}

// Every field is read exactly once into a local: the header is untrusted shared memory that
// another process could rewrite while we look, and the geometry we return (and then use) is
// the one we checked, not whatever the header says a moment later.
Geometry Segment::validate(const void* base, std::size_t mapped_size, int expected_world_size) {
  auto fail = [](const std::string& what) {
    throw SetupError("the shared segment is not valid: " + what +
                     ". It belongs to another version of shmdist or to another job, or it is "
                     "corrupt; start the job again with this version's shmrun.");
  };
  if (mapped_size < sizeof(SegmentHeader))
    fail("it is " + std::to_string(mapped_size) + " bytes, smaller than its header");
  auto& h = *static_cast<SegmentHeader*>(const_cast<void*>(base));
  auto read = [](auto& field) {
    return std::atomic_ref<std::remove_reference_t<decltype(field)>>(field).load(
        std::memory_order_acquire);
  };
  const std::uint64_t magic = read(h.magic);
  const std::uint32_t version = read(h.layout_version), header_size = read(h.header_size),
                      line_size = read(h.line_size), world = read(h.world_size);
  const std::uint64_t ring = read(h.ring_size), total = read(h.total_size),
                      rank_ctl = read(h.rank_control_offset),
                      ring_ctl = read(h.ring_control_offset), data = read(h.ring_data_offset),
                      slots = read(h.coll_slot_offset), slot_size = read(h.coll_slot_size);
  if (magic != kMagic) fail("wrong magic number");
  if (version != kLayoutVersion)
    fail("layout version " + std::to_string(version) + ", expected " +
         std::to_string(kLayoutVersion));
  if (header_size != sizeof(SegmentHeader) || line_size != kLine)
    fail("header size " + std::to_string(header_size) + "/line " + std::to_string(line_size) +
         ", expected " + std::to_string(sizeof(SegmentHeader)) + "/" + std::to_string(kLine));
  if (world < 1 || world > std::uint32_t(kMaxWorldSize))
    fail("world size " + std::to_string(world) + " out of range");
  if (expected_world_size > 0 && world != std::uint32_t(expected_world_size))
    fail("it was made for " + std::to_string(world) + " ranks but WORLD_SIZE is " +
         std::to_string(expected_world_size));
  const bool pow2 = ring != 0 && (ring & (ring - 1)) == 0;
  if (!pow2 || ring < kMinRingSize || ring > kMaxRingSize)
    fail("ring size " + std::to_string(ring) + " is not a power of two in range");
  const Geometry g = Geometry::compute(world, ring);
  if (rank_ctl != g.rank_control_offset || ring_ctl != g.ring_control_offset ||
      data != g.ring_data_offset || slots != g.coll_slot_offset ||
      slot_size != g.coll_slot_size || total != g.total_size)
    fail("its offsets or total size disagree with its world and ring size");
  if (total != mapped_size)
    fail("the header says " + std::to_string(total) + " bytes but the object has " +
         std::to_string(mapped_size));
  return g;
}

namespace {
Geometry map_validated(int fd, int expected_world_size, void*& base, std::size_t& size) {
  struct stat st {};
  if (fstat(fd, &st) != 0)
    throw SetupError(std::string("cannot stat the shared segment: ") + std::strerror(errno));
  size = static_cast<std::size_t>(st.st_size);
  if (size < sizeof(SegmentHeader))
    throw SetupError("the shared segment is only " + std::to_string(size) +
                     " bytes; it was not created by shmrun or is truncated");
  base = map_guarded(size, MAP_SHARED, fd);
  if (base == MAP_FAILED) {
    base = nullptr;
    throw SetupError(std::string("cannot map the shared segment: ") + std::strerror(errno));
  }
  try {
    return Segment::validate(base, size, expected_world_size);
  } catch (...) {
    unmap_guarded(base, size);
    base = nullptr;
    throw;
  }
}
}  // namespace

// The descriptor stays the caller's (an inherited one is closed by the caller once mapped).
Segment Segment::attach_fd(int fd, int expected_world_size) {
  Segment seg;
  seg.geometry_ = map_validated(fd, expected_world_size, seg.base_, seg.size_);
  return seg;
}

}  // namespace shmdist::segment
