// Ring positions written by a corrupting peer (issue 12, finding 1): a joining rank never
// starts a ring at a position read from shared memory, and refuses a segment in which the
// positions it owns are not 0; a producer refuses a consumer's published tail that cannot be.
// Before the fix, 4088 in the 1->0 ring's head and tail of a 4 KiB ring made an 8-byte send
// write 40 bytes past the ring and the consumer read a record length from beyond it.
#include <boost/test/unit_test.hpp>
#include <fstream>
#include <sstream>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include <shmdist/errors.hpp>

#include "ring/ring.hpp"
#include "segment/segment.hpp"
#include "transport/shm_transport.hpp"

using namespace shmdist;

namespace {

template <class E>
void expect_error(const std::function<void()>& f, const std::string& words) {
  try {
    f();
  } catch (const E& e) {
    BOOST_TEST_INFO("message: " << e.what());
    BOOST_TEST(std::string(e.what()).find(words) != std::string::npos);
    return;
  }
  BOOST_ERROR("no exception of the expected type (expected one saying '" << words << "')");
}

std::shared_ptr<segment::Segment> fresh_segment() {
  return std::make_shared<segment::Segment>(segment::Segment::create_anonymous(2, 4096));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(hostile_rings)

// The reproduction of the issue: rank 1 joined, then wrote 4088 into the 1->0 ring's fields.
BOOST_AUTO_TEST_CASE(a_consumer_refuses_a_ring_whose_positions_a_peer_moved) {
  auto seg = fresh_segment();
  transport::ShmTransport corrupt_peer(seg, 1, /*supervised=*/true);
  seg->ring_control(1, 0).head_hint.store(4088);
  seg->ring_control(1, 0).tail.store(4088);
  expect_error<SetupError>([&] { transport::ShmTransport rank0(seg, 0, true); },
                           "the ring from rank 1 to rank 0 has tail 4088 before rank 0 joined");
  // Refused before claiming the slot: rank 0 is still free.
  BOOST_TEST(seg->rank_control(0).state.load() == 0u);
}

BOOST_AUTO_TEST_CASE(a_producer_refuses_positions_it_owns_that_someone_else_wrote) {
  {
    auto seg = fresh_segment();
    seg->ring_control(1, 0).head_hint.store(4088);
    expect_error<SetupError>([&] { transport::ShmTransport rank1(seg, 1, true); },
                             "the ring from rank 1 to rank 0 has head 4088 before rank 1 joined");
  }
  {
    auto seg = fresh_segment();
    seg->ring_control(0, 1).tail.store(64);  // rank 1 consumed what rank 0 never sent
    expect_error<SetupError>([&] { transport::ShmTransport rank0(seg, 0, true); },
                             "the ring from rank 0 to rank 1 has tail 64 before rank 0 joined");
  }
  {
    auto seg = fresh_segment();
    seg->ring_control(0, 1).offer_state.store(11);  // "offer #1 done" before any offer
    expect_error<SetupError>(
        [&] { transport::ShmTransport rank0(seg, 0, true); },
        "the ring from rank 0 to rank 1 has single-copy offer word 11 before rank 0 joined");
  }
}

// Positions are private: a joining rank starts at 0 even where the shared field it never
// owned (the head hint of a ring into it) says otherwise, and receives what was sent.
BOOST_AUTO_TEST_CASE(a_message_sent_before_the_receiver_joined_is_received) {
  auto seg = fresh_segment();
  transport::ShmTransport rank0(seg, 0, true);
  std::vector<std::byte> bytes(8, std::byte{7});
  transport::OutboundMessage msg;
  msg.env.nbytes = bytes.size();
  msg.env.numel = bytes.size();
  msg.next = bytes.data();
  BOOST_REQUIRE(rank0.send_some(1, msg));
  BOOST_TEST(seg->ring_control(0, 1).head_hint.load() == 64u);
  transport::ShmTransport rank1(seg, 1, true);
  BOOST_TEST(rank1.inbound_pending(0));
}

// The only shared index a ring side reads while running: the consumer's published tail.
BOOST_AUTO_TEST_CASE(a_producer_refuses_an_impossible_tail) {
  struct Case {
    std::string what;
    std::uint64_t tail;
  };
  // Records of 1000 payload bytes take 1024 bytes. Four go through with the consumer keeping
  // up (tail = head = 4096), three more stay unread (head 7168): the legal tails are then the
  // multiples of 64 from 3072 to 7168.
  const std::vector<Case> cases = {{"ahead of the head", 7168 + 64},
                                   {"far ahead", ~std::uint64_t{63}},
                                   {"not on the record grid", 4096 + 8},
                                   {"more than a ring behind", 2048}};
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      segment::RingControl control{};
      std::vector<std::byte> data(4096);
      ring::RingProducer producer(&control, data.data(), data.size(), 3, 5);
      const std::vector<std::byte> payload(1000, std::byte{1});
      for (int i = 0; i < 7; ++i) {
        BOOST_REQUIRE(producer.writable(payload.size()) == payload.size());
        producer.publish(ring::RecordKind::Continuation, {}, payload);
        if (i < 4) control.tail.store(std::uint64_t(i + 1) * 1024);
      }
      control.tail.store(c.tail);  // the ring looks full: writable() reloads the tail
      expect_error<PeerFailure>([&] { producer.writable(payload.size()); },
                                "corrupt ring from rank 3 to rank 5: rank 5 published a "
                                "consumed position (tail) of " +
                                    std::to_string(c.tail));
    }
  }
  // And a legal one is taken: everything consumed.
  segment::RingControl control{};
  std::vector<std::byte> data(4096);
  ring::RingProducer producer(&control, data.data(), data.size(), 3, 5);
  const std::vector<std::byte> payload(1000, std::byte{1});
  for (int i = 0; i < 3; ++i) producer.publish(ring::RecordKind::Continuation, {}, payload);
  control.tail.store(3072);
  BOOST_TEST(producer.writable(payload.size()) == payload.size());
}

// A guard page follows every segment mapping, so that a read or write past the segment's
// last area faults at once instead of reaching a neighbouring mapping (the fuzz target also
// makes the area after its ring inaccessible, so that it sees reads past a ring).
// Checked in /proc/self/maps (a faulting read would be reported, not signalled, under ASan).
BOOST_AUTO_TEST_CASE(a_guard_page_follows_the_segment) {
  auto seg = fresh_segment();
  const auto end = reinterpret_cast<std::uintptr_t>(&seg->header()) + seg->geometry().total_size;
  std::ifstream maps("/proc/self/maps");
  std::string line, perms;
  while (std::getline(maps, line)) {
    std::istringstream fields(line);
    std::string range;
    fields >> range >> perms;
    const auto dash = range.find('-');
    const auto lo = std::stoull(range.substr(0, dash), nullptr, 16);
    const auto hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (lo <= end && end < hi) break;
    perms.clear();
  }
  BOOST_TEST(perms.substr(0, 3) == "---", "the page after the segment is mapped '" << perms << "'");
}

BOOST_AUTO_TEST_SUITE_END()
