// Errors a caller can recover from (invalid arguments, count mismatch, timeouts) and errors
// that end a wait instead of hanging (finalized peers, no launcher), plus the report of
// messages nobody received.
#include <boost/test/unit_test.hpp>

#include <atomic>

#include "p2p_support.hpp"
#include "support/process.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::p2p;

namespace {
// The launcher variables join_from_environment looks at.
const std::vector<std::string> kLauncherVariables = {
    "SHMDIST_SEGMENT_FD", "SHMDIST_SEGMENT", "SHMDIST_JOB_KEY", "RANK", "WORLD_SIZE",
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"};
}  // namespace

BOOST_FIXTURE_TEST_SUITE(errors, ShmLeakCheck)

// Every invalid argument of API.md section 3 throws InvalidArgument with a message naming the
// offending value, changes nothing (a failed batch posts none of its ops) and the job goes on.
BOOST_AUTO_TEST_CASE(invalid_arguments_throw_and_the_job_continues) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      dist::Group pair = pg.new_group({0, 1});
      dist::Tensor t = dist::tensor({1.0f});
      dist::Tensor undefined;
      if (me == 0) {
        using IA = dist::InvalidArgument;
        require_throws<IA>([&] { pg.send(t, 0); }, {"rank 0", "itself"}, "send to self");
        require_throws<IA>([&] { pg.isend(t, 0); }, {"rank 0", "itself"}, "isend to self");
        require_throws<IA>([&] { pg.recv(t, 0); }, {"rank 0", "itself"}, "recv from self");
        require_throws<IA>([&] { pg.irecv(t, 0); }, {"rank 0", "itself"}, "irecv from self");
        require_throws<IA>([&] { pg.send(t, 3); }, {"3", "[0, 3)"}, "send beyond the world");
        require_throws<IA>([&] { pg.send(t, 1000); }, {"1000"}, "send far beyond the world");
        require_throws<IA>([&] { pg.isend(t, -5); }, {"-5"}, "isend to a negative rank");
        require_throws<IA>([&] { pg.recv(t, 3); }, {"3"}, "recv beyond the world");
        require_throws<IA>([&] { pg.irecv(t, -2); }, {"-2"}, "irecv from -2");
        require_throws<IA>([&] { pg.send(t, 1, {}, -1); }, {"tag -1"}, "send negative tag");
        require_throws<IA>([&] { pg.isend(t, 1, {}, -7); }, {"tag -7"}, "isend negative tag");
        require_throws<IA>([&] { pg.recv(t, 1, {}, -1); }, {"tag -1"}, "recv negative tag");
        require_throws<IA>([&] { pg.irecv(t, dist::ANY_SOURCE, {}, -3); }, {"tag -3"},
                           "irecv negative tag");
        require_throws<IA>([&] { pg.send(undefined, 1); }, {"undefined"}, "send undefined");
        require_throws<IA>([&] { pg.isend(undefined, 1); }, {"undefined"}, "isend undefined");
        require_throws<IA>([&] { pg.recv(undefined, 1); }, {"undefined"}, "recv undefined");
        require_throws<IA>([&] { pg.irecv(undefined, 1); }, {"undefined"}, "irecv undefined");
        require_throws<IA>([&] { pg.send(t, dist::ANY_SOURCE); }, {"-1"}, "send to ANY_SOURCE");
        require_throws<IA>([&] { pg.isend(t, dist::ANY_SOURCE); }, {"-1"}, "isend to ANY_SOURCE");
        require_throws<IA>([&] { pg.batch_isend_irecv({dist::P2PSend(t, dist::ANY_SOURCE)}); },
                           {"-1"}, "batch send to ANY_SOURCE");
        require_throws<IA>([&] { pg.send(t, 2, pair); }, {"not part of"},
                           "send to a non-member of the group");
        require_throws<IA>([&] { pg.batch_isend_irecv({}); }, {"empty"}, "empty batch");
        // A batch whose last op is invalid posts none: the valid send before it never leaves.
        dist::Tensor marker = dist::tensor({99.0f});
        require_throws<IA>(
            [&] { pg.batch_isend_irecv({dist::P2PSend(marker, 1), dist::P2PSend(t, 0)}); },
            {"itself"}, "batch with a send to self");
        // The job goes on: a real exchange with each peer.
        pg.send(dist::tensor({7.0f}), 1);
        pg.send(dist::tensor({8.0f}), 2);
        RANK_REQUIRE_EQ(pg.recv(t, 1), 1);
        RANK_REQUIRE(t.equal(dist::tensor({17.0f})));
      } else if (me == 1) {
        RANK_REQUIRE_EQ(pg.recv(t, 0), 0);
        RANK_REQUIRE(t.equal(dist::tensor({7.0f})));  // not the failed batch's 99
        pg.send(dist::tensor({17.0f}), 0);
      } else {
        // A non-member of `pair` calling on it (further cases in test_groups.cpp).
        require_throws<dist::InvalidArgument>([&] { pg.recv(t, 0, pair); }, {"not a member"},
                                              "recv on a group the caller is not in");
        RANK_REQUIRE_EQ(pg.recv(t, 0), 0);
        RANK_REQUIRE(t.equal(dist::tensor({8.0f})));
      }
      pg.barrier();
    }, job_options(mode));
  }
}

// A receive with the wrong element count throws InvalidArgument naming both counts, the sender
// and the tag; the message stays queued and a receive with the right count gets it. Checked on
// both routes: message already waiting (unexpected), and receive posted first (irecv).
BOOST_AUTO_TEST_CASE(count_mismatch_keeps_the_message) {
  for (auto mode : all_modes()) {
    expect_job_ok(2, [](dist::ProcessGroup& pg) {
      const std::initializer_list<std::string> names{"4 elements", "5 elements", "rank 0",
                                                     "tag 7"};
      if (pg.get_rank() == 0) {
        pg.send(dist::tensor({1, 2, 3, 4, 5}), 1, {}, 7);
        pg.barrier();
        pg.barrier();  // the receiver has posted its (wrong) irecv
        pg.send(dist::tensor({6, 7, 8, 9, 10}), 1, {}, 7);
        pg.barrier();
        return;
      }
      pg.barrier();  // the first message is waiting as unexpected
      dist::Tensor small = dist::zeros(4, dist::kLong);
      require_throws<dist::InvalidArgument>([&] { pg.recv(small, 0, {}, 7); }, names,
                                            "recv of 4 from a message of 5");
      require_throws<dist::InvalidArgument>([&] { pg.recv(small, dist::ANY_SOURCE, {}, 7); },
                                            names, "any-source recv of 4 from a message of 5");
      dist::Tensor right = dist::zeros(5, dist::kLong);
      RANK_REQUIRE_EQ(pg.recv(right, 0, {}, 7), 0);
      RANK_REQUIRE(right.equal(dist::tensor({1, 2, 3, 4, 5})));

      dist::Work wrong = pg.irecv(small, 0, {}, 7);
      pg.barrier();
      require_throws<dist::InvalidArgument>([&] { wrong.wait(); }, names,
                                            "posted irecv of 4, message of 5");
      dist::Tensor right2 = dist::zeros(5, dist::kFloat64);  // a converting receive takes it
      RANK_REQUIRE_EQ(pg.recv(right2, 0, {}, 7), 0);
      RANK_REQUIRE(right2.equal(dist::tensor({6.0, 7.0, 8.0, 9.0, 10.0}, dist::kFloat64)));
      pg.barrier();
    }, job_options(mode));
  }
}

// With a 1 s process-group timeout: a recv nobody serves throws Timeout (explicit source and
// any source); so does a blocking send into a full ring whose receiver takes nothing. The group
// stays usable: the send's message is delivered whole afterwards, and later calls work.
BOOST_AUTO_TEST_CASE(blocking_calls_time_out) {
  for (auto mode : all_modes()) {
    SharedCounters flag(1);
    JobOptions o = job_options(mode, 64 << 10);
    o.timeout = std::chrono::seconds(1);
    o.job_timeout = std::chrono::seconds(60);
    expect_job_ok(2, [&flag](dist::ProcessGroup& pg) {
      constexpr std::int64_t kBytes = 1 << 20;  // 16x the ring
      if (pg.get_rank() == 1) {
        dist::Tensor t = dist::zeros(1);
        require_throws<dist::Timeout>([&] { pg.recv(t, 0, {}, 3); }, {"timed out", "rank 0"},
                                      "recv with no sender");
        require_throws<dist::Timeout>([&] { pg.recv(t, dist::ANY_SOURCE, {}, 3); },
                                      {"timed out"}, "any-source recv with no sender");
        dist::Tensor big = dist::empty({kBytes}, dist::kUInt8);
        fill_pattern(big, 42);
        require_throws<dist::Timeout>([&] { pg.send(big, 0, {}, 4); }, {"timed out", "rank 0"},
                                      "send into a ring nobody drains");
        flag[0].store(1);
        pg.send(dist::tensor({5}), 0, {}, 5);
      } else {
        // Rank 0 stays out of the library (and so takes nothing in) until rank 1 has seen its
        // three timeouts; it must not finalize either, or rank 1 would get PeerFailure.
        flag.wait_at_least(0, 1);
        dist::Tensor big = dist::zeros({kBytes}, dist::kUInt8);
        // The send that timed out had started streaming: its message still arrives, whole.
        RANK_REQUIRE_EQ(pg.recv(big, 1, {}, 4), 1);
        require_pattern(big, 42, "the timed-out send's message");
        dist::Tensor v = dist::zeros(1, dist::kLong);
        RANK_REQUIRE_EQ(pg.recv(v, 1, {}, 5), 1);
        RANK_REQUIRE_EQ(v.data<std::int64_t>()[0], 5);
      }
    }, o);
  }
}

// A rank waiting on a peer that has called destroy_process_group gets PeerFailure (not a hang,
// not a Timeout: the group timeout is 30 s here). What the peer sent before finalizing is still
// received first.
BOOST_AUTO_TEST_CASE(waiting_on_a_finalized_peer_throws_peer_failure) {
  for (auto mode : all_modes()) {
    JobOptions o = job_options(mode);
    o.timeout = std::chrono::seconds(30);
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      if (me == 0) {
        pg.send(dist::tensor({1}), 2);
        pg.destroy();
        return;
      }
      if (me == 1) {
        pg.destroy();
        return;
      }
      dist::Tensor t = dist::zeros(1, dist::kLong);
      RANK_REQUIRE_EQ(pg.recv(t, 0), 0);  // sent before rank 0 finalized
      RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], 1);
      require_throws<dist::PeerFailure>([&] { pg.recv(t, 0); }, {"rank 0", "finalized"},
                                        "recv from a finalized peer");
      dist::Work w = pg.irecv(t, 1, {}, 2);
      require_throws<dist::PeerFailure>([&] { w.wait(); }, {"rank 1"},
                                        "Work::wait on a finalized peer");
      // Any-source: fails only once every possible sender has finalized.
      require_throws<dist::PeerFailure>([&] { pg.recv(t, dist::ANY_SOURCE); }, {"finalized"},
                                        "any-source recv when all peers finalized");
    }, o);
  }
}

// init_process_group / ProcessGroup outside any launcher: SetupError telling to use shmrun.
BOOST_AUTO_TEST_CASE(no_launcher_environment_is_a_setup_error) {
  std::vector<std::unique_ptr<ScopedEnv>> cleared;
  for (const auto& name : kLauncherVariables)
    cleared.push_back(std::make_unique<ScopedEnv>(name, std::nullopt));
  BOOST_CHECK(!dist::is_initialized());
  for (int variant = 0; variant < 2; ++variant) {
    try {
      if (variant == 0) {
        dist::init_process_group();
      } else {
        dist::ProcessGroup pg;
      }
      BOOST_ERROR("joining without a launcher did not throw");
    } catch (const dist::SetupError& e) {
      BOOST_TEST_INFO("message: " << e.what());
      BOOST_CHECK(std::string(e.what()).find("shmrun -n") != std::string::npos);
    } catch (const std::exception& e) {
      BOOST_ERROR("expected SetupError, got: " << e.what());
    }
  }
  BOOST_CHECK(!dist::is_initialized());
  BOOST_CHECK_THROW(dist::get_rank(), dist::NotInitialized);
}

// destroy_process_group reports messages that arrived and were never received (one line per
// peer, on stderr) and posted receives that never matched, instead of dropping them silently.
// Run under shmrun to capture the ranks' stderr; the job still succeeds.
BOOST_AUTO_TEST_CASE(destroy_reports_unreceived_messages) {
  CommandOptions co;
  co.timeout = std::chrono::seconds(60);
  const std::string program = test_programs_dir() + "/shmdist_p2p_unreceived";
  const CommandResult r = run_command({shmrun_path(), "-n", "3", "--timeout", "50s", program}, co);
  BOOST_TEST_INFO("stdout:\n" << r.out << "\nstderr:\n" << r.err);
  BOOST_CHECK(!r.timed_out);
  BOOST_CHECK_EQUAL(r.exit_code, 0);
  BOOST_CHECK(r.out.find("p2p_unreceived: all ranks reached destroy") != std::string::npos);
  BOOST_CHECK(r.err.find("shmdist: rank 1: 3 messages from rank 0 arrived and were never "
                         "received (tags 3, 4, 112 bytes)") != std::string::npos);
  BOOST_CHECK(r.err.find("shmdist: rank 1: 1 message from rank 2 arrived and was never "
                         "received (tag 0, 4 bytes)") != std::string::npos);
  BOOST_CHECK(r.err.find("shmdist: rank 0: 1 posted receive from rank 2 never matched a "
                         "message (tag 9)") != std::string::npos);
  // Nothing about the message that was received, nor from rank 2's point of view.
  BOOST_CHECK(r.err.find("shmdist: rank 2:") == std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
