// The fence announcement of the doorbell protocol (wait/fence.hpp, RankControl::heavy_fences):
// a rank says whether its arm() issues membarrier only once it holds its slot, so a second
// claimant of the same rank cannot change what the owner's notifiers rely on; and a send to
// an armed rank always rings its doorbell, whichever fence the sender chose.
#include <boost/test/unit_test.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <shmdist/errors.hpp>

#include "segment/segment.hpp"
#include "transport/shm_transport.hpp"
#include "wait/fence.hpp"

using namespace shmdist;

namespace {
std::shared_ptr<segment::Segment> fresh_segment() {
  return std::make_shared<segment::Segment>(segment::Segment::create_anonymous(2, 4096));
}

transport::OutboundMessage message_of(std::vector<std::byte>& bytes, int src) {
  transport::OutboundMessage m;
  m.env.src = src;
  m.env.dtype = DType::UInt8;
  m.env.numel = bytes.size();
  m.env.nbytes = bytes.size();
  m.next = bytes.data();
  return m;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(doorbell_fences)

BOOST_AUTO_TEST_CASE(a_rank_announces_heavy_fences_exactly_when_this_process_can_issue_them) {
  auto seg = fresh_segment();
  transport::ShmTransport rank0(seg, 0, true);
  const std::uint32_t expected = wait::register_asymmetric_fences() ? 1 : 0;
  BOOST_TEST(seg->rank_control(0).heavy_fences.load() == expected);
  BOOST_TEST(seg->rank_control(1).heavy_fences.load() == 0u);  // rank 1 has not joined
}

BOOST_AUTO_TEST_CASE(a_second_claimant_leaves_the_owners_announcement_alone) {
  auto seg = fresh_segment();
  transport::ShmTransport owner(seg, 0, true);
  seg->rank_control(0).heavy_fences.store(7);  // whatever the owner said
  bool refused = false;
  try {
    transport::ShmTransport duplicate(seg, 0, true);
  } catch (const SetupError& e) {
    refused = std::string(e.what()).find("already claimed") != std::string::npos;
  }
  BOOST_TEST(refused);
  BOOST_TEST(seg->rank_control(0).heavy_fences.load() == 7u);
}

// Rank 1 arms (as a receive about to sleep does); rank 0's send must bump rank 1's doorbell
// word, so that FUTEX_WAIT with the armed token returns. Small (the one-record fast path)
// and large (streamed records) messages, with the announcement as it is and with it cleared
// (a sender that must use the full fence).
BOOST_AUTO_TEST_CASE(a_send_to_an_armed_rank_rings_its_doorbell_whichever_fence_it_uses) {
  for (const bool announced : {true, false}) {
    for (const std::size_t size : {std::size_t{8}, std::size_t{3000}}) {
      BOOST_TEST_CONTEXT("announced " << announced << ", " << size << " bytes") {
        auto seg = fresh_segment();
        transport::ShmTransport rank0(seg, 0, true);
        transport::ShmTransport rank1(seg, 1, true);
        if (!announced) seg->rank_control(1).heavy_fences.store(0);
        const std::uint32_t token = rank1.waker()->arm();
        std::vector<std::byte> bytes(size, std::byte{5});
        auto msg = message_of(bytes, 0);
        BOOST_TEST(rank0.send_some(1, msg));
        BOOST_TEST(seg->rank_control(1).doorbell_seq.load() != token);
        rank1.waker()->disarm();
        // Not armed: no wake-up is owed, and none is made.
        const std::uint32_t now = seg->rank_control(1).doorbell_seq.load();
        auto again = message_of(bytes, 0);
        rank0.send_some(1, again);
        BOOST_TEST(seg->rank_control(1).doorbell_seq.load() == now);
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
