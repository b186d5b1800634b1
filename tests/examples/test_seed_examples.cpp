// The seed's three examples run through shmrun and print exactly the seed's lines.
#include <boost/test/unit_test.hpp>

#include "support/process.hpp"
#include "support/shm_check.hpp"

using shmdist::test::CommandResult;
using shmdist::test::examples_dir;
using shmdist::test::run_command;
using shmdist::test::shmrun_path;

namespace {
CommandResult run_example(int n, const std::string& name) {
  shmdist::test::CommandOptions options;
  options.timeout = std::chrono::seconds(60);
  return run_command({shmrun_path(), "-n", std::to_string(n), examples_dir() + "/" + name}, options);
}
}  // namespace

BOOST_FIXTURE_TEST_SUITE(seed, shmdist::test::ShmLeakCheck)

BOOST_AUTO_TEST_CASE(example1_one_sender) {
  const auto r = run_example(2, "seed1_send_recv");
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(r.out == "Received from 0: tensor([10, 20, 30, 40])\n");
  BOOST_TEST(r.err == "");
}

// Either sender may win; the other message is reported as unreceived at destroy, and the
// job still ends cleanly (no crash, no hang, exit 0).
BOOST_AUTO_TEST_CASE(example2_any_source_reports_the_other_message) {
  for (int trial = 0; trial < 10; ++trial) {
    const auto r = run_example(3, "seed2_any_source");
    BOOST_TEST_CONTEXT("trial " << trial << ", stderr: " << r.err) {
      BOOST_TEST(r.exit_code == 0);
      const bool from0 = r.out == "Received from 0: tensor([1, 2, 3])\n";
      const bool from1 = r.out == "Received from 1: tensor([4, 5, 6])\n";
      BOOST_TEST((from0 || from1), "unexpected output: " << r.out);
      const std::string other = from0 ? "1" : "0";
      BOOST_TEST(r.err == "shmdist: rank 2: 1 message from rank " + other +
                              " arrived and was never received (tag 0, 24 bytes)\n");
    }
  }
}

BOOST_AUTO_TEST_CASE(example3_subgroup_converts_int64_to_float32) {
  const auto r = run_example(2, "seed3_subgroup");
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(r.out == "From 0 in subgroup: tensor([7., 8., 9.])\n");
  BOOST_TEST(r.err == "");
}

BOOST_AUTO_TEST_CASE(tag_output_prefixes_rank) {
  shmdist::test::CommandOptions options;
  options.timeout = std::chrono::seconds(60);
  const auto r = run_command(
      {shmrun_path(), "-n", "2", "--tag-output", examples_dir() + "/seed1_send_recv"}, options);
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(r.out == "[1] Received from 0: tensor([10, 20, 30, 40])\n");
}

BOOST_AUTO_TEST_SUITE_END()
