// The Transport contract (transport/transport.hpp), one set of cases run over every
// implementation in one process: the in-memory fake (tests/engine/fake_transport.hpp), the
// shared-memory transport, and the routing transport over shared memory (global ranks that
// differ from the segment's local ones, beside a remote side with nothing to say). A new
// transport gets a World below and must pass every case.
//
// Every World has kWorld ranks or more: `rx` receives, `tx1` and `tx2` send, and each ring
// (or what stands for one) holds about kRing bytes, so a message of several kRing must stream.
// Loops are bounded (kMaxSteps): a transport that stops moving bytes fails, it does not hang.
#include <boost/mpl/list.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/fake_transport.hpp"
#include "support/recording_consumer.hpp"
#include "segment/segment.hpp"
#include "transport/routing_transport.hpp"
#include "transport/shm_transport.hpp"

using namespace shmdist;
using namespace shmdist::transport;

namespace {

constexpr std::size_t kRing = 4096;
constexpr int kMaxSteps = 100000;

// ---- the worlds -----------------------------------------------------------------------------

// Fake transports joined by settle(): what a sender's FakeTransport let out goes into the
// receiver's FakeWire as it arrives, and each sender's room is what the receiver has not
// consumed yet of kRing bytes.
struct FakeWorld {
  static constexpr const char* kName = "fake";
  static constexpr int kWorld = 3;
  int rx = 0, tx1 = 1, tx2 = 2;

  FakeWorld() {
    for (int r = 0; r < kWorld; ++r) {
      wires[r] = std::make_shared<test::FakeWire>(r, kWorld);
      wires[r]->direct = true;  // receive_direct takes an exact, whole message
      transports[r] = std::make_unique<test::FakeTransport>(wires[r]);
    }
    settle();
  }
  Transport& at(int rank) { return *transports[rank]; }

  void settle() {
    for (int s = 0; s < kWorld; ++s)
      for (int r = 0; r < kWorld; ++r)
        if (s != r) carry(s, r);
  }

 private:
  struct Pipe {
    std::size_t next = 0;  // the first outbound message not wholly carried
    std::uint64_t carried_of_next = 0;
    test::FakeWire::Inbound* in = nullptr;  // its inbound copy (deque: references stay valid)
    std::uint64_t carried = 0;              // every byte carried
  };
  void carry(int s, int r) {
    Pipe& p = pipes[s][r];
    auto& out = wires[s]->outbound[r];
    test::FakeWire& to = *wires[r];
    while (p.next < out.size()) {
      const test::FakeWire::Outbound& o = out[p.next];
      if (p.in == nullptr) {
        to.arrive(s, o.env, std::vector<std::byte>(o.env.nbytes), 0);
        p.in = &to.inbound[s].back();
        p.carried_of_next = 0;
      }
      const std::uint64_t n = o.bytes.size() - p.carried_of_next;
      std::copy(o.bytes.begin() + static_cast<std::ptrdiff_t>(p.carried_of_next), o.bytes.end(),
                p.in->bytes.begin() + static_cast<std::ptrdiff_t>(p.carried_of_next));
      to.allow(s, n);
      p.carried_of_next += n;
      p.carried += n;
      if (p.carried_of_next < o.env.nbytes) break;
      ++p.next;
      p.in = nullptr;
    }
    wires[s]->room[r] = kRing - (p.carried - to.consumed_of(s));
  }

  std::array<std::shared_ptr<test::FakeWire>, kWorld> wires;
  std::array<std::unique_ptr<test::FakeTransport>, kWorld> transports;
  std::array<std::array<Pipe, kWorld>, kWorld> pipes{};
};

// The shared-memory transport: one anonymous segment, a ShmTransport per rank.
struct ShmWorld {
  static constexpr const char* kName = "shm";
  static constexpr int kWorld = 3;
  int rx = 0, tx1 = 1, tx2 = 2;

  ShmWorld() {
    for (int r = 0; r < kWorld; ++r)
      transports[r] = std::make_unique<ShmTransport>(segment, r, /*supervised=*/true);
  }
  Transport& at(int rank) { return *transports[rank]; }
  void settle() {}

  std::shared_ptr<segment::Segment> segment =
      std::make_shared<segment::Segment>(segment::Segment::create_anonymous(kWorld, kRing));
  std::array<std::unique_ptr<ShmTransport>, kWorld> transports;
};

// A remote side that never has anything (the routing transport's remote half, for ranks the
// cases do not use).
class NullRemote final : public RemoteTransport {
 public:
  NullRemote(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  bool poll(InboundHandler&, int, bool) override { return false; }
  DirectResult receive_direct(int, const Expectation&) override { return DirectResult::Empty; }
  int receive_direct_any(const Expectation&, DirectResult& result) override {
    result = DirectResult::Empty;
    return -1;
  }
  bool send_some(int, OutboundMessage&) override { return false; }
  void flush() override {}
  bool inbound_in_progress(int) const override { return false; }
  bool inbound_pending(int) const override { return false; }
  std::chrono::nanoseconds poll_interval() override { return std::chrono::microseconds(10); }
  bool transfers_in_flight() const override { return false; }
  bool peer_finalized(int) const override { return false; }
  void send_finalized() override {}

 private:
  int rank_, world_;
};

// Routing: a job of 4 global ranks, of which 0, 2 and 3 share this host's segment (local
// ranks 0, 1, 2) and 1 is on another host. The cases talk between global ranks 0, 2 and 3,
// so every rank number crosses the global <-> local mapping.
struct RoutingWorld {
  static constexpr const char* kName = "routing";
  static constexpr int kWorld = 4;
  int rx = 0, tx1 = 2, tx2 = 3;

  RoutingWorld() {
    const std::vector<int> members{0, 2, 3};
    const std::vector<std::string> hosts{"a", "b", "a", "a"};
    for (int l = 0; l < 3; ++l) {
      const int g = members[l];
      links[g] = make_routing_link(g, members, hosts, make_shm_link(segment, l, true),
                                   std::make_unique<NullRemote>(g, kWorld));
    }
  }
  Transport& at(int rank) { return *links[rank].bytes; }
  void settle() {}

  std::shared_ptr<segment::Segment> segment =
      std::make_shared<segment::Segment>(segment::Segment::create_anonymous(3, kRing));
  std::array<Link, kWorld> links;
};

using Worlds = boost::mpl::list<FakeWorld, ShmWorld, RoutingWorld>;

// ---- helpers --------------------------------------------------------------------------------

std::vector<std::byte> pattern(std::size_t n, int seed) {
  std::vector<std::byte> b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 7 + seed * 31) & 0xff);
  return b;
}

Envelope envelope(int src, int tag, std::size_t nbytes) {
  Envelope e;
  e.src = src;
  e.key.tag = tag;
  e.dtype = DType::UInt8;
  e.numel = nbytes;
  e.nbytes = nbytes;
  return e;
}

OutboundMessage outbound(int src, int tag, const std::vector<std::byte>& bytes) {
  OutboundMessage m;
  m.env = envelope(src, tag, bytes.size());
  m.next = bytes.data();
  return m;
}

Expectation expect(int tag, std::vector<std::byte>& into) {
  return {envelope(-1, tag, into.size()), into.data()};
}

struct Got {
  Envelope env;
  std::vector<std::byte> bytes;
};

// Collects whole messages, checking the handler protocol: one start, bytes, one complete.
class Collector final : public InboundHandler {
 public:
  InboundSink* on_message_start(const Envelope& env) override {
    auto& slot = open_[env.src];
    BOOST_TEST_REQUIRE((slot == nullptr),
                       "a message from " << env.src << " began before the last ended");
    slot = std::make_unique<Open>();
    slot->bytes.resize(env.nbytes);
    slot->sink.dest = slot->bytes.data();
    if (consume) slot->sink.consumer = &slot->recorder;
    ++starts;
    return &slot->sink;
  }
  void on_message_complete(InboundSink* sink, const Envelope& env) override {
    auto& slot = open_[env.src];
    BOOST_TEST_REQUIRE((slot != nullptr));
    BOOST_TEST(sink == &slot->sink);
    BOOST_TEST(sink->received == env.nbytes);
    if (consume) {
      BOOST_TEST(slot->recorder.in_order, "a consumer was handed bytes out of order");
      slot->bytes = std::move(slot->recorder.bytes);
    }
    got.push_back({env, std::move(slot->bytes)});
    slot.reset();
  }
  std::vector<Got> got;
  int starts = 0;
  bool consume = false;  // hand the bytes to a consumer (InboundSink::consumer), not dest

 private:
  struct Open {
    InboundSink sink;
    std::vector<std::byte> bytes;
    test::RecordingConsumer recorder;
  };
  std::map<int, std::unique_ptr<Open>> open_;
};

// One step of a single-threaded job: the sender offers what it can, the receiver takes what
// arrived and publishes the space it freed.
template <class W>
void step(W& w, int src, OutboundMessage* msg, Collector& c) {
  w.settle();
  if (msg != nullptr && !msg->done()) w.at(src).send_some(w.rx, *msg);
  w.settle();
  w.at(w.rx).poll(c, -1, false);
  w.at(w.rx).flush();
  w.settle();
}

// Sends every message of `msgs` from `src` (in order), the receiver polling meanwhile, until
// `expect_total` messages arrived.
template <class W>
void run(W& w, int src, std::vector<OutboundMessage>& msgs, Collector& c,
         std::size_t expect_total) {
  std::size_t i = 0;
  for (int n = 0; n < kMaxSteps && c.got.size() < expect_total; ++n) {
    while (i < msgs.size() && msgs[i].done()) ++i;
    step(w, src, i < msgs.size() ? &msgs[i] : nullptr, c);
  }
  BOOST_TEST_REQUIRE(c.got.size() == expect_total, "only " << c.got.size() << " of "
                                                           << expect_total << " arrived");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(transport_contract)

BOOST_AUTO_TEST_CASE_TEMPLATE(a_fresh_transport_has_nothing_and_polls_move_nothing, W, Worlds) {
  W w;
  Collector c;
  for (const int r : {w.rx, w.tx1, w.tx2}) {
    BOOST_TEST_CONTEXT(W::kName << " rank " << r) {
      Transport& t = w.at(r);
      BOOST_TEST(t.rank() == r);
      BOOST_TEST(t.world_size() == W::kWorld);
      BOOST_TEST(!t.poll(c, -1, false));
      BOOST_TEST(!t.poll(c, -1, true));
      const int other = r == w.rx ? w.tx1 : w.rx;
      BOOST_TEST(!t.poll(c, other, false));
      BOOST_TEST(!t.inbound_pending(other));
      BOOST_TEST(!t.inbound_in_progress(other));
      std::vector<std::byte> buf(8);
      BOOST_TEST((t.receive_direct(other, expect(0, buf)) == DirectResult::Empty));
      DirectResult result = DirectResult::Received;
      BOOST_TEST(t.receive_direct_any(expect(0, buf), result) == -1);
      BOOST_TEST((result != DirectResult::Received));
      t.flush();
    }
  }
  BOOST_TEST(c.starts == 0);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(messages_from_one_peer_arrive_in_the_order_sent, W, Worlds) {
  W w;
  Collector c;
  std::vector<std::vector<std::byte>> payloads;
  for (int i = 0; i < 40; ++i) payloads.push_back(pattern((i * 97) % 1500, i));  // 0 .. ~1.5 KB
  std::vector<OutboundMessage> msgs;
  for (int i = 0; i < 40; ++i) msgs.push_back(outbound(w.tx1, i, payloads[i]));
  run(w, w.tx1, msgs, c, msgs.size());
  for (int i = 0; i < 40; ++i) {
    BOOST_TEST_CONTEXT(W::kName << " message " << i) {
      BOOST_TEST(c.got[i].env.src == w.tx1);
      BOOST_TEST(c.got[i].env.key.tag == i);
      BOOST_TEST(c.got[i].env.nbytes == payloads[i].size());
      BOOST_TEST((c.got[i].bytes == payloads[i]));
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_message_larger_than_the_ring_streams_through_it, W, Worlds) {
  W w;
  Collector c;
  const auto payload = pattern(5 * kRing + 123, 9);
  std::vector<OutboundMessage> msgs{outbound(w.tx1, 3, payload)};
  // Nobody consumes yet: the ring takes at most its size.
  w.at(w.tx1).send_some(w.rx, msgs[0]);
  w.settle();
  BOOST_TEST(msgs[0].started);
  BOOST_TEST(msgs[0].sent <= kRing);
  BOOST_TEST(!msgs[0].done());
  // The receiver starts it; its sender still owes bytes.
  w.at(w.rx).poll(c, -1, false);
  BOOST_TEST(c.starts == 1);
  BOOST_TEST(w.at(w.rx).inbound_in_progress(w.tx1));
  run(w, w.tx1, msgs, c, 1);
  BOOST_TEST(!w.at(w.rx).inbound_in_progress(w.tx1));
  BOOST_TEST(c.starts == 1);
  BOOST_TEST((c.got[0].bytes == payload));
}

// While one peer floods, another's message is still heard, by poll() and by the any-source
// direct path (which may say Other: then poll()).
BOOST_AUTO_TEST_CASE_TEMPLATE(an_any_source_scan_starves_no_sender, W, Worlds) {
  for (const bool direct : {false, true}) {
    BOOST_TEST_CONTEXT(W::kName << (direct ? " receive_direct_any" : " poll")) {
      W w;
      Collector c;
      const auto flood = pattern(64, 1);
      const auto single = pattern(64, 2);
      OutboundMessage from1 = outbound(w.tx1, 7, flood);
      auto keep_flooding = [&] {
        w.settle();
        if (from1.done()) from1 = outbound(w.tx1, 7, flood);
        w.at(w.tx1).send_some(w.rx, from1);
        w.settle();
      };
      for (int i = 0; i < 200; ++i) keep_flooding();  // tx1's ring is full
      OutboundMessage from2 = outbound(w.tx2, 7, single);
      w.at(w.tx2).send_some(w.rx, from2);
      BOOST_TEST_REQUIRE(from2.done());
      bool heard = false;
      std::vector<std::byte> into(64);
      for (int call = 0; call < 64 && !heard; ++call) {
        w.settle();
        if (direct) {
          DirectResult result;
          const int from = w.at(w.rx).receive_direct_any(expect(7, into), result);
          if (result == DirectResult::Received) {
            BOOST_TEST((from == w.tx1 ? into == flood : into == single));
            heard = from == w.tx2;
          } else if (result == DirectResult::Other) {
            w.at(w.rx).poll(c, -1, false);
          }
        } else {
          w.at(w.rx).poll(c, -1, false);
        }
        heard = heard || std::any_of(c.got.begin(), c.got.end(),
                                     [&](const Got& g) { return g.env.src == w.tx2; });
        w.at(w.rx).flush();
        keep_flooding();
      }
      BOOST_TEST(heard, "rank " << w.tx2 << "'s message was not heard in 64 calls");
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(receive_direct_takes_only_the_exact_next_message, W, Worlds) {
  W w;
  Collector c;
  Transport& rx = w.at(w.rx);
  // Exact: taken whole into dest, and gone from the stream.
  const auto exact = pattern(100, 4);
  auto m = outbound(w.tx1, 5, exact);
  w.at(w.tx1).send_some(w.rx, m);
  w.settle();
  BOOST_TEST(rx.inbound_pending(w.tx1));
  std::vector<std::byte> into(100);
  BOOST_TEST((rx.receive_direct(w.tx1, expect(5, into)) == DirectResult::Received));
  BOOST_TEST((into == exact));
  w.settle();
  BOOST_TEST(!rx.inbound_pending(w.tx1));
  BOOST_TEST(!rx.poll(c, -1, true));
  BOOST_TEST(c.starts == 0);

  // Another key next: Other, and the message stays for poll(), intact.
  const auto other = pattern(100, 5);
  auto m2 = outbound(w.tx1, 6, other);
  w.at(w.tx1).send_some(w.rx, m2);
  w.settle();
  BOOST_TEST((rx.receive_direct(w.tx1, expect(7, into)) == DirectResult::Other));
  // Another size: Other too.
  std::vector<std::byte> wrong_size(99);
  BOOST_TEST((rx.receive_direct(w.tx1, expect(6, wrong_size)) == DirectResult::Other));
  // Nothing from tx2: Empty, whatever tx1 has.
  BOOST_TEST((rx.receive_direct(w.tx2, expect(6, into)) == DirectResult::Empty));
  BOOST_TEST(rx.poll(c, -1, false));
  BOOST_TEST_REQUIRE(c.got.size() == 1u);
  BOOST_TEST(c.got[0].env.key.tag == 6);
  BOOST_TEST((c.got[0].bytes == other));
}

// receive_direct touches only its source: another source's message may be mid-stream.
BOOST_AUTO_TEST_CASE_TEMPLATE(receive_direct_leaves_another_sources_stream_alone, W, Worlds) {
  W w;
  Collector c;
  const auto big = pattern(4 * kRing, 6);
  std::vector<OutboundMessage> from2{outbound(w.tx2, 1, big)};
  w.at(w.tx2).send_some(w.rx, from2[0]);
  w.settle();
  w.at(w.rx).poll(c, -1, false);
  w.at(w.rx).flush();
  BOOST_TEST_REQUIRE(w.at(w.rx).inbound_in_progress(w.tx2));
  const auto small = pattern(32, 7);
  auto m = outbound(w.tx1, 2, small);
  w.at(w.tx1).send_some(w.rx, m);
  w.settle();
  std::vector<std::byte> into(32);
  BOOST_TEST((w.at(w.rx).receive_direct(w.tx1, expect(2, into)) == DirectResult::Received));
  BOOST_TEST((into == small));
  BOOST_TEST(w.at(w.rx).inbound_in_progress(w.tx2));
  run(w, w.tx2, from2, c, 1);
  BOOST_TEST((c.got[0].bytes == big));
}

// After release_outbound the transport reads a message only through msg.next and msg.sent:
// the sender may free the original memory and go on from a copy of the rest.
BOOST_AUTO_TEST_CASE_TEMPLATE(release_outbound_lets_the_sender_free_its_memory, W, Worlds) {
  W w;
  Collector c;
  const auto payload = pattern(3 * kRing, 8);
  auto original = payload;
  std::vector<OutboundMessage> msgs{outbound(w.tx1, 4, original)};
  w.at(w.tx1).send_some(w.rx, msgs[0]);
  w.settle();
  BOOST_TEST_REQUIRE(!msgs[0].done());
  const std::uint64_t sent = msgs[0].sent;
  w.at(w.tx1).release_outbound(w.rx, msgs[0]);
  BOOST_TEST(msgs[0].sent == sent);
  BOOST_TEST(!msgs[0].done());
  std::vector<std::byte> rest(payload.begin() + static_cast<std::ptrdiff_t>(msgs[0].sent),
                              payload.end());
  std::fill(original.begin(), original.end(), std::byte{0xEE});
  original = {};
  msgs[0].next = rest.data();
  run(w, w.tx1, msgs, c, 1);
  BOOST_TEST((c.got[0].bytes == payload));
}

// A sink with a consumer gets every byte of each message once, in order (streamed, split
// where the ring wraps, or landed first), and nothing is lost between messages.
BOOST_AUTO_TEST_CASE_TEMPLATE(a_consumer_gets_every_byte_once_in_order, W, Worlds) {
  W w;
  Collector c;
  c.consume = true;
  std::vector<std::vector<std::byte>> payloads;
  for (int i = 0; i < 12; ++i)
    payloads.push_back(pattern(i % 4 == 0 ? 0 : i % 4 == 1 ? 5 * kRing + 123 : (i * 389) % 3000, i));
  std::vector<OutboundMessage> msgs;
  for (int i = 0; i < 12; ++i) msgs.push_back(outbound(w.tx1, i, payloads[i]));
  run(w, w.tx1, msgs, c, msgs.size());
  for (int i = 0; i < 12; ++i) {
    BOOST_TEST_CONTEXT(W::kName << " message " << i) {
      BOOST_TEST(c.got[i].env.key.tag == i);
      BOOST_TEST((c.got[i].bytes == payloads[i]));
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(zero_byte_messages_are_messages, W, Worlds) {
  W w;
  Collector c;
  const std::vector<std::byte> none;
  const auto ten = pattern(10, 3);
  std::vector<OutboundMessage> msgs{outbound(w.tx1, 1, none), outbound(w.tx1, 2, ten),
                                    outbound(w.tx1, 3, none)};
  BOOST_TEST(w.at(w.tx1).send_some(w.rx, msgs[0]));
  BOOST_TEST(msgs[0].done());
  run(w, w.tx1, msgs, c, 3);
  BOOST_TEST(c.got[0].env.key.tag == 1);
  BOOST_TEST(c.got[0].env.nbytes == 0u);
  BOOST_TEST(c.got[1].env.key.tag == 2);
  BOOST_TEST((c.got[1].bytes == ten));
  BOOST_TEST(c.got[2].env.key.tag == 3);
  BOOST_TEST(c.got[2].env.nbytes == 0u);
  // The direct path takes one too, with no destination memory.
  auto m = outbound(w.tx1, 9, none);
  w.at(w.tx1).send_some(w.rx, m);
  w.settle();
  BOOST_TEST((w.at(w.rx).receive_direct(w.tx1, {envelope(-1, 9, 0), nullptr}) ==
              DirectResult::Received));
  BOOST_TEST(!w.at(w.rx).poll(c, -1, true));
}

// Shared memory only: a message larger than stream_record() goes through the ring in records
// of at most that size (the receiver copies one out while the sender copies the next in), and
// arrives whole; a message that fits one record takes one. Checked by walking the ring's
// records with a consumer of our own beside the receiver's (it reads, never releases).
BOOST_AUTO_TEST_CASE(large_messages_stream_in_records_the_receiver_can_copy_behind_the_sender) {
  constexpr std::uint64_t kBigRing = 1 << 20;
  auto segment =
      std::make_shared<segment::Segment>(segment::Segment::create_anonymous(2, kBigRing));
  ShmTransport rx(segment, 0, /*supervised=*/true), tx(segment, 1, /*supervised=*/true);
  const std::size_t record = tx.stream_record();
  BOOST_TEST_REQUIRE(record < std::size_t{64} << 10);  // below the 64 KiB of a one-record message
  ring::RingConsumer look(&segment->ring_control(1, 0), segment->ring_data(1, 0), kBigRing);
  const std::size_t header = sizeof(MessageHeader);
  const std::size_t sizes[] = {0, record - header, record - header + 1, 64 << 10, 200000};
  Collector c;
  int tag = 0;
  for (const std::size_t n : sizes) {
    BOOST_TEST_CONTEXT("message of " << n << " bytes") {
      const auto payload = pattern(n, tag);
      OutboundMessage m = outbound(1, tag, payload);
      BOOST_TEST_REQUIRE(tx.send_some(0, m));  // the ring has room for all of it
      BOOST_TEST_REQUIRE(m.done());
      std::size_t records = 0, carried = 0;
      for (const ring::RecordHeader* r = look.peek(); r != nullptr; r = look.peek()) {
        BOOST_TEST(r->length <= record);
        BOOST_TEST(r->kind == static_cast<std::uint16_t>(records == 0 ? ring::RecordKind::Start
                                                                     : ring::RecordKind::Continuation));
        carried += r->length;
        ++records;
        look.release(r->length);
      }
      BOOST_TEST(carried == header + n);
      BOOST_TEST(records == std::max<std::size_t>(1, (header + n + record - 1) / record));
      for (int i = 0; i < kMaxSteps && c.got.size() <= static_cast<std::size_t>(tag); ++i) {
        rx.poll(c, 1, false);
        rx.flush();
      }
      BOOST_TEST_REQUIRE(c.got.size() == static_cast<std::size_t>(tag) + 1);
      BOOST_TEST((c.got.back().bytes == payload));
      ++tag;
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
