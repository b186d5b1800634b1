// Matching through a fake transport: posted receives in posting order, unexpected messages in
// arrival order, a receive withdrawn (before and during a stream), an unexpected message
// claimed while it still streams in, a receive whose bytes go to a consumer, and messages a
// transport cannot move while it writes them (MPI: release_inbound, abandon_inbound).
#include <boost/test/unit_test.hpp>

#include <functional>
#include <sstream>

#include "engine_rig.hpp"
#include "support/recording_consumer.hpp"

using namespace shmdist;
using namespace shmdist::test;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_SUITE(engine_matching)

// Messages go to the first posted receive that matches (posting order); an any-source receive
// posted first takes the earlier message; what no receive wants waits as unexpected.
BOOST_AUTO_TEST_CASE(posted_receives_match_in_posting_order) {
  Rig rig;
  Tensor a = zeros(1, kLong), b = zeros(1, kLong), c = zeros(1, kLong), d = zeros(1, kLong);
  Op any5 = rig.irecv(a, -1, user_key(5));
  Op from1_5 = rig.irecv(b, 1, user_key(5));
  Op from2_7 = rig.irecv(c, 2, user_key(7));
  rig.arrive(1, tensor({10}), user_key(5));
  rig.arrive(1, tensor({11}), user_key(5));
  rig.arrive(2, tensor({70}), user_key(7));
  rig.arrive(2, tensor({20}), user_key(5));
  rig.arrive(2, tensor({99}), {0, 0, 5, transport::kInternalChannel});  // another channel
  BOOST_TEST(rig.engine->test(*any5));
  BOOST_TEST(rig.engine->test(*from1_5));
  BOOST_TEST(rig.engine->test(*from2_7));
  BOOST_TEST(any5->source == 1);
  BOOST_TEST(a.data<std::int64_t>()[0] == 10);
  BOOST_TEST(from1_5->source == 1);
  BOOST_TEST(b.data<std::int64_t>()[0] == 11);
  BOOST_TEST(from2_7->source == 2);
  BOOST_TEST(c.data<std::int64_t>()[0] == 70);
  // Rank 2's tag-5 message waited as unexpected: a new receive takes it at once.
  Op late = rig.irecv(d, -1, user_key(5));
  BOOST_TEST(!late->pending());
  BOOST_TEST(late->source == 2);
  BOOST_TEST(d.data<std::int64_t>()[0] == 20);
  // The internal-channel message is still there for an internal receive, not a user one.
  Tensor e = zeros(1, kLong);
  Op user = rig.irecv(e, 2, user_key(5));
  BOOST_TEST(user->pending());
  Op internal = rig.irecv(e, 2, {0, 0, 5, transport::kInternalChannel});
  BOOST_TEST(!internal->pending());
  BOOST_TEST(e.data<std::int64_t>()[0] == 99);
}

// Unexpected messages are taken in arrival order, converted to the receiver's dtype; a count
// mismatch fails the receive and leaves the message queued for a receive of the right size.
BOOST_AUTO_TEST_CASE(unexpected_messages_in_arrival_order_with_conversion) {
  Rig rig;
  rig.arrive(1, tensor({7, 8, 9}), user_key(0));
  rig.arrive(1, tensor({1, 2, 3}), user_key(0));
  rig.progress();
  Tensor wrong = zeros(2, kFloat);
  Op mismatch = rig.irecv(wrong, 1, user_key(0));
  BOOST_TEST(!mismatch->pending());
  const std::string why = error_text(*mismatch);
  BOOST_TEST(contains(why, "recv expected 2 elements (torch.float32) but the message from rank 1 with "
                           "tag 0 has 3 elements (torch.int64, 24 bytes)"),
             why);
  Tensor first = zeros(3, kFloat), second = zeros(3, kLong);
  BOOST_TEST(rig.engine->recv(first, 1, user_key(0), rig.all) == 1);
  BOOST_TEST(first.equal(tensor({7.f, 8.f, 9.f})));
  BOOST_TEST(rig.engine->recv(second, -1, user_key(0), rig.all) == 1);
  BOOST_TEST(second.equal(tensor({1, 2, 3})));
}

// A blocking receive that times out is withdrawn: the message that comes later is not lost
// into it, it waits for the next receive.
BOOST_AUTO_TEST_CASE(a_receive_that_timed_out_is_withdrawn) {
  Rig rig(0, 3, 200ms);
  Tensor t = zeros(2, kLong);
  try {
    rig.engine->recv(t, 1, user_key(3), rig.all);
    BOOST_ERROR("recv returned without a message");
  } catch (const Timeout& e) {
    BOOST_TEST(contains(e.what(), "recv from rank 1 (tag 3, world group) on rank 0 timed out"),
               e.what());
  }
  // It published what it was blocked on while asleep, and cleared it.
  BOOST_REQUIRE(!rig.wire->blocked.empty());
  BOOST_TEST(rig.wire->blocked.back().op == engine::kBlockedRecv);
  BOOST_TEST(rig.wire->blocked.back().peer == 1);
  BOOST_TEST(rig.wire->blocked.back().tag == 3);
  BOOST_TEST(rig.wire->blocked_now == 0);
  BOOST_TEST(rig.engine->pending_operations() == 0u);
  rig.arrive(1, tensor({4, 5}), user_key(3));
  rig.progress();
  BOOST_TEST(t.equal(zeros(2, kLong)));  // the withdrawn receive's tensor was not written
  Tensor later = zeros(2, kLong);
  Op op = rig.irecv(later, 1, user_key(3));
  BOOST_TEST(!op->pending());
  BOOST_TEST(later.equal(tensor({4, 5})));
}

// A message streams into a blocking receive that then times out: what arrived so far moves
// back into an unexpected message, and the rest follows it there, so a later receive gets
// every byte in order.
BOOST_AUTO_TEST_CASE(a_receive_withdrawn_mid_stream_loses_no_byte) {
  Rig rig(0, 3, 200ms);
  const Tensor sent = arange(1000);
  rig.arrive(1, sent, user_key(2), 800);
  Tensor t = zeros(1000, kLong);
  BOOST_CHECK_THROW(rig.engine->recv(t, 1, user_key(2), rig.all), Timeout);
  BOOST_TEST(rig.wire->consumed_of(1) == 800u);  // the stream had started into the receive
  rig.wire->allow_all(1);
  Tensor later = zeros(1000, kLong);
  Op op = rig.irecv(later, 1, user_key(2));
  BOOST_TEST(rig.engine->test(*op));
  BOOST_TEST(later.equal(sent));
}

// The same, but another receive for the message was posted while the first one waited: on
// withdrawal it takes the stream over (posting order), with the bytes that arrived so far.
BOOST_AUTO_TEST_CASE(a_receive_withdrawn_mid_stream_hands_over_to_the_next_posted) {
  Rig rig(0, 3, 200ms);
  const Tensor sent = arange(1000);
  rig.arrive(1, sent, user_key(2), 800);
  Tensor next_tensor = zeros(1000, kFloat64);  // another dtype: converted at the end
  Op next;
  auto poster = std::make_shared<ScriptedTask>();
  poster->on_advance = [&] {  // runs in the engine's progress, during the blocking recv
    if (!next && rig.wire->consumed_of(1) > 0) next = rig.irecv(next_tensor, -1, user_key(2));
  };
  rig.engine->add_task(poster);
  Tensor t = zeros(1000, kLong);
  BOOST_CHECK_THROW(rig.engine->recv(t, 1, user_key(2), rig.all), Timeout);
  BOOST_REQUIRE(next);
  BOOST_TEST(next->pending());
  rig.wire->allow_all(1);
  BOOST_TEST(rig.engine->test(*next));
  BOOST_TEST(next->source == 1);
  BOOST_TEST(next_tensor.equal(sent.to(kFloat64)));
}

// A receive posted while its message is still streaming in as unexpected claims it: the bytes
// so far move into its tensor and the rest streams there directly (or, for another dtype,
// into the staging buffer, converted at the end).
BOOST_AUTO_TEST_CASE(a_receive_claims_a_message_mid_stream) {
  for (const DType dtype : {kLong, kFloat64}) {
    BOOST_TEST_CONTEXT(dtype_name(dtype)) {
      Rig rig;
      const Tensor sent = arange(1000);
      rig.arrive(1, sent, user_key(6), 804);  // not a whole element either
      rig.progress();
      BOOST_TEST(rig.wire->consumed_of(1) == 804u);
      Tensor t = zeros(1000, dtype);
      Op op = rig.irecv(t, 1, user_key(6));
      BOOST_TEST(op->pending());
      rig.wire->allow(1, 4000);
      BOOST_TEST(!rig.engine->test(*op));
      rig.wire->allow_all(1);
      BOOST_TEST(rig.engine->test(*op));
      BOOST_TEST(t.equal(sent.to(dtype)));
    }
  }
}

// Pins the message streaming in from rank 1 (as MPI does once it matched a piece) as soon as
// its first bytes landed, from a task that runs in the engine's progress (during a blocking
// receive); `then` runs once, at that moment.
static void pin_once_started(Rig& rig, std::function<void()> then = {}) {
  auto pinner = std::make_shared<ScriptedTask>();
  pinner->on_advance = [&rig, then, done = false]() mutable {
    if (done || rig.wire->consumed_of(1) == 0) return;
    rig.wire->pin(1);
    if (then) then();
    done = true;
  };
  rig.engine->add_task(pinner);
}

// A transport that cannot stop writing a message where it writes it (MPI, once it matched a
// payload's piece: release_inbound says false) keeps its sink's memory: a receive that claims
// the message mid-stream gets it through the unexpected buffer, copied when it is whole.
BOOST_AUTO_TEST_CASE(a_receive_claims_a_pinned_message_through_its_buffer) {
  Rig rig;
  const Tensor sent = arange(1000);
  rig.arrive(1, sent, user_key(6), 800);
  rig.progress();
  rig.wire->pin(1);
  Tensor t = zeros(1000, kLong);
  Op op = rig.irecv(t, 1, user_key(6));
  BOOST_TEST(op->pending());
  rig.wire->allow_all(1);
  BOOST_TEST(rig.engine->test(*op));
  BOOST_TEST(!rig.wire->repointed_while_pinned);
  BOOST_TEST(t.equal(sent));
}

// A blocking receive times out while its message is pinned in its tensor: the receive waits
// until the transport can stop (up to one more timeout) instead of leaving bytes to land in
// memory its caller gets back; then, as for any withdrawn receive, the message goes back to
// being unexpected and a later receive gets every byte.
BOOST_AUTO_TEST_CASE(a_receive_that_times_out_while_pinned_waits_until_it_is_released) {
  Rig rig(0, 3, 200ms);
  const Tensor sent = arange(1000);
  rig.arrive(1, sent, user_key(2), 800);
  pin_once_started(rig);
  int asked = 0;
  rig.wire->on_release = [&](int src) {  // MPI lets go at the 100th look
    if (src == 1 && rig.wire->pinned_dest[1] && ++asked == 100) rig.wire->unpin(1);
  };
  Tensor t = zeros(1000, kLong);
  BOOST_CHECK_THROW(rig.engine->recv(t, 1, user_key(2), rig.all), Timeout);
  BOOST_TEST(asked == 100);  // it asked until the transport let go
  BOOST_TEST(!rig.wire->repointed_while_pinned);
  BOOST_TEST(rig.wire->abandoned.empty());
  rig.wire->allow_all(1);
  Tensor later = zeros(1000, kLong);
  Op op = rig.irecv(later, 1, user_key(2));
  BOOST_TEST(rig.engine->test(*op));
  BOOST_TEST(later.equal(sent));
}

// ... and when the transport cannot let go within that second timeout either, the message is
// given up (abandon_inbound, with the tensor's storage to keep alive while the transport may
// still write there) and the receive raises PeerFailure naming the sender.
BOOST_AUTO_TEST_CASE(a_receive_pinned_by_a_sender_that_stalls_raises_peer_failure) {
  Rig rig(0, 3, 200ms);
  const Tensor sent = arange(1000);
  rig.arrive(1, sent, user_key(2), 800);
  pin_once_started(rig);
  Tensor t = zeros(1000, kLong);
  try {
    rig.engine->recv(t, 1, user_key(2), rig.all);
    BOOST_FAIL("a receive whose message never completed returned");
  } catch (const PeerFailure& e) {
    BOOST_TEST(std::string(e.what()).find("rank 1 stopped sending a 8000-byte message midway") !=
                   std::string::npos,
               e.what());
  }
  BOOST_TEST(rig.wire->abandoned == std::vector<int>{1}, boost::test_tools::per_element());
  BOOST_TEST((rig.wire->kept.at(0) == t.storage_handle()));
  BOOST_TEST(!rig.wire->repointed_while_pinned);
}

// A receive whose wait fails (here a peer died) while its message is pinned in its tensor
// gives the message up at once, with the tensor's storage to keep, and raises that failure:
// no wait for a sender that may be gone.
BOOST_AUTO_TEST_CASE(a_receive_whose_wait_fails_while_pinned_gives_the_message_up_at_once) {
  Rig rig(0, 3, std::chrono::hours(1));
  const Tensor sent = arange(1000);
  rig.arrive(1, sent, user_key(2), 800);
  pin_once_started(rig, [&] {
    rig.wire->peers[2] = {transport::PeerStatus::Gone, false, "rank 2 (pid 7) was killed"};
  });
  Tensor t = zeros(1000, kLong);
  try {
    rig.engine->recv(t, 1, user_key(2), rig.all);
    BOOST_FAIL("a receive whose wait failed returned");
  } catch (const PeerFailure& e) {
    BOOST_TEST(std::string(e.what()).find("rank 2 (pid 7) was killed") != std::string::npos,
               e.what());
  }
  BOOST_TEST(rig.wire->abandoned == std::vector<int>{1}, boost::test_tools::per_element());
  BOOST_TEST((rig.wire->kept.at(0) == t.storage_handle()));
  BOOST_TEST(!rig.wire->repointed_while_pinned);
  // The message given up is no one's: not put back as unexpected, where a later receive
  // would take a message whose bytes land elsewhere (the fake, unlike MPI, even finishes it).
  rig.wire->allow_all(1);
  rig.progress();
  for (transport::PeerState& p : rig.wire->peers) p.status = transport::PeerStatus::Finalized;
  std::ostringstream report;
  rig.engine->finalize(report);
  BOOST_TEST(report.str().find("from rank 1") == std::string::npos, report.str());
}

// A zero-byte message matches like any other.
BOOST_AUTO_TEST_CASE(empty_messages_match) {
  Rig rig;
  Op op = rig.irecv(zeros(0, kLong), 2, user_key(1));
  rig.arrive(2, zeros(0, kLong), user_key(1));
  BOOST_TEST(rig.engine->test(*op));
  BOOST_TEST(op->source == 2);
}

// The direct path (a blocking receive taking its message straight from the transport) is
// closed only by what this receive might have to take first: a posted receive, or an
// unexpected message from the same source. An unexpected message from another source (in a
// job across hosts, a remote bystander's early barrier message) leaves it open, and still
// goes, in order, to the receive that wants it.
BOOST_AUTO_TEST_CASE(the_direct_path_ignores_other_sources_unexpected_messages) {
  Rig rig;
  // Rank 2's tag-7 message becomes unexpected while an irecv takes its tag-5 one; then
  // nothing is posted and only rank 2 has an unexpected message.
  rig.arrive(2, tensor({70}), user_key(7));
  rig.arrive(2, tensor({50}), user_key(5));
  Tensor t5 = zeros(1, kLong);
  Op from2 = rig.irecv(t5, 2, user_key(5));
  BOOST_TEST(rig.engine->test(*from2));
  BOOST_TEST(t5.data<std::int64_t>()[0] == 50);
  rig.wire->direct = true;

  // A receive from rank 1 takes rank 1's message directly.
  rig.arrive(1, tensor({10}), user_key(7));
  Tensor a = zeros(1, kLong);
  BOOST_TEST(rig.engine->recv(a, 1, user_key(7), rig.all) == 1);
  BOOST_TEST(a.data<std::int64_t>()[0] == 10);
  BOOST_TEST(rig.wire->direct_receives == 1);

  // A receive from rank 2 with the same key takes the unexpected message first, not the
  // newer one waiting in the transport; that one is the next receive's.
  rig.arrive(2, tensor({71}), user_key(7));
  Tensor b = zeros(1, kLong), c = zeros(1, kLong);
  BOOST_TEST(rig.engine->recv(b, 2, user_key(7), rig.all) == 2);
  BOOST_TEST(b.data<std::int64_t>()[0] == 70);
  BOOST_TEST(rig.wire->direct_receives == 1);
  BOOST_TEST(rig.engine->recv(c, 2, user_key(7), rig.all) == 2);
  BOOST_TEST(c.data<std::int64_t>()[0] == 71);
  BOOST_TEST(rig.wire->direct_receives == 2);

  // An unexpected message from rank 1 on another tag closes the direct path for rank 1 (the
  // general path delivers), not for rank 2.
  rig.wire->direct = false;
  rig.arrive(1, tensor({19}), user_key(9));
  rig.arrive(1, tensor({11}), user_key(7));
  Tensor d = zeros(1, kLong);
  BOOST_TEST(rig.engine->recv(d, 1, user_key(7), rig.all) == 1);  // rank 1's tag 9 is queued
  BOOST_TEST(d.data<std::int64_t>()[0] == 11);
  rig.wire->direct = true;
  rig.arrive(1, tensor({12}), user_key(7));
  rig.arrive(2, tensor({72}), user_key(7));
  Tensor e = zeros(1, kLong), f = zeros(1, kLong), g = zeros(1, kLong);
  BOOST_TEST(rig.engine->recv(f, 2, user_key(7), rig.all) == 2);
  BOOST_TEST(f.data<std::int64_t>()[0] == 72);
  BOOST_TEST(rig.wire->direct_receives == 3);
  BOOST_TEST(rig.engine->recv(e, 1, user_key(7), rig.all) == 1);
  BOOST_TEST(e.data<std::int64_t>()[0] == 12);
  BOOST_TEST(rig.wire->direct_receives == 3);
  BOOST_TEST(rig.engine->recv(g, 1, user_key(9), rig.all) == 1);
  BOOST_TEST(g.data<std::int64_t>()[0] == 19);
}

// A receive with a consumer hands it every byte of its message once, in order, on every way
// a message reaches a receive: posted before it arrives, waiting whole as unexpected, claimed
// while it still streams in (804 bytes: not a whole element), and converted from another
// dtype; with the bytes handed over from the transport's memory (the rings: the receive's
// tensor is never written) or landed in the tensor first (MPI).
BOOST_AUTO_TEST_CASE(a_consumer_gets_every_byte_once_in_order) {
  const Tensor sent = arange(1000);
  for (const bool land_first : {false, true}) {
    for (const std::string way : {"posted", "unexpected", "claimed", "converted"}) {
      BOOST_TEST_CONTEXT((land_first ? "landed first, " : "from the wire, ") << way) {
        Rig rig;
        rig.wire->land_first = land_first;
        const DType dtype = way == "converted" ? kFloat64 : kLong;
        Tensor landing = zeros(1000, dtype);
        auto recorder = std::make_shared<RecordingConsumer>();
        Op op;
        auto post = [&] { op = rig.engine->irecv(landing, 1, user_key(4), rig.all, false, recorder); };
        if (way == "posted" || way == "converted") {
          post();
          rig.arrive(1, sent, user_key(4), 804);
          BOOST_TEST(!rig.engine->test(*op));
        } else {
          rig.arrive(1, sent, user_key(4), way == "claimed" ? 804 : ~std::uint64_t{0});
          rig.progress();
          post();
        }
        rig.wire->allow_all(1);
        BOOST_TEST(rig.engine->test(*op));
        BOOST_TEST(op->source == 1);
        BOOST_TEST(recorder->in_order);
        BOOST_TEST((recorder->bytes == bytes_of(sent.to(dtype))));
        if (!land_first && way == "posted") BOOST_TEST(landing.equal(zeros(1000, kLong)));
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
