// libFuzzer target over everything shmdist reads that another process wrote: the records in
// a ring (frames), and a segment's header. The first input byte picks the target, the rest
// is its input:
//
//   0: the bytes of the ring from rank 1 to rank 0, which rank 0's transport then drains (the
//      real consumer path: RingConsumer, check_record, decode_header, payload copies). Record
//      stamps are fixed up before each record the bytes declare, so that the consumer looks
//      at every record rather than stopping at the first wrong stamp. That ring is the last
//      ring of the segment, and what follows it is made inaccessible (the collective area,
//      then the guard page every segment mapping has), so a read past the ring faults (ASan
//      alone cannot see reads inside one mapping).
//   1: a segment image for Segment::validate (bit 0 of byte 1: pad the mapping to the size
//      the header claims, up to 1 MiB; bits 1-2: the expected world size, 0 = any).
//   2: one MessageHeader and a record length/kind, for decode_header and check_record.
//   3: a script for a corrupting peer around the same last ring: its control fields before
//      the ranks join (16 bytes: head, tail), then operations (first byte of each % 5):
//      rank 1 sends a message (2 bytes: size), rank 0 drains, the "consumer" publishes any
//      tail (8 bytes) or one near the real one (1 byte: signed multiple of 8), or the peer
//      scribbles 8 bytes into the ring (2 + 8 bytes: offset, bytes). Covers the producer
//      path (writable's tail reload, publish with wrap) and the consumer over rewritten data.
//      Rank 1 offers messages of 4 KiB and more for a single copy (transport/single_copy.hpp)
//      when they do not fit the ring, so scribbles also hit offer records: descriptors with
//      any length, id, pid and address, read with process_vm_readv of this process.
//
// Acceptable outcomes are returning normally or a shmdist::Error (PeerFailure, SetupError, or
// the handler's refusal of a huge message). Anything else is a finding: a sanitizer report,
// another exception, or a broken invariant (checked with __builtin_trap).
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <shmdist/errors.hpp>

#include "transport/frame.hpp"
#include "ring/ring.hpp"
#include "segment/segment.hpp"
#include "base/config.hpp"
#include "transport/shm_transport.hpp"

namespace {

using namespace shmdist;

constexpr std::uint64_t kRingSize = 4096;
constexpr std::uint64_t kMaxAccepted = std::uint64_t{1} << 20;  // the handler's allocation cap
constexpr std::size_t kGuard = 64;

void require(bool invariant) {
  if (!invariant) __builtin_trap();
}

// Gives each message a buffer of exactly its size plus a guard zone that must stay intact.
struct GuardedHandler : transport::InboundHandler {
  explicit GuardedHandler(int sender) : src(sender) {}
  int src;
  std::vector<std::unique_ptr<std::vector<unsigned char>>> buffers;
  std::vector<std::unique_ptr<transport::InboundSink>> sinks;
  std::vector<std::uint64_t> sizes;
  transport::InboundSink* on_message_start(const transport::Envelope& env) override {
    require(env.nbytes <= transport::kMaxMessageBytes && env.src == src);
    if (env.nbytes > kMaxAccepted) throw Error("message too large for the fuzz handler");
    buffers.push_back(std::make_unique<std::vector<unsigned char>>(env.nbytes + kGuard, 0xA5));
    sinks.push_back(std::make_unique<transport::InboundSink>());
    sinks.back()->dest = reinterpret_cast<std::byte*>(buffers.back()->data());
    sizes.push_back(env.nbytes);
    return sinks.back().get();
  }
  void on_message_complete(transport::InboundSink* sink, const transport::Envelope& env) override {
    require(sink != nullptr && sink->received == env.nbytes);
  }
  void check_guards() const {
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      require(sinks[i]->received <= sizes[i]);
      for (std::size_t b = sizes[i]; b < buffers[i]->size(); ++b) require((*buffers[i])[b] == 0xA5);
    }
  }
};

// A 2-rank segment whose 1->0 ring (the last ring) is followed by inaccessible memory: the
// segment's guard page if the ring ends the mapping, else the areas after it (the collective
// area, which the transport never touches) are made inaccessible here.
std::shared_ptr<segment::Segment> two_rank_segment() {
  auto seg = std::make_shared<segment::Segment>(segment::Segment::create_anonymous(2, kRingSize));
  std::byte* ring_end = seg->ring_data(1, 0) + kRingSize;
  std::byte* mapping_end =
      reinterpret_cast<std::byte*>(&seg->header()) + seg->geometry().total_size;
  require(ring_end <= mapping_end &&
          reinterpret_cast<std::uintptr_t>(ring_end) % segment::kPage == 0);
  if (ring_end < mapping_end)
    require(mprotect(ring_end, static_cast<std::size_t>(mapping_end - ring_end), PROT_NONE) == 0);
  return seg;
}

void drain(transport::ShmTransport& receiver, GuardedHandler& handler) {
  for (int i = 0; i < 64; ++i) {
    const bool moved = receiver.poll(handler, i % 2 ? 1 : -1, i % 3 == 0);
    receiver.flush();
    if (!moved) break;
  }
}

void fuzz_ring(const std::uint8_t* data, std::size_t size) {
  auto seg = two_rank_segment();
  std::byte* ring_data = seg->ring_data(1, 0);
  std::memcpy(ring_data, data, std::min<std::size_t>(size, kRingSize));
  // Stamp each record the bytes declare, as a producer would have (first lap only).
  for (std::uint64_t pos = 0; pos + sizeof(ring::RecordHeader) <= kRingSize;) {
    std::uint32_t length = 0;
    std::memcpy(&length, ring_data + pos + 8, sizeof length);
    ring::stamp_at(ring_data, kRingSize - 1, pos).store(pos + 1, std::memory_order_release);
    if (length > kRingSize) break;
    pos += ring::padded_record_size(length);
  }
  transport::ShmTransport receiver(seg, 0, /*supervised=*/true, config::kDefaultHealthCheck);
  GuardedHandler handler(1);
  try {
    drain(receiver, handler);
  } catch (const Error&) {
  }
  handler.check_guards();
  require(seg->ring_control(1, 0).tail.load() <= 2 * kRingSize);
}

// Reads little-endian integers off the script; zero once it runs out.
struct Script {
  const std::uint8_t* p;
  std::size_t left;
  template <class T>
  T take() {
    T v{};
    const std::size_t n = std::min(sizeof v, left);
    std::memcpy(&v, p, n);
    p += n;
    left -= n;
    return v;
  }
};

void fuzz_peer(const std::uint8_t* data, std::size_t size) {
  Script in{data, size};
  auto seg = two_rank_segment();
  auto& control = seg->ring_control(1, 0);
  control.head_hint.store(in.take<std::uint64_t>());
  control.tail.store(in.take<std::uint64_t>());
  std::unique_ptr<transport::ShmTransport> producer, consumer;
  try {
    producer = std::make_unique<transport::ShmTransport>(seg, 1, /*supervised=*/true,
                                                         config::kDefaultHealthCheck,
                                                         /*single_copy_threshold=*/4096);
    consumer = std::make_unique<transport::ShmTransport>(seg, 0, /*supervised=*/true,
                                                         config::kDefaultHealthCheck);
  } catch (const SetupError&) {
    require(control.head_hint.load() != 0 || control.tail.load() != 0);
    return;
  }
  GuardedHandler handler(1);
  std::vector<std::byte> payload(3 * kRingSize, std::byte{0x3c});
  std::byte* ring_data = seg->ring_data(1, 0);
  try {
    for (int ops = 0; in.left > 0 && ops < 256; ++ops) {
      switch (in.take<std::uint8_t>() % 5) {
        case 0: {  // rank 1 sends up to 3 rings' worth, draining rank 0 when the ring is full
          transport::OutboundMessage msg;
          msg.env.nbytes = msg.env.numel = in.take<std::uint16_t>() % payload.size();
          msg.next = payload.data();
          for (int round = 0; round < 16 && !msg.done(); ++round) {
            producer->send_some(0, msg);
            drain(*consumer, handler);
          }
          break;
        }
        case 1: drain(*consumer, handler); break;
        case 2: control.tail.store(in.take<std::uint64_t>()); break;
        case 3:
          control.tail.store(control.tail.load() +
                             static_cast<std::uint64_t>(std::int64_t{in.take<std::int8_t>()} * 8));
          break;
        case 4: {
          const std::uint16_t offset = in.take<std::uint16_t>() % (kRingSize - 7);
          const std::uint64_t bytes = in.take<std::uint64_t>();
          std::memcpy(ring_data + offset, &bytes, sizeof bytes);
          break;
        }
      }
    }
  } catch (const Error&) {
  }
  handler.check_guards();
}

void fuzz_segment(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return;
  const bool pad_to_claim = data[0] & 1;
  const int expected_world = (data[0] >> 1) & 3;
  ++data;
  --size;
  std::size_t mapped = size;
  if (pad_to_claim && size >= sizeof(segment::SegmentHeader)) {
    std::uint64_t claimed = 0;
    std::memcpy(&claimed, data + offsetof(segment::SegmentHeader, total_size), sizeof claimed);
    if (claimed >= size && claimed <= kMaxAccepted) mapped = static_cast<std::size_t>(claimed);
  }
  // Page aligned and zero padded, like the mapping validate() is meant for.
  const std::size_t alloc = (std::max<std::size_t>(mapped, 1) + 4095) / 4096 * 4096;
  std::unique_ptr<void, decltype(&std::free)> image(std::aligned_alloc(4096, alloc), &std::free);
  std::memset(image.get(), 0, alloc);
  std::memcpy(image.get(), data, size);
  try {
    segment::Segment::validate(image.get(), mapped, expected_world);
  } catch (const SetupError&) {
    return;
  }
  // Accepted: then everything the header locates lies inside the mapping.
  const auto& h = *static_cast<const segment::SegmentHeader*>(image.get());
  require(h.world_size >= 1 && h.world_size <= segment::kMaxWorldSize);
  require(expected_world == 0 || h.world_size == static_cast<std::uint32_t>(expected_world));
  const auto g = segment::Geometry::compute(h.world_size, h.ring_size);
  require(g.total_size == mapped);
  require(g.rank_control_offset + h.world_size * sizeof(segment::RankControl) <= mapped);
  require(g.ring_data_offset <= mapped);
  const std::uint64_t rings = std::uint64_t{h.world_size} * (h.world_size - 1);
  require(g.ring_control_offset + rings * sizeof(segment::RingControl) <= g.ring_data_offset);
  require(g.ring_data_offset + rings * h.ring_size == mapped);
}

void fuzz_header(const std::uint8_t* data, std::size_t size) {
  transport::MessageHeader raw{};
  std::uint64_t record_length = 0, remaining = 0;
  std::uint16_t kind = 0;
  std::uint8_t in_message = 0;
  const std::size_t need = sizeof raw + sizeof record_length + sizeof remaining + sizeof kind + 1;
  if (size < need) return;
  std::memcpy(&raw, data, sizeof raw);
  data += sizeof raw;
  std::memcpy(&record_length, data, sizeof record_length);
  data += sizeof record_length;
  std::memcpy(&remaining, data, sizeof remaining);
  data += sizeof remaining;
  std::memcpy(&kind, data, sizeof kind);
  data += sizeof kind;
  in_message = *data & 1;
  try {
    const transport::Envelope env = transport::decode_header(raw, record_length, 3);
    require(static_cast<int>(env.dtype) >= 0 && static_cast<int>(env.dtype) < kNumDTypes);
    require(env.key.tag >= 0 && env.key.channel <= transport::kInternalChannel);
    require(env.nbytes <= transport::kMaxMessageBytes);
    require(env.numel * element_size(env.dtype) == env.nbytes);
    require(record_length >= sizeof raw && record_length - sizeof raw <= env.nbytes);
  } catch (const PeerFailure&) {
  }
  const std::uint64_t max_length = kRingSize - ring::kRecordAlign - sizeof(ring::RecordHeader);
  try {
    transport::check_record(kind, record_length, max_length, in_message, remaining, 3);
    require(record_length <= max_length);
    require(kind == 1 || kind == 2);
    require(kind == 1 ? !in_message
                      : in_message && record_length > 0 && record_length <= remaining);
  } catch (const PeerFailure&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  switch (data[0] % 4) {
    case 0: fuzz_ring(data + 1, size - 1); break;
    case 1: fuzz_segment(data + 1, size - 1); break;
    case 2: fuzz_header(data + 1, size - 1); break;
    case 3: fuzz_peer(data + 1, size - 1); break;
  }
  return 0;
}
