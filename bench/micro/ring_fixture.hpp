// A ring of a private anonymous segment (no launcher, no /dev/shm name) with its producer
// and consumer views, and the frame header ShmTransport puts in front of a message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "transport/frame.hpp"
#include "ring/ring.hpp"
#include "segment/segment.hpp"

namespace micro {

inline constexpr std::uint64_t kRingSize = std::uint64_t{1} << 20;  // shmrun's default for 2 ranks

// The ring carrying messages from rank `src` to rank `dst` of `segment`.
struct RingView {
  shmdist::ring::RingProducer producer;
  shmdist::ring::RingConsumer consumer;

  RingView(const shmdist::segment::Segment& segment, int src, int dst)
      : producer(&segment.ring_control(src, dst), segment.ring_data(src, dst),
                 segment.ring_size()),
        consumer(&segment.ring_control(src, dst), segment.ring_data(src, dst),
                 segment.ring_size()) {}
};

inline shmdist::transport::MessageHeader header_for(std::size_t payload) {
  shmdist::transport::Envelope env;
  env.src = 0;
  env.key.tag = 7;
  env.dtype = shmdist::DType::UInt8;
  env.numel = payload;
  env.nbytes = payload;
  return shmdist::transport::encode_header(env);
}

inline std::span<const std::byte> bytes_of(const shmdist::transport::MessageHeader& h) {
  return std::as_bytes(std::span<const shmdist::transport::MessageHeader, 1>(&h, 1));
}

// Takes the Start record at the consumer's tail the way ShmTransport::consume_record does:
// check, decode, copy the payload out, release. Returns false if there is none yet.
inline bool take_message(shmdist::ring::RingConsumer& consumer, std::byte* dst, int src) {
  using namespace shmdist::ring;
  using namespace shmdist::transport;
  const RecordHeader* in_ring = consumer.peek();
  if (in_ring == nullptr) return false;
  RecordHeader rec;
  std::memcpy(&rec, in_ring, sizeof rec);
  check_record(rec.kind, rec.length, consumer.max_record_length(), false, 0, src);
  MessageHeader raw;
  std::memcpy(&raw, consumer.payload_prefix(), sizeof raw);
  const Envelope env = decode_header(raw, rec.length, src);
  consumer.copy_payload(sizeof(MessageHeader), dst, env.nbytes);
  consumer.release(rec.length);
  return true;
}

}  // namespace micro
