// The end of an engine through a fake transport: finalize's report of what was never received
// or matched, the operations and tasks it fails, abandon's report of unsent data, and the
// destructor failing whatever is still pending.
#include <boost/test/unit_test.hpp>

#include <sstream>

#include "engine_rig.hpp"

using namespace shmdist;
using namespace shmdist::test;
using namespace std::chrono_literals;

namespace {
void every_peer(Rig& rig, transport::PeerStatus status) {
  for (int p = 0; p < rig.wire->world; ++p)
    if (p != rig.wire->rank) rig.wire->peers[p].status = status;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(engine_finalize)

// One line per peer and kind, tags grouped by group (with its members when it is this rank's
// group of that number), incomplete messages counted; internal traffic is not reported.
BOOST_AUTO_TEST_CASE(finalize_reports_what_was_never_received_or_matched) {
  Rig rig(0, 3);
  rig.engine->register_group(1, 0xabc, {0, 1});
  rig.arrive(1, tensor({1, 2, 3}), user_key(2));
  rig.arrive(1, tensor({4, 5, 6}), user_key(1));
  rig.arrive(1, tensor({7}), user_key(5, 1, 0xabc));
  rig.arrive(1, tensor({8}), user_key(6, 2, 0x55));  // a group rank 0 never created
  rig.arrive(1, arange(100), user_key(9), 100);         // incomplete: 100 of 800 bytes
  rig.arrive(2, tensor({1}), {0, 0, 0, transport::kInternalChannel});
  Tensor t = zeros(1, kLong), u = zeros(1, kLong);
  Op from2 = rig.irecv(t, 2, user_key(3));
  Op any_on_group = rig.irecv(u, -1, user_key(4, 1, 0xabc));
  auto task = std::make_shared<ScriptedTask>();
  rig.engine->add_task(task);
  every_peer(rig, transport::PeerStatus::Finalized);

  std::ostringstream report;
  rig.engine->finalize(report);
  BOOST_TEST(report.str() ==
             "shmdist: rank 0: 1 posted receive from any source never matched a message (tag 4 "
             "on group #1 {0, 1})\n"
             "shmdist: rank 0: 5 messages from rank 1 arrived and were never received (tags 1, "
             "2, 9; tag 5 on group #1 {0, 1}; tag 6 on group #2 (which this rank never "
             "created), 864 bytes, 1 incomplete)\n"
             "shmdist: rank 0: 1 posted receive from rank 2 never matched a message (tag 3)\n");
  BOOST_TEST(rig.wire->finalized);
  const std::string gone = "the process group was destroyed while this operation was pending";
  BOOST_TEST(error_text(*from2) == gone);
  BOOST_TEST(error_text(*any_on_group) == gone);
  BOOST_REQUIRE(task->abandoned != nullptr);
  BOOST_TEST(rig.engine->pending_operations() == 0u);
  // A second finalize does nothing.
  std::ostringstream again;
  rig.engine->finalize(again);
  BOOST_TEST(again.str().empty());
}

// finalize waits for queued sends; when they cannot leave it says so after the timeout and
// fails them.
BOOST_AUTO_TEST_CASE(finalize_reports_sends_that_could_not_leave) {
  Rig rig(0, 2, 200ms);
  rig.wire->room[1] = 0;
  Op send = rig.engine->isend(tensor({1}), 1, user_key(0));
  every_peer(rig, transport::PeerStatus::Finalized);
  std::ostringstream report;
  rig.engine->finalize(report);
  BOOST_TEST(report.str() ==
             "shmdist: rank 0: destroy_process_group: timed out finishing this rank's pending "
             "sends\n");
  BOOST_TEST(contains(error_text(*send), "destroyed while this operation was pending"));
  BOOST_TEST(rig.wire->finalized);
}

// finalize waits until every peer has finalized or ended, taking in what they still send.
BOOST_AUTO_TEST_CASE(finalize_waits_for_the_peers) {
  Rig rig(0, 2, 200ms);  // rank 1 stays Running: finalize gives up after the timeout
  std::ostringstream report;
  rig.engine->finalize(report);
  BOOST_TEST(report.str() ==
             "shmdist: rank 0: destroy_process_group: timed out waiting for the other ranks to "
             "call destroy_process_group\n");
  Rig quiet(0, 2);
  quiet.wire->peers[1].status = transport::PeerStatus::Finalized;
  quiet.arrive(1, tensor({5}), user_key(7));
  std::ostringstream nothing_lost;
  quiet.engine->finalize(nothing_lost);
  BOOST_TEST(nothing_lost.str() ==
             "shmdist: rank 0: 1 message from rank 1 arrived and was never received (tag 7, 8 "
             "bytes)\n");
}

// abandon (no destroy_process_group) waits for no peer, fails what is pending and counts the
// sends that did not leave.
BOOST_AUTO_TEST_CASE(abandon_reports_unsent_data) {
  Rig rig(0, 2);
  rig.wire->room[1] = 0;
  Op send = rig.engine->isend(tensor({1}), 1, user_key(0));
  Op recv = rig.irecv(zeros(1, kLong), 1, user_key(0));
  std::ostringstream report;
  rig.engine->abandon(engine::Clock::duration::zero(), /*mark=*/true, report);
  BOOST_TEST(report.str() ==
             "shmdist: rank 0: 1 send not delivered: the process ended without "
             "destroy_process_group before the receiver took the data\n");
  BOOST_TEST(rig.wire->finalized);
  const std::string ended =
      "the process ended without destroy_process_group while this operation was pending";
  BOOST_TEST(error_text(*send) == ended);
  BOOST_TEST(error_text(*recv) == ended);
}

// The destructor fails posted receives, a receive a message streams into, queued sends and
// unfinished tasks; the Work handles outlive the engine.
BOOST_AUTO_TEST_CASE(the_destructor_fails_everything_pending) {
  Op posted, streaming, queued;
  auto task = std::make_shared<ScriptedTask>();
  {
    Rig rig(0, 3);
    rig.wire->room[2] = 0;
    posted = rig.irecv(zeros(1, kLong), 2, user_key(1));
    streaming = rig.irecv(zeros(100, kLong), 1, user_key(1));
    rig.arrive(1, arange(100), user_key(1), 8);
    queued = rig.engine->isend(tensor({1}), 2, user_key(1));
    rig.engine->add_task(task);
    rig.progress();
    BOOST_TEST(rig.engine->pending_operations() == 5u);  // with the rig's pump
  }
  const std::string gone = "the process group was destroyed while this operation was pending";
  BOOST_TEST(error_text(*posted) == gone);
  BOOST_TEST(error_text(*streaming) == gone);
  BOOST_TEST(error_text(*queued) == gone);
  BOOST_TEST((task->abandoned != nullptr));
}

BOOST_AUTO_TEST_SUITE_END()
