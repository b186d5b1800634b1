// Frames and rings written by a buggy or hostile peer: impossible lengths, kinds, dtypes,
// tags or channels are PeerFailure naming the sender, never a crash or a copy past the
// receiver's buffer. Unit tests of transport/frame.* and of the consumer path (ShmTransport::poll
// over a ring whose records this test crafts byte by byte).
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include <shmdist/errors.hpp>

#include "transport/frame.hpp"
#include "ring/ring.hpp"
#include "segment/segment.hpp"
#include "base/config.hpp"
#include "transport/shm_transport.hpp"

#include "offer_support.hpp"

using namespace shmdist;
using transport::Envelope;
using transport::MessageHeader;
using ring::RecordKind;

namespace {

using test::offers::peer_failure_says;

MessageHeader header(std::uint64_t numel, DType dtype = kInt32, int tag = 0) {
  Envelope env;
  env.key.tag = tag;
  env.dtype = dtype;
  env.numel = numel;
  env.nbytes = numel * element_size(dtype);
  return transport::encode_header(env);
}

constexpr std::uint64_t kStart = static_cast<std::uint16_t>(RecordKind::Start);
constexpr std::uint64_t kCont = static_cast<std::uint16_t>(RecordKind::Continuation);

}  // namespace

BOOST_AUTO_TEST_SUITE(hostile_frames)

BOOST_AUTO_TEST_CASE(decode_header_accepts_what_encode_header_writes) {
  Envelope env;
  env.key.group_id = 3;
  env.key.group_sig = 0xabcdef;
  env.key.tag = 77;
  env.key.channel = transport::kInternalChannel;
  env.dtype = kFloat64;
  env.numel = 10;
  env.nbytes = 80;
  const Envelope back = transport::decode_header(transport::encode_header(env), 32 + 80, 5);
  BOOST_TEST(back.src == 5);
  BOOST_TEST(back.key.group_id == 3u);
  BOOST_TEST(back.key.group_sig == 0xabcdefu);
  BOOST_TEST(back.key.tag == 77);
  BOOST_TEST(back.key.channel == transport::kInternalChannel);
  BOOST_TEST((back.dtype == kFloat64));
  BOOST_TEST(back.numel == 10u);
  BOOST_TEST(back.nbytes == 80u);
  // An empty message, and a first record carrying only part of a message.
  transport::decode_header(header(0), 32, 1);
  transport::decode_header(header(1000), 32 + 100, 1);
}

BOOST_AUTO_TEST_CASE(decode_header_refuses_impossible_fields) {
  struct Case {
    std::string what;
    MessageHeader raw;
    std::uint64_t record_length;
    std::string words;
  };
  auto with = [](auto mutate) {
    MessageHeader h = header(4);
    mutate(h);
    return h;
  };
  const std::vector<Case> cases = {
      {"short record", header(4), 31, "a message record of 31 bytes, shorter than its 32-byte"},
      {"empty record", header(4), 0, "a message record of 0 bytes"},
      {"negative tag", with([](MessageHeader& h) { h.tag = -1; }), 48, "negative tag -1"},
      {"tag INT_MIN", with([](MessageHeader& h) { h.tag = INT32_MIN; }), 48, "negative tag"},
      {"channel 2", with([](MessageHeader& h) { h.channel = 2; }), 48, "channel 2"},
      {"channel 255", with([](MessageHeader& h) { h.channel = 255; }), 48, "channel 255"},
      {"huge nbytes", with([](MessageHeader& h) { h.nbytes = std::uint64_t{1} << 41; }), 48,
       "a message of 2199023255552 bytes, above the 1099511627776-byte limit"},
      {"nbytes/numel mismatch", with([](MessageHeader& h) { h.nbytes = 17; }), 48,
       "byte count 17 for 4 elements of torch.int32 (expected 16)"},
      {"numel overflowing nbytes", with([](MessageHeader& h) {
         h.dtype = static_cast<std::uint8_t>(kInt64);
         h.numel = std::uint64_t{1} << 61;  // * 8 wraps to 0
         h.nbytes = 0;
       }),
       32, "byte count 0 for 2305843009213693952 elements"},
      {"record longer than its message", header(4), 32 + 17,
       "a first record carrying 17 payload bytes for a message of 16"},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      peer_failure_says([&] { transport::decode_header(c.raw, c.record_length, 3); },
                        "corrupt frame from rank 3: " + c.words);
    }
  }
}

// A dtype code past this build's table (shmdist/dtype_table.hpp) is what a rank built with a
// newer shmdist sends: reported as a version mismatch naming the peer and the code, never as
// a corrupt frame (the frame is otherwise well formed).
BOOST_AUTO_TEST_CASE(a_dtype_code_past_the_table_is_a_version_mismatch) {
  for (unsigned code : {static_cast<unsigned>(kNumDTypes), 42u, 255u}) {
    BOOST_TEST_CONTEXT("dtype code " << code) {
      MessageHeader h = header(4);
      h.dtype = static_cast<std::uint8_t>(code);
      const std::string words = "peer rank 3 sent dtype code " + std::to_string(code) +
                                " which this build does not know";
      peer_failure_says([&] { transport::decode_header(h, 48, 3); }, words);
      peer_failure_says([&] { transport::decode_header(h, 48, 3); },
                        "it was built with a newer shmdist; rebuild every rank from the same "
                        "version");
      try {
        transport::decode_header(h, 48, 3);
      } catch (const PeerFailure& e) {
        BOOST_TEST(std::string(e.what()).find("corrupt") == std::string::npos, e.what());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(check_record_refuses_records_out_of_sequence) {
  const std::uint64_t max = 4096 - 64 - 16;
  transport::check_record(kStart, 32, max, false, 0, 2);
  transport::check_record(kCont, 100, max, true, 100, 2);
  peer_failure_says([&] { transport::check_record(kStart, max + 1, max, false, 0, 2); },
                    "a record of 4017 bytes in a ring that holds at most 4016");
  peer_failure_says([&] { transport::check_record(kStart, 0xffffffff, max, false, 0, 2); },
                    "a record of 4294967295 bytes");
  peer_failure_says([&] { transport::check_record(kStart, 32, max, true, 50, 2); },
                    "a new message while 50 bytes of the previous one were still due");
  peer_failure_says([&] { transport::check_record(kCont, 10, max, false, 0, 2); },
                    "a continuation record outside any message");
  peer_failure_says([&] { transport::check_record(kCont, 0, max, true, 10, 2); },
                    "a continuation of 0 bytes when 10 were due");
  peer_failure_says([&] { transport::check_record(kCont, 11, max, true, 10, 2); },
                    "a continuation of 11 bytes when 10 were due");
  for (std::uint16_t kind : {0, 3, 0x7fff, 0xffff})
    peer_failure_says([&] { transport::check_record(kind, 16, max, false, 0, 2); },
                      "record kind " + std::to_string(kind) + ", expected 1 (start)");
}

namespace {

// Receives into buffers with a guard zone behind them (offer_support.hpp), to see that
// nothing is written past the message's size.
using test::offers::GuardedHandler;

// Rank 1's view of a 2-rank segment, with a hand-written ring from rank 0.
struct CraftedRing {
  std::shared_ptr<segment::Segment> seg =
      std::make_shared<segment::Segment>(segment::Segment::create_anonymous(2, 4096));
  transport::ShmTransport receiver{seg, 1, /*supervised=*/true, config::kDefaultHealthCheck};
  std::byte* data = seg->ring_data(0, 1);
  std::uint64_t mask = seg->ring_size() - 1;
  std::uint64_t pos = 0;  // where the next record goes

  // Writes a record header claiming `length` payload bytes of `kind`, followed by `payload`
  // (which may be shorter than `length`: the claim is what a hostile peer controls), stamps
  // it as the producer would, and zeroes the next stamp slot.
  void put(std::uint64_t kind, std::uint32_t length, const void* payload, std::size_t size) {
    ring::RecordHeader rec{};
    rec.length = length;
    rec.kind = static_cast<std::uint16_t>(kind);
    ring::copy_into_ring(data, mask, pos + 8, reinterpret_cast<const std::byte*>(&rec) + 8, 8);
    if (size)
      ring::copy_into_ring(data, mask, pos + 16, static_cast<const std::byte*>(payload), size);
    const std::uint64_t next =
        pos + ring::padded_record_size(std::min<std::uint64_t>(length, 2048));
    ring::stamp_at(data, mask, next).store(0);
    ring::stamp_at(data, mask, pos).store(pos + 1, std::memory_order_release);
    pos = next;
  }
  void put_start(const MessageHeader& h, std::size_t payload_bytes, std::uint32_t claimed = 0) {
    std::vector<std::byte> bytes(sizeof h + payload_bytes, std::byte{0x11});
    std::memcpy(bytes.data(), &h, sizeof h);
    put(kStart, claimed ? claimed : static_cast<std::uint32_t>(bytes.size()), bytes.data(),
        bytes.size());
  }
  void put_continuation(std::size_t payload_bytes, std::uint32_t claimed = 0) {
    std::vector<std::byte> bytes(payload_bytes, std::byte{0x22});
    put(kCont, claimed ? claimed : static_cast<std::uint32_t>(payload_bytes), bytes.data(),
        bytes.size());
  }
  // Polls until nothing moves (a PeerFailure propagates).
  void drain(GuardedHandler& h) {
    for (int i = 0; i < 100 && receiver.poll(h, -1, true); ++i) {
    }
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_well_formed_crafted_ring_is_received) {
  CraftedRing ring;
  GuardedHandler h;
  ring.put_start(header(100), 200);  // 100 int32 = 400 bytes: 200 now, 200 later
  ring.put_continuation(150);
  ring.put_continuation(50);
  ring.put_start(header(0), 0);      // an empty message
  ring.drain(h);
  BOOST_TEST(h.started.size() == 2u);
  BOOST_TEST(h.completed.size() == 2u);
  BOOST_TEST(h.sinks[0].received == 400u);
  BOOST_TEST(h.guards_intact());
}

BOOST_AUTO_TEST_CASE(a_hostile_ring_is_a_peer_failure_not_a_crash) {
  struct Case {
    std::string what;
    std::function<void(CraftedRing&)> craft;
    std::string words;
  };
  auto start_with = [](auto mutate) {
    return [mutate](CraftedRing& r) {
      MessageHeader h = header(8);
      mutate(h);
      r.put_start(h, 32);
    };
  };
  const std::vector<Case> cases = {
      {"record longer than the ring",
       [](CraftedRing& r) { r.put_start(header(8), 32, 0xfffffff0); },
       "a record of 4294967280 bytes in a ring that holds at most 4016"},
      {"record just over the limit", [](CraftedRing& r) { r.put_start(header(2000), 32, 4017); },
       "a record of 4017 bytes"},
      {"unknown kind", [](CraftedRing& r) { r.put(9, 48, nullptr, 0); }, "record kind 9"},
      {"continuation first", [](CraftedRing& r) { r.put_continuation(64); },
       "a continuation record outside any message"},
      {"continuation too long",
       [](CraftedRing& r) {
         r.put_start(header(100), 100);  // 300 bytes still due
         r.put_continuation(64, 301);
       },
       "a continuation of 301 bytes when 300 were due"},
      {"empty continuation",
       [](CraftedRing& r) {
         r.put_start(header(100), 100);
         r.put_continuation(0);
       },
       "a continuation of 0 bytes when 300 were due"},
      {"start inside a message",
       [](CraftedRing& r) {
         r.put_start(header(100), 100);
         r.put_start(header(4), 16);
       },
       "a new message while 300 bytes of the previous one were still due"},
      {"short start record", [](CraftedRing& r) { r.put(kStart, 8, nullptr, 0); },
       "a message record of 8 bytes"},
      {"tag", start_with([](MessageHeader& h) { h.tag = -7; }), "negative tag -7"},
      {"channel", start_with([](MessageHeader& h) { h.channel = 3; }), "channel 3"},
      {"nbytes beyond the limit",
       start_with([](MessageHeader& h) { h.nbytes = h.numel = std::uint64_t{1} << 50; }),
       "a message of 1125899906842624 bytes, above the 1099511627776-byte limit"},
      {"nbytes disagrees with numel", start_with([](MessageHeader& h) { h.nbytes = 1; }),
       "byte count 1 for 8 elements"},
      {"payload beyond the message", start_with([](MessageHeader& h) {
         h.numel = 2;
         h.nbytes = 8;
       }),
       "a first record carrying 32 payload bytes for a message of 8"},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      CraftedRing ring;
      GuardedHandler h;
      c.craft(ring);
      peer_failure_says([&] { ring.drain(h); }, "corrupt frame from rank 0: " + c.words);
      BOOST_TEST(h.guards_intact());
      // Asking again gives the same answer: the bad record is not skipped or half-consumed.
      peer_failure_says([&] { ring.drain(h); }, "corrupt frame from rank 0");
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
