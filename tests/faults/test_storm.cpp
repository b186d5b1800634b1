// 20 seeded trials: 8 ranks exchange random point-to-point traffic under shmrun, and one rank,
// chosen by the seed, is killed with SIGKILL at a moment chosen by the seed. Every other rank
// must end with PeerFailure naming it within 2 s, shmrun must exit 137 naming it, and no
// process or /dev/shm entry may remain.
#include <signal.h>

#include <boost/test/unit_test.hpp>
#include <random>
#include <thread>

#include "launcher/shmrun_helpers.hpp"
#include "support/shm_check.hpp"

using namespace shmdist::test;
using namespace std::chrono_literals;

namespace {

constexpr int kWorld = 8;
constexpr int kTrials = 20;
constexpr std::int64_t kPropagationBoundNs = 2'000'000'000;

void run_trial(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int victim = static_cast<int>(rng() % kWorld);
  const auto kill_after = std::chrono::milliseconds(20 + rng() % 600);
  BOOST_TEST_CONTEXT("seed " << seed << ", victim rank " << victim << " killed after "
                             << kill_after.count() << " ms of traffic") {
    const auto shm_before = shm_objects();
    LiveCommand job(shmrun({"-n", std::to_string(kWorld), "--ring-size", "64K",
                            program("storm_rank"), std::to_string(seed), "60"}),
                    clean_options(90s));
    BOOST_REQUIRE(job.wait_until(
        [&] { return lines_starting(job.out(), "READY").size() == kWorld || job.exited(); }, 60s));
    std::map<int, pid_t> pids;
    for (const auto& line : lines_starting(job.out(), "READY")) {
      auto f = fields_of(line);
      pids[std::stoi(f["rank"])] = std::stoi(f["pid"]);
    }
    BOOST_REQUIRE_MESSAGE(pids.size() == kWorld, "not every rank started:\n" << job.out()
                                                                            << job.err());
    std::this_thread::sleep_for(kill_after);
    const std::int64_t killed_at = steady_ns();
    BOOST_REQUIRE(kill(pids.at(victim), SIGKILL) == 0);  // a pid our own program reported
    const CommandResult r = job.finish(60s);
    BOOST_TEST_INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
    BOOST_TEST(!r.timed_out);
    BOOST_TEST(r.exit_code == 128 + SIGKILL);
    const std::string victim_text = "rank " + std::to_string(victim) + " (pid " +
                                    std::to_string(pids.at(victim)) + ")";
    BOOST_TEST(contains(r.err, "shmrun: " + victim_text +
                                   " was killed by signal 9 (SIGKILL); it failed first"));
    BOOST_TEST(lines_starting(r.out, "CORRUPT").empty());
    BOOST_TEST(lines_starting(r.out, "ERROR").empty());
    const auto failures = lines_starting(r.out, "PEER_FAILURE");
    BOOST_TEST(failures.size() == kWorld - 1u);
    std::int64_t slowest = 0;
    long most_rounds = 0;
    for (const auto& line : failures) {
      auto f = fields_of(line);
      most_rounds = std::max(most_rounds, std::stol(f["round"]));
      BOOST_TEST_CONTEXT("rank " << f["rank"]) {
        BOOST_TEST(f["what"].find(victim_text) != std::string::npos, f["what"]);
        slowest = std::max<std::int64_t>(slowest, std::stoll(f["t"]) - killed_at);
      }
    }
    BOOST_TEST(most_rounds > 0, "the rank was killed before any traffic");
    BOOST_TEST(slowest < kPropagationBoundNs, "slowest PeerFailure after " << slowest / 1'000'000
                                                                           << " ms");
    for (const auto& [rank, pid] : pids)
      BOOST_TEST(!process_running(pid), "rank " << rank << " (pid " << pid << ") still runs");
    BOOST_TEST(no_new_shm_objects(shm_before));
  }
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(storm, ShmLeakCheck)

BOOST_AUTO_TEST_CASE(one_rank_killed_in_a_storm_of_traffic) {
  const auto start = std::chrono::steady_clock::now();
  for (int trial = 0; trial < kTrials; ++trial) run_trial(1000 + static_cast<std::uint64_t>(trial));
  BOOST_TEST_MESSAGE("20 storm trials took "
                     << std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count()
                     << " ms");
}

BOOST_AUTO_TEST_SUITE_END()
