// A segment that is not what it claims: wrong magic, version, sizes, offsets or world size
// must be a SetupError naming the problem, never a crash or a read past the mapping; both
// for Segment::validate on crafted buffers and for attach_fd on a crafted memfd.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include <shmdist/errors.hpp>

#include "segment/segment.hpp"

using namespace shmdist;
using segment::Segment;
using segment::SegmentHeader;

namespace {

constexpr int kWorld = 2;
constexpr std::uint64_t kRing = 4096;

// Page-aligned memory, like a mapping (validate() reads the header in place).
struct PageBuffer {
  explicit PageBuffer(std::size_t n)
      : size(n), bytes(static_cast<std::byte*>(std::aligned_alloc(4096, rounded(n)))) {
    std::memset(bytes, 0, rounded(n));
  }
  static std::size_t rounded(std::size_t n) { return (n + 4095) / 4096 * 4096; }
  PageBuffer(const PageBuffer& o) : PageBuffer(o.size) { std::memcpy(bytes, o.bytes, size); }
  PageBuffer& operator=(const PageBuffer&) = delete;
  ~PageBuffer() { std::free(bytes); }
  std::size_t size;
  std::byte* bytes;
};

// A faithful copy of a freshly created segment.
struct SegmentImage {
  PageBuffer buffer{segment::Geometry::compute(kWorld, kRing).total_size};
  SegmentImage() {
    const Segment seg = Segment::create_anonymous(kWorld, kRing);
    std::memcpy(buffer.bytes, &seg.header(), buffer.size);
  }
  std::size_t size() const { return buffer.size; }
  SegmentHeader& header() { return *reinterpret_cast<SegmentHeader*>(buffer.bytes); }
  const void* data() const { return buffer.bytes; }
  unsigned char* raw() { return reinterpret_cast<unsigned char*>(buffer.bytes); }
};

bool setup_error_says(const std::function<void()>& f, const std::string& words) {
  try {
    f();
  } catch (const SetupError& e) {
    BOOST_TEST_INFO("message: " << e.what());
    BOOST_TEST(std::string(e.what()).find(words) != std::string::npos);
    return true;
  }
  BOOST_ERROR("no SetupError (expected one saying '" << words << "')");
  return false;
}

int memfd_with(const void* bytes, std::size_t size) {
  const int fd = memfd_create("shmdist-crafted", MFD_CLOEXEC);
  BOOST_REQUIRE(fd >= 0);
  BOOST_REQUIRE(ftruncate(fd, static_cast<off_t>(size)) == 0);
  if (size) BOOST_REQUIRE(pwrite(fd, bytes, size, 0) == static_cast<ssize_t>(size));
  return fd;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(hostile_segment)

BOOST_AUTO_TEST_CASE(a_faithful_copy_validates) {
  SegmentImage img;
  Segment::validate(img.data(), img.size(), kWorld);
  Segment::validate(img.data(), img.size(), 0);  // no expectation about the world size
}

BOOST_AUTO_TEST_CASE(each_broken_field_is_named) {
  struct Case {
    std::string what;
    std::function<void(SegmentHeader&)> mutate;
    std::string words;
    int expected_world = kWorld;
  };
  const std::vector<Case> cases = {
      {"magic", [](SegmentHeader& h) { h.magic ^= 1; }, "wrong magic number"},
      {"zero magic", [](SegmentHeader& h) { h.magic = 0; }, "wrong magic number"},
      {"version", [](SegmentHeader& h) { h.layout_version += 1; },
       "layout version " + std::to_string(shmdist::segment::kLayoutVersion + 1) + ", expected " +
           std::to_string(shmdist::segment::kLayoutVersion)},
      {"header size", [](SegmentHeader& h) { h.header_size = 64; }, "header size 64"},
      {"line size", [](SegmentHeader& h) { h.line_size = 64; }, "/line 64"},
      {"world 0", [](SegmentHeader& h) { h.world_size = 0; }, "world size 0 out of range"},
      {"world huge", [](SegmentHeader& h) { h.world_size = 0xffffffffu; }, "out of range"},
      {"world mismatch", [](SegmentHeader&) {}, "made for 2 ranks but WORLD_SIZE is 3", 3},
      {"world bigger", [](SegmentHeader& h) { h.world_size = 3; },
       "made for 3 ranks but WORLD_SIZE is 2"},
      {"world bigger, unchecked", [](SegmentHeader& h) { h.world_size = 3; },
       "offsets or total size disagree", 0},
      {"ring not a power of two", [](SegmentHeader& h) { h.ring_size = 5000; },
       "ring size 5000 is not a power of two"},
      {"ring zero", [](SegmentHeader& h) { h.ring_size = 0; }, "ring size 0"},
      {"ring too small", [](SegmentHeader& h) { h.ring_size = 64; }, "ring size 64"},
      {"ring too large", [](SegmentHeader& h) { h.ring_size = std::uint64_t{1} << 40; },
       "is not a power of two in range"},
      {"ring larger than mapped", [](SegmentHeader& h) { h.ring_size = 8192; },
       "offsets or total size disagree"},
      {"rank control offset", [](SegmentHeader& h) { h.rank_control_offset += 128; },
       "offsets or total size disagree"},
      {"ring control offset", [](SegmentHeader& h) { h.ring_control_offset = 1ull << 60; },
       "offsets or total size disagree"},
      {"ring data offset", [](SegmentHeader& h) { h.ring_data_offset -= 4096; },
       "offsets or total size disagree"},
      {"total size", [](SegmentHeader& h) { h.total_size *= 2; },
       "offsets or total size disagree"},
      {"collective area offset", [](SegmentHeader& h) { h.coll_slot_offset += 4096; },
       "offsets or total size disagree"},
      {"collective slot size", [](SegmentHeader& h) { h.coll_slot_size = 1ull << 40; },
       "offsets or total size disagree"},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      SegmentImage img;
      c.mutate(img.header());
      setup_error_says([&] { Segment::validate(img.data(), img.size(), c.expected_world); },
                       c.words);
    }
  }
}

BOOST_AUTO_TEST_CASE(mapping_smaller_or_larger_than_the_header_says) {
  SegmentImage img;
  setup_error_says([&] { Segment::validate(img.data(), 0, kWorld); }, "smaller than its header");
  setup_error_says([&] { Segment::validate(img.data(), sizeof(SegmentHeader) - 1, kWorld); },
                   "smaller than its header");
  setup_error_says([&] { Segment::validate(img.data(), img.size() - 4096, kWorld); },
                   "bytes but the object has");
  PageBuffer bigger(img.size() + 4096);
  std::memcpy(bigger.bytes, img.data(), img.size());
  setup_error_says([&] { Segment::validate(bigger.bytes, bigger.size, kWorld); },
                   "bytes but the object has");
}

// Every single-byte change of the header either still validates (reserved bytes, runtime
// fields, the job key) or is a SetupError: nothing else escapes.
BOOST_AUTO_TEST_CASE(every_single_byte_change_is_accepted_or_refused_cleanly) {
  int refused = 0, accepted = 0;
  for (std::size_t offset = 0; offset < sizeof(SegmentHeader); ++offset) {
    for (unsigned value : {0x00u, 0x01u, 0x7fu, 0x80u, 0xffu}) {
      SegmentImage img;
      unsigned char* bytes = img.raw();
      if (bytes[offset] == value) continue;
      bytes[offset] = static_cast<unsigned char>(value);
      try {
        Segment::validate(img.data(), img.size(), kWorld);
        ++accepted;
      } catch (const SetupError&) {
        ++refused;
      }
    }
  }
  BOOST_TEST(refused > 0);
  BOOST_TEST(accepted > 0);
}

BOOST_AUTO_TEST_CASE(attach_fd_on_crafted_memfds) {
  SegmentImage img;
  {  // a faithful copy attaches
    const int fd = memfd_with(img.data(), img.size());
    const Segment seg = Segment::attach_fd(fd, kWorld);
    BOOST_TEST(seg.world_size() == kWorld);
    BOOST_TEST(seg.ring_size() == kRing);
    close(fd);
  }
  {  // empty
    const int fd = memfd_with(nullptr, 0);
    setup_error_says([&] { Segment::attach_fd(fd, kWorld); }, "only 0 bytes");
    close(fd);
  }
  {  // shorter than a header
    const int fd = memfd_with(img.data(), 100);
    setup_error_says([&] { Segment::attach_fd(fd, kWorld); }, "only 100 bytes");
    close(fd);
  }
  {  // zeros of the right size
    const PageBuffer zeros(img.size());
    const int fd = memfd_with(zeros.bytes, img.size());
    setup_error_says([&] { Segment::attach_fd(fd, kWorld); }, "wrong magic number");
    close(fd);
  }
  {  // truncated after its header was written
    const int fd = memfd_with(img.data(), img.size());
    BOOST_REQUIRE(ftruncate(fd, static_cast<off_t>(img.size() - 4096)) == 0);
    setup_error_says([&] { Segment::attach_fd(fd, kWorld); }, "bytes but the object has");
    close(fd);
  }
  {  // made for another world size
    const int fd = memfd_with(img.data(), img.size());
    setup_error_says([&] { Segment::attach_fd(fd, 3); }, "made for 2 ranks but WORLD_SIZE is 3");
    close(fd);
  }
  {  // another layout version
    SegmentImage old;
    old.header().layout_version = 0;
    const int fd = memfd_with(old.data(), old.size());
    setup_error_says([&] { Segment::attach_fd(fd, kWorld); }, "layout version 0, expected " + std::to_string(shmdist::segment::kLayoutVersion));
    close(fd);
  }
  // Descriptors that are no segment at all.
  setup_error_says([&] { Segment::attach_fd(-1, kWorld); }, "cannot stat the shared segment");
  setup_error_says([&] { Segment::attach_fd(999, kWorld); }, "cannot stat the shared segment");
  int pipe_fds[2];
  BOOST_REQUIRE(pipe(pipe_fds) == 0);
  setup_error_says([&] { Segment::attach_fd(pipe_fds[0], kWorld); }, "only 0 bytes");
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

BOOST_AUTO_TEST_SUITE_END()

// The collective area sits between the ring controls and the ring data (the last ring ends
// the segment): from the first page after the ring controls, two slots per rank of
// default_coll_slot_size(world) data bytes behind a one-line header, page aligned; the
// segment's size is exactly that (the formula in docs/collectives.md).
BOOST_AUTO_TEST_CASE(collective_area_geometry) {
  using shmdist::segment::Geometry;
  namespace seg = shmdist::segment;
  for (std::uint32_t world : {1u, 2u, 8u, 9u, 64u, 65u}) {
    const std::uint64_t ring = 65536;
    const Geometry g = Geometry::compute(world, ring);
    const std::uint64_t rings = std::uint64_t{world} * (world - 1);
    BOOST_TEST(g.coll_slot_offset ==
               seg::align_up(g.ring_control_offset + rings * sizeof(seg::RingControl), seg::kPage));
    BOOST_TEST(g.coll_slot_size == seg::default_coll_slot_size(world));
    BOOST_TEST(g.coll_slot_stride == seg::align_up(seg::kCollSlotHeader + g.coll_slot_size, seg::kPage));
    BOOST_TEST(g.ring_data_offset == g.coll_slot_offset + world * 2 * g.coll_slot_stride);
    BOOST_TEST(g.coll_slot(world - 1, 1) + g.coll_slot_stride == g.ring_data_offset);
    BOOST_TEST(g.total_size == g.ring_data_offset + rings * ring);
    const std::uint64_t control = 2 * seg::kLine + world * 4 * seg::kLine +
                                  rings * 2 * seg::kLine;
    BOOST_TEST(g.total_size == seg::align_up(control, seg::kPage) +
                                   world * 2 * seg::align_up(seg::kLine + g.coll_slot_size, seg::kPage) +
                                   rings * ring);
  }
  BOOST_TEST(seg::default_coll_slot_size(8) == 256u * 1024);
  BOOST_TEST(seg::default_coll_slot_size(16) == 128u * 1024);
  BOOST_TEST(seg::default_coll_slot_size(64) == 64u * 1024);
  BOOST_TEST(seg::default_coll_slot_size(1024) == 32u * 1024);
}
