// Process groups: membership, rank translation, global ranks in recv's result, and isolation of
// messages between groups that use the same tag.
#include <boost/test/unit_test.hpp>

#include "p2p_support.hpp"
#include "support/process.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::p2p;

BOOST_FIXTURE_TEST_SUITE(groups, ShmLeakCheck)

// A group of global ranks {3, 1} out of 4 (torch sorts the ranks: group rank 0 is global 1).
BOOST_AUTO_TEST_CASE(members_and_rank_translation) {
  for (auto mode : all_modes()) {
    expect_job_ok(4, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      dist::Group g = pg.new_group({3, 1});
      RANK_REQUIRE(!g.is_world());
      RANK_REQUIRE(pg.get_process_group_ranks(g) == (std::vector<int>{1, 3}));
      RANK_REQUIRE_EQ(pg.get_group_rank(g, 1), 0);
      RANK_REQUIRE_EQ(pg.get_group_rank(g, 3), 1);
      RANK_REQUIRE_EQ(pg.get_global_rank(g, 0), 1);
      RANK_REQUIRE_EQ(pg.get_global_rank(g, 1), 3);
      require_throws<dist::InvalidArgument>([&] { pg.get_group_rank(g, 2); }, {"2"},
                                            "get_group_rank of a non-member");
      require_throws<dist::InvalidArgument>([&] { pg.get_global_rank(g, 2); }, {"2"},
                                            "get_global_rank beyond the group");
      // The world group translates to itself.
      RANK_REQUIRE_EQ(pg.get_group_rank({}, 2), 2);
      RANK_REQUIRE_EQ(pg.get_global_rank({}, 3), 3);
      if (me == 1 || me == 3) {
        RANK_REQUIRE(g.is_member());
        RANK_REQUIRE_EQ(pg.get_rank(g), me == 1 ? 0 : 1);
        RANK_REQUIRE_EQ(pg.get_world_size(g), 2);
      } else {
        RANK_REQUIRE(!g.is_member());
        RANK_REQUIRE_EQ(pg.get_rank(g), -1);
        RANK_REQUIRE_EQ(pg.get_world_size(g), -1);
      }
      RANK_REQUIRE_EQ(pg.get_world_size(), 4);
      RANK_REQUIRE_EQ(pg.get_rank(), me);
    }, job_options(mode));
  }
}

// Non-members may hold the handle but every communication call on it throws InvalidArgument;
// the job goes on normally afterwards (a world ping-pong between a member and a non-member).
BOOST_AUTO_TEST_CASE(non_members_cannot_use_the_group) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      dist::Group g = pg.new_group({0, 1});
      if (me == 2) {
        dist::Tensor t = dist::zeros(2);
        const std::initializer_list<std::string> says{"not a member"};
        require_throws<dist::InvalidArgument>([&] { pg.send(t, 0, g); }, says, "send");
        require_throws<dist::InvalidArgument>([&] { pg.recv(t, 0, g); }, says, "recv");
        require_throws<dist::InvalidArgument>([&] { pg.recv(t, dist::ANY_SOURCE, g); }, says,
                                              "recv any");
        require_throws<dist::InvalidArgument>([&] { pg.isend(t, 1, g); }, says, "isend");
        require_throws<dist::InvalidArgument>([&] { pg.irecv(t, 1, g); }, says, "irecv");
        require_throws<dist::InvalidArgument>([&] { pg.barrier(g); }, says, "barrier");
        require_throws<dist::InvalidArgument>(
            [&] { pg.batch_isend_irecv({dist::P2PSend(t, 0, g)}); }, says, "batch_isend_irecv");
        pg.send(dist::tensor({2.0f, 2.0f}), 0);
        RANK_REQUIRE_EQ(pg.recv(t, 0), 0);
        RANK_REQUIRE(t.equal(dist::tensor({3.0f, 3.0f})));
      } else if (me == 0) {
        dist::Tensor t = dist::zeros(2);
        RANK_REQUIRE_EQ(pg.recv(t, 2), 2);
        RANK_REQUIRE(t.equal(dist::tensor({2.0f, 2.0f})));
        pg.send(dist::tensor({3.0f, 3.0f}), 2);
        // Members can still use the group; a peer outside it is refused.
        require_throws<dist::InvalidArgument>([&] { pg.send(t, 2, g); }, {"2", "not part of"},
                                              "send to a non-member on the group");
        pg.send(t, 1, g);
      } else {
        dist::Tensor t = dist::zeros(2);
        RANK_REQUIRE_EQ(pg.recv(t, 0, g), 0);
      }
      pg.barrier();
    }, job_options(mode));
  }
}

// recv returns the sender's GLOBAL rank with a group, both with an explicit source and with
// ANY_SOURCE, and src/dst are given as global ranks; Work::source_rank too.
BOOST_AUTO_TEST_CASE(recv_returns_global_ranks) {
  for (auto mode : all_modes()) {
    expect_job_ok(4, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      dist::Group g = pg.new_group({1, 3});
      if (me == 3) {
        for (int k = 0; k < 3; ++k) pg.send(dist::tensor({k}), 1, g, 4);
      } else if (me == 1) {
        dist::Tensor t = dist::zeros(1, dist::kLong);
        RANK_REQUIRE_EQ(pg.recv(t, 3, g, 4), 3);
        RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], 0);
        RANK_REQUIRE_EQ(pg.recv(t, dist::ANY_SOURCE, g, 4), 3);
        RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], 1);
        dist::Work w = pg.irecv(t, dist::ANY_SOURCE, g, 4);
        w.wait();
        RANK_REQUIRE_EQ(w.source_rank(), 3);
        RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], 2);
      }
    }, job_options(mode));
  }
}

// The same tag on the world group and on two sub-groups holding the same pair: three separate
// channels. The receiver takes them in the reverse order of sending and each gets its own
// message; an ANY_SOURCE receive on one group does not see another group's message.
BOOST_AUTO_TEST_CASE(same_tag_on_different_groups_does_not_mix) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      dist::Group pair = pg.new_group({0, 1});
      dist::Group trio = pg.new_group({0, 1, 2});  // same members as the world, but its own group
      constexpr int kTag = 5;
      if (me == 0) {
        pg.send(dist::tensor({111}), 1, trio, kTag);
        pg.send(dist::tensor({222}), 1, {}, kTag);
        pg.send(dist::tensor({333}), 1, pair, kTag);
      } else if (me == 1) {
        pg.barrier();  // not needed for correctness: makes all three wait as unexpected
        dist::Tensor t = dist::zeros(1, dist::kLong);
        RANK_REQUIRE_EQ(pg.recv(t, dist::ANY_SOURCE, pair, kTag), 0);
        RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], 333);
        RANK_REQUIRE_EQ(pg.recv(t, 0, {}, kTag), 0);
        RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], 222);
        RANK_REQUIRE_EQ(pg.recv(t, dist::ANY_SOURCE, trio, kTag), 0);
        RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], 111);
        return;
      }
      if (me != 1) pg.barrier();
    }, job_options(mode));
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(group_agreement, ShmLeakCheck)

// Issue 11, bug 5: groups created in different orders. The receiver learns it from the first
// message (InvalidArgument naming the sender and both views) instead of timing out, every
// later call on a group says so too, and destroy's report names the groups of what was left.
BOOST_AUTO_TEST_CASE(groups_created_in_different_orders_are_reported) {
  CommandOptions co;
  co.timeout = std::chrono::seconds(60);
  const std::string program = test_programs_dir() + "/shmdist_p2p_group_order";
  const CommandResult r = run_command({shmrun_path(), "-n", "3", "--timeout", "50s", program}, co);
  BOOST_TEST_INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  BOOST_CHECK(!r.timed_out);
  BOOST_CHECK_EQUAL(r.exit_code, 0);
  // Found during the barrier's progress or in the recv itself: "[recv on group #2: ]rank 0 ..."
  BOOST_CHECK(r.out.find("DISAGREE what=") != std::string::npos);
  BOOST_CHECK(r.out.find("rank 0 disagrees with rank 1 about the groups: a "
                         "message from rank 0 arrived on its group #1, but group #1 of rank 1 "
                         "is {1, 2}, which does not contain rank 0; rank 0's group #1 has the "
                         "members of group #2 {0, 1} here. The two ranks created their groups "
                         "in different orders") != std::string::npos);
  BOOST_CHECK(r.out.find("STILL what=send on group #1: rank 0 disagrees with rank 1") !=
              std::string::npos);
  BOOST_CHECK(r.err.find("shmdist: rank 1: 2 messages from rank 0 arrived and were never ") ==
              std::string::npos);
  BOOST_CHECK(r.err.find("shmdist: rank 1: 1 message from rank 0 arrived and was never "
                         "received (tag 0 on group #1 (not this rank's group #1), 8 bytes)") !=
              std::string::npos);
  BOOST_CHECK(r.err.find("shmdist: rank 1: 1 message from rank 2 arrived and was never "
                         "received (tag 4 on group #1 {1, 2}, 4 bytes)") != std::string::npos);
}

// A rank that skips a new_group call: its next group has another number than its peers'.
// A message on it arrives on a group that does not contain its sender: reported as such.
BOOST_AUTO_TEST_CASE(a_rank_skipping_new_group_is_named) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      if (me != 2) pg.new_group({0, 1});  // rank 2 skips it
      dist::Group g = pg.new_group({1, 2});  // #2 on ranks 0 and 1, #1 on rank 2
      if (me == 2) pg.send(dist::tensor({3}), 1, g);
      if (me == 1) {
        dist::Tensor t = dist::zeros(1, dist::kLong);
        require_throws<dist::InvalidArgument>(
            [&] { pg.recv(t, 2, g); },
            {"rank 2 disagrees with rank 1 about the groups: a message from rank 2 arrived on "
             "its group #1, but group #1 of rank 1 is {0, 1}, which does not contain rank 2",
             "rank 2's group #1 has the members of group #2 {1, 2} here",
             "skipped or added a new_group call"},
            "recv on the group rank 2 numbered differently");
      }
      pg.barrier();
    }, job_options(mode));
  }
}

// Agreeing ranks are not disturbed: a message on a group that the receiver creates only
// later is checked then, and is received normally.
BOOST_AUTO_TEST_CASE(a_message_before_the_receiver_creates_the_group_is_fine) {
  for (auto mode : all_modes()) {
    expect_job_ok(2, [](dist::ProcessGroup& pg) {
      dist::Tensor t = dist::zeros(1, dist::kLong);
      if (pg.get_rank() == 0) {
        dist::Group g = pg.new_group({0, 1});
        pg.send(dist::tensor({42}), 1, g, 2);
        pg.send(dist::tensor({1}), 1, {}, 1);
      } else {
        pg.recv(t, 0, {}, 1);  // the group's message came first: it waits as unexpected
        dist::Group g = pg.new_group({0, 1});
        pg.recv(t, 0, g, 2);
        RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], 42);
      }
    }, job_options(mode));
  }
}

BOOST_AUTO_TEST_SUITE_END()
