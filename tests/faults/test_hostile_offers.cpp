// Single-copy offers (transport/single_copy.hpp) at the transport level, in one process: a real
// offer moves its bytes with one record in the ring, a revoked one streams them, and offers a
// buggy or hostile peer writes by hand (wrong length, pid, id, a replay, a wrapping address)
// give PeerFailure naming the sender, never a crash, a hang or a write past the buffer; an
// address a live sender's process_vm_readv cannot read is answered Streaming (the sender
// streams that message), from a sender that is gone it is PeerFailure.
#include <boost/test/unit_test.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <vector>

#include <shmdist/errors.hpp>

#include "base/config.hpp"
#include "ring/ring.hpp"
#include "segment/segment.hpp"
#include "transport/frame.hpp"
#include "transport/shm_transport.hpp"
#include "transport/single_copy.hpp"

#include "offer_support.hpp"

using namespace shmdist;
using transport::Envelope;
using transport::MessageHeader;
using transport::OfferDescriptor;
using transport::OfferState;
using transport::offer_word;

using namespace shmdist::test::offers;

namespace {

// Rank 1's view of a 2-rank segment, with offers from rank 0 written by hand.
struct CraftedOffers {
  std::shared_ptr<segment::Segment> seg =
      std::make_shared<segment::Segment>(segment::Segment::create_anonymous(2, 4096));
  transport::ShmTransport receiver{seg, 1, true, config::kDefaultHealthCheck, kThreshold};
  GuardedHandler handler;
  std::byte* data = seg->ring_data(0, 1);
  std::uint64_t mask = seg->ring_size() - 1;
  std::uint64_t pos = 0;
  std::vector<std::byte> source = pattern(8192);

  CraftedOffers() { seg->rank_control(0).pid.store(getpid()); }
  std::atomic<std::uint64_t>& state() { return seg->ring_control(0, 1).offer_state; }
  OfferDescriptor valid(std::uint64_t id) const {
    return {id, reinterpret_cast<std::uintptr_t>(source.data()), source.size(), getpid(), 0};
  }
  MessageHeader header(std::uint64_t nbytes) const {
    Envelope env;
    env.dtype = kUInt8;
    env.numel = env.nbytes = nbytes;
    MessageHeader h = transport::encode_header(env);
    h.flags = transport::kFrameOffer;
    return h;
  }
  void put_offer(const MessageHeader& h, const OfferDescriptor& d,
                 std::uint32_t length = transport::kOfferRecordLength) {
    std::byte bytes[transport::kOfferRecordLength];
    std::memcpy(bytes, &h, sizeof h);
    std::memcpy(bytes + sizeof h, &d, sizeof d);
    put_record(ring::RecordKind::Start, bytes, sizeof bytes, length);
  }
  // A Continuation record carrying `n` bytes (at most what fits the 4 KiB ring).
  void put_continuation(const std::byte* bytes, std::size_t n) {
    put_record(ring::RecordKind::Continuation, bytes, n, static_cast<std::uint32_t>(n));
  }
  void put_record(ring::RecordKind kind, const std::byte* bytes, std::size_t n,
                  std::uint32_t length) {
    ring::RecordHeader rec{};
    rec.length = length;
    rec.kind = static_cast<std::uint16_t>(kind);
    ring::copy_into_ring(data, mask, pos + 8, reinterpret_cast<const std::byte*>(&rec) + 8, 8);
    ring::copy_into_ring(data, mask, pos + 16, bytes, n);
    const std::uint64_t next = pos + ring::padded_record_size(n);
    ring::stamp_at(data, mask, next).store(0);
    ring::stamp_at(data, mask, pos).store(pos + 1, std::memory_order_release);
    pos = next;
  }
  // Streams `source` after an offer answered Streaming, draining between records (the ring
  // holds 4 KiB).
  void stream_source() {
    for (std::size_t at = 0; at < source.size(); at += 2048) {
      put_continuation(source.data() + at, std::min<std::size_t>(2048, source.size() - at));
      drain();
    }
  }
  void drain() {
    for (int i = 0; i < 4; ++i) {
      receiver.poll(handler, 0, true);
      receiver.flush();
    }
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(single_copy_offers)

BOOST_AUTO_TEST_CASE(an_offer_moves_the_bytes_with_one_record) {
  Pair p;
  const auto bytes = pattern(256 * 1024);  // four times the ring: it could not stream at once
  auto msg = message_of(bytes, 0);
  BOOST_TEST(p.sender.send_some(1, msg));
  BOOST_TEST(msg.started);
  BOOST_TEST(!msg.done());  // the receiver has not read it yet
  BOOST_TEST(p.state().load() == offer_word(1, OfferState::Offered));
  p.drain();
  BOOST_REQUIRE(p.handler.completed.size() == 1u);
  BOOST_TEST(std::memcmp(p.handler.buffers[0]->data(), bytes.data(), bytes.size()) == 0);
  BOOST_TEST(p.handler.guards_intact());
  // One record of header + descriptor, padded to 128 bytes: no payload went through the ring.
  BOOST_TEST(p.ring_tail() == ring::padded_record_size(transport::kOfferRecordLength));
  BOOST_TEST(p.state().load() == offer_word(1, OfferState::Done));
  BOOST_TEST(p.sender.send_some(1, msg));
  BOOST_TEST(msg.done());
  // Below the threshold, messages stream as before.
  const auto small = pattern(kThreshold - 1);
  auto small_msg = message_of(small, 0);
  p.sender.send_some(1, small_msg);
  BOOST_TEST(small_msg.done());
  p.drain();
  BOOST_REQUIRE(p.handler.completed.size() == 2u);
  BOOST_TEST(std::memcmp(p.handler.buffers[1]->data(), small.data(), small.size()) == 0);
}

BOOST_AUTO_TEST_CASE(a_revoked_offer_streams_its_bytes_instead) {
  Pair p;
  const auto bytes = pattern(100000);  // more than the 64 KiB ring: offered
  auto msg = message_of(bytes, 0);
  p.sender.send_some(1, msg);
  p.sender.release_outbound(1, msg);  // the send gives up before the receiver looked
  BOOST_TEST(p.state().load() == offer_word(1, OfferState::Revoked));
  BOOST_TEST(msg.offer == 0u);
  BOOST_TEST(!msg.done());
  // What the engine does next: stream the rest from a private copy.
  const std::vector<std::byte> copy(bytes);
  msg.next = copy.data();
  for (int i = 0; i < 16 && !msg.done(); ++i) {
    p.sender.send_some(1, msg);
    p.drain();
  }
  BOOST_TEST(msg.done());
  BOOST_REQUIRE(p.handler.completed.size() == 1u);
  BOOST_TEST(std::memcmp(p.handler.buffers[0]->data(), bytes.data(), bytes.size()) == 0);
  BOOST_TEST(p.handler.guards_intact());
  BOOST_TEST(p.state().load() == offer_word(1, OfferState::Streaming));  // acknowledged
  // The next large message is offered again.
  auto next = message_of(bytes, 0);
  p.sender.send_some(1, next);
  BOOST_TEST(p.state().load() == offer_word(2, OfferState::Offered));
  p.drain();
  p.sender.send_some(1, next);
  BOOST_TEST(next.done());
}

BOOST_AUTO_TEST_CASE(a_revoke_after_the_claim_waits_for_the_copy) {
  Pair p;
  const auto bytes = pattern(100000);
  auto msg = message_of(bytes, 0);
  p.sender.send_some(1, msg);
  p.drain();  // claimed and copied: Done
  p.sender.release_outbound(1, msg);
  BOOST_TEST(msg.done());
  BOOST_TEST(msg.offer == 0u);
}

BOOST_AUTO_TEST_CASE(an_unreachable_receiver_is_noticed_while_waiting) {
  Pair p;
  const auto bytes = pattern(100000);
  auto msg = message_of(bytes, 0);
  p.sender.send_some(1, msg);
  // A receiver that claimed and then vanished without finishing.
  p.state().store(offer_word(1, OfferState::Claimed));
  p.seg->rank_control(1).state.store(static_cast<std::uint32_t>(segment::RankState::Ended));
  p.sender.release_outbound(1, msg);  // returns: the receiver is gone
  BOOST_TEST(msg.offer == 0u);
}

BOOST_AUTO_TEST_CASE(a_valid_crafted_offer_is_taken) {
  CraftedOffers c;
  c.state().store(offer_word(5, OfferState::Offered));
  c.put_offer(c.header(c.source.size()), c.valid(5));
  c.drain();
  BOOST_REQUIRE(c.handler.completed.size() == 1u);
  BOOST_TEST(std::memcmp(c.handler.buffers[0]->data(), c.source.data(), c.source.size()) == 0);
  BOOST_TEST(c.state().load() == offer_word(5, OfferState::Done));
  // The same record again (a replay): the offer is closed.
  c.put_offer(c.header(c.source.size()), c.valid(5));
  peer_failure_says([&] { c.drain(); }, "a replayed or invented offer");
  BOOST_TEST(c.handler.guards_intact());
}

BOOST_AUTO_TEST_CASE(corrupt_descriptors_are_peer_failures) {
  struct Case {
    std::string what;
    std::function<void(CraftedOffers&)> write;
    std::string words;
  };
  const std::uint64_t n = 8192;
  const std::vector<Case> cases = {
      {"length mismatch",
       [&](CraftedOffers& c) {
         auto d = c.valid(1);
         d.length = n * 2;  // more than the header says: would overrun the receive buffer
         c.put_offer(c.header(n), d);
       },
       "it offers 16384 bytes for a message of 8192"},
      {"wrong pid",
       [&](CraftedOffers& c) {
         auto d = c.valid(1);
         d.pid = 1;
         c.put_offer(c.header(n), d);
       },
       "it names pid 1 but rank 0 is pid"},
      {"id zero", [&](CraftedOffers& c) { c.put_offer(c.header(n), c.valid(0)); }, "offer id 0"},
      {"id not in the state word",
       [&](CraftedOffers& c) { c.put_offer(c.header(n), c.valid(2)); },
       "offer #2 is not open"},
      {"no offer posted at all",
       [&](CraftedOffers& c) {
         c.state().store(0);
         c.put_offer(c.header(n), c.valid(1));
       },
       "a replayed or invented offer"},
      {"record too long",
       [&](CraftedOffers& c) { c.put_offer(c.header(n), c.valid(1), 200); },
       "an offer record of 200 bytes, expected 64"},
      {"wrapping address",
       [&](CraftedOffers& c) {
         auto d = c.valid(1);
         d.address = ~std::uint64_t{0} - 100;
         c.put_offer(c.header(n), d);
       },
       "wraps around"},
      {"unknown frame flags",
       [&](CraftedOffers& c) {
         auto h = c.header(n);
         h.flags = 2;
         c.put_offer(h, c.valid(1));
       },
       "frame flags 2, expected 0 or 1"},
  };
  for (const Case& k : cases) {
    BOOST_TEST_CONTEXT(k.what) {
      CraftedOffers c;
      c.state().store(offer_word(1, OfferState::Offered));
      k.write(c);
      peer_failure_says([&] { c.drain(); }, k.words);
      // Looking again says the same, without touching anything.
      peer_failure_says([&] { c.drain(); }, "rank 0");
      BOOST_TEST(c.handler.completed.empty());
      BOOST_TEST(c.handler.guards_intact());
    }
  }
}

// An address the copy cannot read (EFAULT: never mapped, partly unmapped, or memory such as
// memfd_secret that only its owner reads) from a sender that still runs: the receiver answers
// Streaming(id) without failing, and takes the bytes from the Continuations that follow.
BOOST_AUTO_TEST_CASE(an_unreadable_address_of_a_live_sender_is_streamed_instead) {
  const std::size_t page = 4096;
  void* mem = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  BOOST_REQUIRE(mem != MAP_FAILED);
  std::memset(mem, 0x5a, 2 * page);
  munmap(static_cast<char*>(mem) + page, page);  // the second half is gone: a partial read
  for (const std::uint64_t address : {std::uint64_t{4096}, std::uint64_t{reinterpret_cast<std::uintptr_t>(mem)}}) {
    BOOST_TEST_CONTEXT("address " << address) {
      CraftedOffers c;
      auto d = c.valid(1);
      d.address = address;  // 4096: the first pages are never mapped
      c.state().store(offer_word(1, OfferState::Offered));
      c.put_offer(c.header(c.source.size()), d);
      c.drain();  // no PeerFailure
      BOOST_TEST(c.state().load() == offer_word(1, OfferState::Streaming));
      BOOST_TEST(c.handler.completed.empty());
      c.stream_source();
      BOOST_REQUIRE(c.handler.completed.size() == 1u);
      BOOST_TEST(std::memcmp(c.handler.buffers[0]->data(), c.source.data(), c.source.size()) == 0);
      BOOST_TEST(c.handler.guards_intact());
    }
  }
  munmap(mem, page);
}

// The same from a sender that is gone: the offer fails, the receive is a PeerFailure.
BOOST_AUTO_TEST_CASE(an_unreadable_address_of_a_gone_sender_fails_the_offer_not_the_process) {
  CraftedOffers c;
  c.seg->rank_control(0).state.store(static_cast<std::uint32_t>(segment::RankState::Ended));
  auto d = c.valid(1);
  d.address = 4096;
  c.state().store(offer_word(1, OfferState::Offered));
  c.put_offer(c.header(c.source.size()), d);
  peer_failure_says([&] { c.drain(); }, "cannot read the 8192 bytes rank 0 offered at address 4096");
  BOOST_TEST(c.state().load() == offer_word(1, OfferState::Failed));
  BOOST_TEST(c.handler.completed.empty());
  BOOST_TEST(c.handler.guards_intact());
}

BOOST_AUTO_TEST_SUITE_END()
