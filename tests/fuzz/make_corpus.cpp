// Writes the seed corpus of fuzz_frames (tests/fuzz/corpus/) from real encoders, so that the
// seeds stay faithful to the layout: well-formed rings, a real segment image, and headers.
//
//   shmdist_fuzz_make_corpus DIR
#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "transport/frame.hpp"
#include "ring/ring.hpp"
#include "segment/segment.hpp"

using namespace shmdist;

namespace {

void write_seed(const std::string& dir, const std::string& name, std::uint8_t target,
                const void* bytes, std::size_t size) {
  std::ofstream f(dir + "/" + name, std::ios::binary);
  f.put(static_cast<char>(target));
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(size));
}

transport::MessageHeader header(std::uint64_t numel, DType dtype, int tag) {
  transport::Envelope env;
  env.key.tag = tag;
  env.dtype = dtype;
  env.numel = numel;
  env.nbytes = numel * element_size(dtype);
  return transport::encode_header(env);
}

// A ring holding messages written by the real producer.
using Messages = std::vector<std::pair<transport::MessageHeader, std::size_t>>;  // header, bytes

std::vector<std::byte> ring_with(const Messages& msgs, std::size_t chunk) {
  segment::RingControl control{};
  std::vector<std::byte> data(4096);
  ring::RingProducer producer(&control, data.data(), data.size());
  for (const auto& [h, nbytes] : msgs) {
    std::vector<std::byte> payload(nbytes, std::byte{0x5a});
    std::size_t sent = 0;
    bool started = false;
    while (!started || sent < nbytes) {
      const std::size_t prefix = started ? 0 : sizeof h;
      const std::size_t n = std::min(nbytes - sent, chunk);
      if (producer.writable(prefix + n) < prefix + n) return data;  // full: enough for a seed
      const std::span<const std::byte> part(payload.data() + sent, n);
      if (!started)
        producer.publish(ring::RecordKind::Start,
                         std::as_bytes(std::span<const transport::MessageHeader, 1>(&h, 1)), part);
      else
        producer.publish(ring::RecordKind::Continuation, {}, part);
      started = true;
      sent += n;
    }
  }
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  auto small = ring_with({{header(4, kInt64, 0), 32}}, 4096);
  write_seed(dir, "ring-one-small-message", 0, small.data(), small.size());
  auto streamed = ring_with({{header(300, kFloat32, 7), 1200}, {header(0, kBool, 1), 0}}, 512);
  write_seed(dir, "ring-streamed-and-empty", 0, streamed.data(), streamed.size());
  auto many = ring_with({{header(1, kUInt8, 1), 1}, {header(2, kFloat16, 2), 4},
                         {header(3, kBFloat16, 3), 6}, {header(5, kFloat64, 4), 40}},
                        4096);
  write_seed(dir, "ring-four-dtypes", 0, many.data(), many.size());

  const auto seg = segment::Segment::create_anonymous(2, 4096);
  write_seed(dir, "segment-2-ranks-4k", 1, &seg.header(), seg.geometry().total_size);
  std::vector<std::byte> padded(sizeof(segment::SegmentHeader) + 1);
  padded[0] = std::byte{1 | (2 << 1)};  // pad to the claimed size; expect 2 ranks
  std::memcpy(padded.data() + 1, &seg.header(), sizeof(segment::SegmentHeader));
  write_seed(dir, "segment-header-only-padded", 1, padded.data(), padded.size());

  struct {
    transport::MessageHeader h;
    std::uint64_t record_length, remaining;
    std::uint16_t kind;
    std::uint8_t in_message;
  } __attribute__((packed)) fields{header(10, kInt32, 3), 32 + 40, 0, 1, 0};
  write_seed(dir, "header-start-record", 2, &fields, sizeof fields);
  fields.kind = 2;
  fields.in_message = 1;
  fields.remaining = 100;
  fields.record_length = 60;
  write_seed(dir, "header-continuation-record", 2, &fields, sizeof fields);

  // Target 3: a peer script. Fresh control fields, then sends that wrap the ring, drains, a
  // consumer tail nudged off the grid, a scribble, and a tail far ahead.
  std::vector<std::uint8_t> script(16, 0);
  auto op = [&](std::uint8_t code, std::initializer_list<std::uint8_t> args) {
    script.push_back(code);
    script.insert(script.end(), args);
  };
  op(0, {0x00, 0x01});  // send 256 bytes
  op(0, {0xf0, 0x0f});  // send 4080 bytes (streams, wraps)
  op(1, {});
  op(0, {0x08, 0x00});  // send 8 bytes
  op(3, {0x01});        // tail + 8
  op(0, {0x00, 0x10});  // send 4096 bytes: reloads the tail
  write_seed(dir, "peer-sends-drains-and-a-bad-tail", 3, script.data(), script.size());
  script.resize(16);
  op(0, {0x40, 0x00});
  op(4, {0x00, 0x00, 0xff, 0xff, 0xff, 0x7f, 0x01, 0x00, 0x00, 0x00});  // scribble on a record
  op(1, {});
  op(2, {0x40, 0x10, 0, 0, 0, 0, 0, 0});  // tail 4160, ahead of the head
  op(0, {0x00, 0x10});
  write_seed(dir, "peer-scribbles-and-tail-ahead", 3, script.data(), script.size());
  std::vector<std::uint8_t> moved(16, 0);
  moved[0] = 0xf8;  // head 4088 (the reproduction)
  moved[1] = 0x0f;
  moved[8] = 0xf8;  // tail 4088
  moved[9] = 0x0f;
  moved.insert(moved.end(), {0, 0x08, 0x00});
  write_seed(dir, "peer-moved-positions-before-join", 3, moved.data(), moved.size());
  return 0;
}
