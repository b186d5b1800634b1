// Ranks that end without destroy_process_group (issue 11, bug 1), and re-initialising.
#include <unistd.h>

#include <memory>

#include <boost/test/unit_test.hpp>

#include "hostile/hostile_helpers.hpp"

using namespace shmdist::test;
using namespace std::chrono_literals;

BOOST_FIXTURE_TEST_SUITE(exit_paths, ShmLeakCheck)

// Rank 1 returns 5 from main without destroy while rank 0 waits for it in recv: rank 0's recv
// throws PeerFailure naming rank 1 and its exit code, shmrun blames rank 1 and exits 5.
// (Before: rank 1 waited at exit for rank 0, rank 0 got "rank 1 has finalized", exited 42,
// and shmrun blamed rank 0.)
BOOST_AUTO_TEST_CASE(nonzero_return_without_destroy_fails_fast_and_is_blamed) {
  const CommandResult r =
      run_command(shmrun({"-n", "2", program("hostile_rank"), "leave", "5"}), clean_options(60s));
  BOOST_TEST_INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  BOOST_TEST(r.exit_code == 5);
  const auto failures = lines_starting(r.out, "PEER_FAILURE");
  BOOST_REQUIRE(failures.size() == 1u);
  BOOST_TEST(contains(failures[0], "rank 1 (pid"));
  BOOST_TEST(contains(failures[0], "exited with code 5"));
  BOOST_TEST(contains(r.err, "shmrun: rank 1 (pid"));
  BOOST_TEST(contains(r.err, "exited with code 5; it failed first"));
}

// Rank 0 is not in a shmdist call at all (pause()): only the launcher can end it, and it does
// so at once because rank 1's exit does not wait for anyone. (Before: rank 1 waited at exit
// for rank 0's destroy, forever.)
BOOST_AUTO_TEST_CASE(nonzero_return_without_destroy_stops_the_job) {
  const CommandResult r = run_command(
      shmrun({"-n", "2", "--grace", "1s", program("hostile_rank"), "leave_idle", "7"}),
      clean_options(60s));
  BOOST_TEST_INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  BOOST_TEST(!r.timed_out);
  BOOST_TEST(r.exit_code == 7);
  BOOST_TEST(contains(r.err, "exited with code 7; it failed first"));
  BOOST_TEST(contains(r.err, "stopped: rank 0 (SIGTERM)"));
}

// Returning 0 without destroy: what the rank sent is delivered, the process ends without
// waiting for its peers, and a later receive from it fails instead of hanging; the job
// succeeds. (Before: rank 1 waited at exit until rank 0 destroyed.)
BOOST_AUTO_TEST_CASE(clean_return_without_destroy_delivers_and_does_not_wait) {
  const CommandResult r =
      run_command(shmrun({"-n", "2", program("hostile_rank"), "leave_clean"}), clean_options(60s));
  BOOST_TEST_INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(lines_starting(r.out, "PEER_EXITED").size() == 1u);
  BOOST_TEST(lines_starting(r.out, "PEER_STILL_THERE").empty());
  const auto failures = lines_starting(r.out, "PEER_FAILURE");
  BOOST_REQUIRE(failures.size() == 1u);
  BOOST_TEST(contains(failures[0], "rank 1"));
}

// Returning 0 without destroy while a single-copy offer is outstanding (an isend of 4 MiB,
// more than the ring, not waited for): the rank's end keeps the offer open for its flush
// budget, so the receiver, which looks only after 0.3 s, still copies it whole.
BOOST_AUTO_TEST_CASE(clean_return_with_an_outstanding_offer_delivers_it) {
  const CommandResult r =
      run_command(shmrun({"-n", "2", program("hostile_rank"), "leave_offer"}), clean_options(60s));
  BOOST_TEST_INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(lines_starting(r.out, "OFFER_OK").size() == 1u);
  BOOST_TEST(lines_starting(r.out, "OFFER_BAD").empty());
}

// Without a launcher (torchrun-style variables), the rank that returns 5 says so itself: the
// survivor's PeerFailure names it and its exit code (a peer could only tell "gone" before).
BOOST_AUTO_TEST_CASE(nonzero_return_without_destroy_is_named_without_a_launcher) {
  const int port = 40'000 + static_cast<int>(getpid() % 20'000);
  std::vector<std::unique_ptr<LiveCommand>> ranks;
  for (int r = 0; r < 2; ++r) {
    CommandOptions o = clean_options();
    o.env = {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", std::to_string(port)}};
    ranks.push_back(std::make_unique<LiveCommand>(
        std::vector<std::string>{program("hostile_rank"), "leave", "5"}, o));
  }
  const CommandResult r0 = ranks[0]->finish(60s);
  const CommandResult r1 = ranks[1]->finish(60s);
  BOOST_TEST_INFO("rank 0:\n" << r0.out << r0.err << "rank 1:\n" << r1.out << r1.err);
  BOOST_TEST(r1.exit_code == 5);
  BOOST_TEST(r0.exit_code == 42);
  const auto failures = lines_starting(r0.out, "PEER_FAILURE");
  BOOST_REQUIRE(failures.size() == 1u);
  BOOST_TEST(contains(failures[0], "rank 1 (pid"));
  BOOST_TEST(contains(failures[0], "exited with code 5"));
}

// Issue 27.11: under shmrun a rank initializes again after destroy_process_group, as through
// torch (before: InvalidArgument "each process initializes the process group once"). Three
// rounds, each on a fresh job among the same ranks, with a sub-group; nothing is left behind.
BOOST_AUTO_TEST_CASE(init_again_after_destroy_works_under_shmrun) {
  const CommandResult r =
      run_command(shmrun({"-n", "2", program("hostile_rank"), "reinit"}), clean_options(60s));
  BOOST_TEST_INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(lines_starting(r.out, "REINIT_ERROR").empty());
  for (int round = 1; round <= 3; ++round)
    for (int rank = 0; rank < 2; ++rank) {
      // (1 + 2) * round over the world, then doubled over the pair {0, 1}.
      const std::string line = "ROUND " + std::to_string(round) + " rank=" +
                               std::to_string(rank) + " sum=" + std::to_string(6 * round);
      BOOST_TEST(lines_starting(r.out, line).size() == 1u, line);
    }
}

BOOST_AUTO_TEST_SUITE_END()
