// libFuzzer target over everything shmdist reads that another process wrote: the records in
// a ring (frames), and a segment's header. The first input byte picks the target, the rest
// is its input:
//
//   0: the bytes of a ring from rank 0 to rank 1, which rank 1's transport then drains (the
//      real consumer path: RingConsumer, check_record, decode_header, payload copies). Record
//      stamps are fixed up before each record the bytes declare, so that the consumer looks
//      at every record rather than stopping at the first wrong stamp.
//   1: a segment image for Segment::validate (bit 0 of byte 1: pad the mapping to the size
//      the header claims, up to 1 MiB; bits 1-2: the expected world size, 0 = any).
//   2: one MessageHeader and a record length/kind, for decode_header and check_record.
//
// Acceptable outcomes are returning normally or a shmdist::Error (PeerFailure, SetupError, or
// the handler's refusal of a huge message). Anything else is a finding: a sanitizer report,
// another exception, or a broken invariant (checked with __builtin_trap).
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
  std::vector<std::unique_ptr<std::vector<unsigned char>>> buffers;
  std::vector<std::unique_ptr<transport::InboundSink>> sinks;
  std::vector<std::uint64_t> sizes;
  transport::InboundSink* on_message_start(const transport::Envelope& env) override {
    require(env.nbytes <= transport::kMaxMessageBytes && env.src == 0);
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

void fuzz_ring(const std::uint8_t* data, std::size_t size) {
  auto seg = std::make_shared<segment::Segment>(segment::Segment::create_anonymous(2, kRingSize));
  std::byte* ring_data = seg->ring_data(0, 1);
  std::memcpy(ring_data, data, std::min<std::size_t>(size, kRingSize));
  // Stamp each record the bytes declare, as a producer would have (first lap only).
  for (std::uint64_t pos = 0; pos + sizeof(ring::RecordHeader) <= kRingSize;) {
    std::uint32_t length = 0;
    std::memcpy(&length, ring_data + pos + 8, sizeof length);
    ring::stamp_at(ring_data, kRingSize - 1, pos).store(pos + 1, std::memory_order_release);
    if (length > kRingSize) break;
    pos += ring::padded_record_size(length);
  }
  transport::ShmTransport receiver(seg, 1, /*supervised=*/true);
  GuardedHandler handler;
  try {
    for (int i = 0; i < 64; ++i) {
      const bool moved = receiver.poll(handler, i % 2 ? 0 : -1, i % 3 == 0);
      receiver.flush();
      if (!moved) break;
    }
  } catch (const Error&) {
  }
  handler.check_guards();
  require(seg->ring_control(0, 1).tail.load() <= 2 * kRingSize);
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
  switch (data[0] % 3) {
    case 0: fuzz_ring(data + 1, size - 1); break;
    case 1: fuzz_segment(data + 1, size - 1); break;
    case 2: fuzz_header(data + 1, size - 1); break;
  }
  return 0;
}
