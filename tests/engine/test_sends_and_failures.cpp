// Sends through a fake transport (FIFO per destination, a blocking send withdrawn before and
// after its first bytes left) and how failures reach the operations: a dead peer, a finalized
// one, an aborted job, a group disagreement.
#include <boost/test/unit_test.hpp>

#include "engine_rig.hpp"

using namespace shmdist;
using namespace shmdist::test;
using namespace std::chrono_literals;

namespace {
Tensor as_tensor(const FakeWire::Outbound& m) {
  Tensor t = zeros(static_cast<std::int64_t>(m.env.numel), m.env.dtype);
  if (!m.bytes.empty()) std::memcpy(t.data_ptr(), m.bytes.data(), m.bytes.size());
  return t;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(engine_sends)

// Sends to one destination leave in call order, as far as the destination takes them.
BOOST_AUTO_TEST_CASE(sends_leave_in_call_order) {
  Rig rig;
  rig.wire->room[1] = 20;
  Op first = rig.engine->isend(arange(4), 1, user_key(1));    // 32 bytes: 20 leave now
  Op second = rig.engine->isend(tensor({7}), 1, user_key(2));  // queued behind it
  Op other = rig.engine->isend(tensor({5}), 2, user_key(1));   // another destination
  BOOST_TEST(first->pending());
  BOOST_TEST(second->pending());
  BOOST_TEST(!other->pending());
  BOOST_REQUIRE(rig.wire->outbound[1].size() == 1u);
  BOOST_TEST(rig.wire->outbound[1][0].bytes.size() == 20u);
  rig.wire->room[1] = ~std::uint64_t{0};
  BOOST_TEST(rig.engine->test(*second));
  BOOST_TEST(!first->pending());
  BOOST_REQUIRE(rig.wire->outbound[1].size() == 2u);
  BOOST_TEST(as_tensor(rig.wire->outbound[1][0]).equal(arange(4)));
  BOOST_TEST(rig.wire->outbound[1][0].env.key.tag == 1);
  BOOST_TEST(as_tensor(rig.wire->outbound[1][1]).equal(tensor({7})));
  BOOST_TEST(rig.wire->outbound[1][1].env.src == 0);
}

// An isend that leaves whole at once builds no operation: every such Work refers, without
// owning it, to one shared operation that is never pending (a send, done).
BOOST_AUTO_TEST_CASE(an_isend_that_leaves_whole_shares_one_completed_operation) {
  Rig rig;
  Op a = rig.engine->isend(tensor({1}), 1, user_key(1));
  Op b = rig.engine->isend(arange(3), 2, user_key(2));
  BOOST_REQUIRE(a);
  BOOST_TEST(a.get() == b.get());
  BOOST_TEST(a.use_count() == 0);  // no control block: nothing allocated, nothing counted
  BOOST_TEST((a->status == detail::Operation::Status::Done));
  BOOST_TEST((a->kind == detail::Operation::Kind::Send));
  BOOST_TEST(rig.engine->wait(*a, std::nullopt));
  BOOST_TEST(rig.engine->pending_operations() == 0u);
  BOOST_REQUIRE(rig.wire->outbound[1].size() == 1u);
  BOOST_TEST(as_tensor(rig.wire->outbound[1][0]).equal(tensor({1})));
  BOOST_REQUIRE(rig.wire->outbound[2].size() == 1u);
  BOOST_TEST(as_tensor(rig.wire->outbound[2][0]).equal(arange(3)));
  // One that cannot leave whole gets an operation of its own, and stays in order.
  rig.wire->room[1] = 4;
  Op c = rig.engine->isend(arange(2), 1, user_key(3));
  Op d = rig.engine->isend(tensor({5}), 1, user_key(4));
  BOOST_TEST(c->pending());
  BOOST_TEST(d->pending());
  BOOST_TEST(c.get() != a.get());
  rig.wire->room[1] = ~std::uint64_t{0};
  BOOST_TEST(rig.engine->wait(*d, std::nullopt));
  BOOST_TEST(!c->pending());
  BOOST_REQUIRE(rig.wire->outbound[1].size() == 3u);
  BOOST_TEST(as_tensor(rig.wire->outbound[1][1]).equal(arange(2)));
  BOOST_TEST(as_tensor(rig.wire->outbound[1][2]).equal(tensor({5})));
}

// A pending isend or irecv keeps its tensor's storage alive after the caller dropped every
// handle to the tensor (under AddressSanitizer a storage freed too early is a report).
BOOST_AUTO_TEST_CASE(pending_operations_keep_the_storage_alive) {
  Rig rig;
  rig.wire->room[1] = 0;
  Op send, recv;
  {
    Tensor out = arange(4);
    Tensor in = zeros(3, kLong);
    send = rig.engine->isend(out, 1, user_key(1));
    recv = rig.irecv(in, 2, user_key(2));
  }  // the only handles to both tensors are gone
  BOOST_TEST(send->pending());
  BOOST_TEST(recv->pending());
  rig.wire->room[1] = ~std::uint64_t{0};
  rig.arrive(2, tensor({7, 8, 9}), user_key(2));
  BOOST_TEST(rig.engine->wait(*send, std::nullopt));
  BOOST_TEST(rig.engine->wait(*recv, std::nullopt));
  BOOST_REQUIRE(rig.wire->outbound[1].size() == 1u);
  BOOST_TEST(as_tensor(rig.wire->outbound[1][0]).equal(arange(4)));
  const auto* got = reinterpret_cast<const std::int64_t*>(recv->view.data);
  BOOST_TEST(got[0] == 7);
  BOOST_TEST(got[2] == 9);
}

// A blocking send that times out before its first byte left is dropped: nothing of it
// leaves later.
BOOST_AUTO_TEST_CASE(a_send_withdrawn_before_it_started_is_dropped) {
  Rig rig(0, 3, 200ms);
  rig.wire->room[1] = 0;
  try {
    rig.engine->send(tensor({1, 2, 3}), 1, user_key(4));
    BOOST_ERROR("send returned although the destination takes nothing");
  } catch (const Timeout& e) {
    BOOST_TEST(contains(e.what(), "send to rank 1 (tag 4, world group) on rank 0 timed out"),
               e.what());
    BOOST_TEST(contains(e.what(), "the receiver has not taken the data"), e.what());
  }
  BOOST_TEST(rig.engine->pending_operations() == 0u);
  rig.wire->room[1] = ~std::uint64_t{0};
  Op after = rig.engine->isend(tensor({9}), 1, user_key(4));
  BOOST_TEST(!after->pending());
  BOOST_REQUIRE(rig.wire->outbound[1].size() == 1u);
  BOOST_TEST(as_tensor(rig.wire->outbound[1][0]).equal(tensor({9})));
}

// A blocking send that times out after its first bytes left is finished in the background
// from a private copy (the caller's tensor may change at once): the receiver, already in
// the middle of it, gets the original bytes, and later sends follow it.
BOOST_AUTO_TEST_CASE(a_send_withdrawn_mid_stream_is_finished_from_a_copy) {
  Rig rig(0, 3, 200ms);
  rig.wire->room[1] = 16;
  Tensor data = arange(10);
  BOOST_CHECK_THROW(rig.engine->send(data, 1, user_key(4)), Timeout);
  BOOST_REQUIRE(rig.wire->outbound[1].size() == 1u);
  BOOST_TEST(rig.wire->outbound[1][0].bytes.size() == 16u);
  BOOST_TEST(rig.engine->pending_operations() == 1u);  // the copy, queued
  data.copy_(zeros(10, kLong));                         // the caller reuses its tensor
  rig.wire->room[1] = ~std::uint64_t{0};
  Op after = rig.engine->isend(tensor({42}), 1, user_key(5));
  BOOST_TEST(rig.engine->test(*after));
  BOOST_TEST(rig.engine->pending_operations() == 0u);
  BOOST_REQUIRE(rig.wire->outbound[1].size() == 2u);
  BOOST_TEST(as_tensor(rig.wire->outbound[1][0]).equal(arange(10)));
  BOOST_TEST(as_tensor(rig.wire->outbound[1][1]).equal(tensor({42})));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(engine_failures)

// A peer that died aborts the job: the waiting call throws PeerFailure naming it, the
// transport is told (so every rank learns it), and later waits fail at once.
BOOST_AUTO_TEST_CASE(a_dead_peer_fails_the_wait_and_the_job) {
  Rig rig;
  rig.wire->peers[2] = {transport::PeerStatus::Gone, false,
                        "rank 2 (pid 7) was killed by signal 9 (SIGKILL)"};
  Tensor t = zeros(1, kLong);
  try {
    rig.engine->recv(t, 1, user_key(0), rig.all);  // waits for rank 1, which is fine
    BOOST_ERROR("recv returned");
  } catch (const PeerFailure& e) {
    BOOST_TEST(contains(e.what(), "rank 2 (pid 7) was killed by signal 9 (SIGKILL)"), e.what());
  }
  BOOST_TEST(rig.wire->reported_failures == std::vector<int>{2});
  Op op = rig.irecv(t, 1, user_key(0));
  BOOST_CHECK_THROW(rig.engine->wait(*op, std::nullopt), PeerFailure);
  // A peer that exited cleanly (code 0) is no failure of the job.
  Rig clean;
  clean.wire->peers[2] = {transport::PeerStatus::Gone, true, "rank 2 (pid 8) exited with code 0"};
  clean.arrive(1, tensor({3}), user_key(0));
  BOOST_TEST(clean.engine->recv(t, 1, user_key(0), clean.all) == 1);
  BOOST_TEST(clean.wire->reported_failures.empty());
}

// A receive that only a finalized peer could satisfy fails once nothing of that peer is left
// in the stream, not before.
BOOST_AUTO_TEST_CASE(a_finalized_peer_fails_receives_only_it_could_satisfy) {
  Rig rig;
  rig.wire->peers[1].status = transport::PeerStatus::Finalized;
  rig.arrive(1, tensor({8}), user_key(0));
  Tensor t = zeros(1, kLong);
  BOOST_TEST(rig.engine->recv(t, 1, user_key(0), rig.all) == 1);  // what it sent is received
  try {
    rig.engine->recv(t, 1, user_key(0), rig.all);
    BOOST_ERROR("recv returned");
  } catch (const PeerFailure& e) {
    BOOST_TEST(contains(e.what(), "rank 1 has finalized (destroy_process_group) or exited, and "
                                  "will send nothing more; recv from rank 1 (tag 0, world "
                                  "group) on rank 0 can never complete"),
               e.what());
  }
  rig.wire->peers[2].status = transport::PeerStatus::Finalized;
  BOOST_CHECK_THROW(rig.engine->recv(t, -1, user_key(0), rig.all), PeerFailure);
  BOOST_TEST(rig.wire->reported_failures.empty());
}

// An aborted job fails every wait with the transport's account of the failure.
BOOST_AUTO_TEST_CASE(an_aborted_job_fails_waits) {
  Rig rig;
  rig.wire->job_aborted = true;
  rig.wire->job_failure = "rank 1 (pid 9) exited with code 3";
  Op op = rig.engine->isend(tensor({1}), 1, user_key(0));  // room: it leaves at once
  BOOST_TEST(!op->pending());
  Tensor t = zeros(1, kLong);
  Op recv = rig.irecv(t, 1, user_key(0));
  try {
    rig.engine->wait(*recv, std::nullopt);
    BOOST_ERROR("wait returned");
  } catch (const PeerFailure& e) {
    BOOST_TEST(std::string(e.what()) == "rank 1 (pid 9) exited with code 3");
  }
  BOOST_TEST(recv->pending());  // the operation stays posted; only the wait failed
}

// A message on a group this rank knows with other members proves the ranks disagree about
// the groups: pending receives on groups fail with the disagreement, world receives do not.
BOOST_AUTO_TEST_CASE(a_group_disagreement_fails_group_receives) {
  Rig rig;
  rig.engine->register_group(1, 0xabc, {0, 1});
  Tensor t = zeros(1, kLong);
  Op on_group = rig.irecv(t, 1, user_key(0, 1, 0xabc));
  Op on_world = rig.irecv(t, 1, user_key(0));
  rig.arrive(2, tensor({1}), user_key(3, 1, 0xabc));  // rank 2 is no member of group #1
  rig.progress();
  BOOST_TEST(!on_group->pending());
  const std::string why = error_text(*on_group);
  BOOST_TEST(contains(why, "rank 2 disagrees with rank 0 about the groups"), why);
  BOOST_TEST(contains(why, "which does not contain rank 2"), why);
  BOOST_TEST(rig.engine->group_disagreement() == why);
  BOOST_TEST(on_world->pending());
}

BOOST_AUTO_TEST_SUITE_END()
