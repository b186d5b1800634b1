// "Never hangs silently": with no --timeout, shmrun prints the hang report once when the job
// stalls (here after a short --hang-report interval), without stopping it; the report tells
// a deadlock from a stream in flight and names stopped ranks and ranks that never joined
// (issue 11, bug 3 and the watchdog; issue 12, the since_ns saturation).
#include <signal.h>

#include <boost/test/unit_test.hpp>

#include "hostile/hostile_helpers.hpp"
#include "job/diagnosis.hpp"

using namespace shmdist::test;
using namespace std::chrono_literals;

namespace {
const std::string kHung = "shmrun: the job looks hung: ";

// Stops a job that is still running (SIGTERM through shmrun), bounded.
CommandResult stop(LiveCommand& job) {
  job.signal(SIGTERM);
  return job.finish(30s);
}
}  // namespace

BOOST_FIXTURE_TEST_SUITE(watchdog, ShmLeakCheck)

BOOST_AUTO_TEST_CASE(a_deadlock_is_reported_once_and_the_job_keeps_running) {
  LiveCommand job(shmrun({"-n", "2", "--hang-report", "300ms", program("fault_rank"), "hang"}),
                  clean_options(120s));
  const std::string cycle = "deadlock: rank 0 waits for rank 1 (recv), rank 1 waits for rank 0";
  BOOST_REQUIRE(job.wait_until([&] { return contains(job.err(), cycle); }, 60s));
  BOOST_TEST_INFO("stderr:\n" << job.err());
  BOOST_TEST(contains(job.err(), kHung + "every rank of a wait-for cycle is blocked"));
  BOOST_TEST(contains(job.err(), "shmrun: state of the job (no progress):"));
  BOOST_TEST(!job.exited());
  // Once per stall: SIGUSR1 prints it again, the watchdog does not.
  job.signal(SIGUSR1);
  BOOST_REQUIRE(job.wait_until([&] { return contains(job.err(), "(SIGUSR1):"); }, 30s));
  BOOST_REQUIRE(job.wait_until([&] { return count_of(job.err(), cycle) == 2; }, 30s));
  BOOST_TEST(count_of(job.err(), kHung) == 1);
  BOOST_TEST(lines_starting(job.out(), "PEER_FAILURE").empty());  // nothing was aborted
  const CommandResult r = stop(job);
  BOOST_TEST(r.exit_code == 128 + SIGTERM);
}

// 16 MiB messages through a 64 KiB ring for 6 s: both ranks block in turn, a wait-for cycle at
// every moment, but data moves. Neither the watchdog (2 s) nor SIGUSR1 may call it a deadlock.
BOOST_AUTO_TEST_CASE(a_stream_is_not_a_deadlock) {
  LiveCommand job(shmrun({"-n", "2", "--ring-size", "64K", "--hang-report", "2s",
                          program("hostile_rank"), "stream", "16", "6"}),
                  clean_options(240s));
  BOOST_REQUIRE(job.wait_until([&] { return lines_starting(job.out(), "STREAMING").size() == 2; },
                               60s));
  job.signal(SIGUSR1);
  BOOST_REQUIRE(job.wait_until([&] { return contains(job.err(), "(SIGUSR1):") || job.exited(); },
                               30s));
  const CommandResult r = job.finish(200s);
  BOOST_TEST_INFO("stderr:\n" << r.err);
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(lines_starting(r.out, "DONE").size() == 2u);
  BOOST_TEST(!contains(r.err, "deadlock: "));
  BOOST_TEST(!contains(r.err, kHung));
  BOOST_TEST(contains(r.err, "(SIGUSR1):"), r.err);  // the stream outlasts the report
  BOOST_TEST(contains(r.err, "making progress: ranks 0, 1"), r.err);
}

// A SIGSTOPped rank shows as stopped, and the stall it causes is reported.
BOOST_AUTO_TEST_CASE(a_stopped_rank_is_named) {
  LiveCommand job(
      shmrun({"-n", "2", "--hang-report", "300ms", program("hostile_rank"), "wait_for_1"}),
      clean_options(120s));
  BOOST_REQUIRE(job.wait_until([&] { return lines_starting(job.out(), "READY").size() == 2; }, 60s));
  pid_t victim = -1;
  for (const auto& line : lines_starting(job.out(), "READY"))
    if (fields_of(line)["rank"] == "1") victim = std::stoi(fields_of(line)["pid"]);
  BOOST_REQUIRE(victim > 0);
  kill(victim, SIGSTOP);  // a pid our own test program printed
  const bool reported = job.wait_until([&] { return contains(job.err(), "stopped: rank 1"); }, 60s);
  kill(victim, SIGCONT);
  BOOST_TEST_INFO("stderr:\n" << job.err());
  BOOST_TEST(reported);
  BOOST_TEST(contains(job.err(), kHung + "every rank still running is blocked, stopped"));
  BOOST_TEST(contains(job.err(), "stopped: rank 1 (pid " + std::to_string(victim) + ")"));
  const CommandResult r = stop(job);
  BOOST_TEST(r.exit_code == 128 + SIGTERM);
}

// A rank that never calls init_process_group is named as such.
BOOST_AUTO_TEST_CASE(a_rank_that_never_joins_is_named) {
  LiveCommand job(shmrun({"-n", "2", "--hang-report", "300ms", program("hostile_rank"), "noinit"}),
                  clean_options(120s));
  BOOST_REQUIRE(job.wait_until([&] { return contains(job.err(), "never called init_process_group"); },
                               60s));
  BOOST_TEST_INFO("stderr:\n" << job.err());
  BOOST_TEST(contains(job.err(), kHung));
  const auto noinit = pids_on(job.out(), "NOINIT");
  BOOST_REQUIRE(noinit.size() == 1u);
  BOOST_TEST(contains(job.err(), "not joined: rank 1 (pid " + std::to_string(noinit[0]) +
                                     ") never called init_process_group"));
  const CommandResult r = stop(job);
  BOOST_TEST(r.exit_code == 128 + SIGTERM);
}

// --hang-report 0 switches the watchdog off.
BOOST_AUTO_TEST_CASE(hang_report_zero_is_off) {
  const CommandResult r = run_command(
      shmrun({"-n", "2", "--hang-report", "0", "--timeout", "2s", program("fault_rank"), "hang"}),
      clean_options(60s));
  BOOST_TEST(r.exit_code == 124);
  BOOST_TEST(!contains(r.err, kHung), r.err);
  BOOST_TEST(contains(r.err, "(timeout):"), r.err);  // the timeout's report still comes
}

// Ranks that catch the timeout's PeerFailure and return non-zero without destroy do not
// become the job's failure: every rank is told about the timeout, shmrun exits 124.
BOOST_AUTO_TEST_CASE(ranks_failing_after_a_timeout_do_not_hide_it) {
  const CommandResult r = run_command(
      shmrun({"-n", "3", "--timeout", "1s", program("fault_rank"), "hang"}), clean_options(60s));
  BOOST_TEST_INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  BOOST_TEST(r.exit_code == 124);
  const auto failures = lines_starting(r.out, "PEER_FAILURE");
  BOOST_TEST(failures.size() == 3u);
  for (const auto& line : failures) BOOST_TEST(contains(line, "shmrun --timeout"), line);
}

// since_ns is written by a rank: garbage gives "unknown", never overflow.
BOOST_AUTO_TEST_CASE(blocked_time_saturates) {
  using shmdist::job::elapsed_ms;
  BOOST_TEST(elapsed_ms(5'000'000'000, 3'000'000'000) == 2000);
  BOOST_TEST(elapsed_ms(5'000'000'000, 0) == -1);
  BOOST_TEST(elapsed_ms(5'000'000'000, -9'000'000'000'000'000'000) == -1);
  BOOST_TEST(elapsed_ms(5'000'000'000, 6'000'000'000) == -1);  // in the future
  BOOST_TEST(elapsed_ms(INT64_MAX, 1) == (INT64_MAX - 1) / 1'000'000);
}

BOOST_AUTO_TEST_SUITE_END()
