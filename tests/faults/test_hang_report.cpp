// Hang diagnosis: --timeout prints what every rank is blocked on and the wait-for cycle, then
// aborts the job with exit 124; SIGUSR1 prints the same table at any time without stopping.
#include <signal.h>

#include <boost/test/unit_test.hpp>

#include "launcher/shmrun_helpers.hpp"
#include "support/shm_check.hpp"

using namespace shmdist::test;
using namespace std::chrono_literals;

namespace {

// " 12 ": a number as a whole word (built piecewise: GCC 12 warns falsely, -Wrestrict, on
// "literal" + std::to_string(...)).
std::string word(long long value) {
  std::string s(1, ' ');
  s += std::to_string(value);
  s += ' ';
  return s;
}

// The report's row for `rank`: "  <rank> <pid> running recv <peer> ..."
std::string row_of(const std::string& report, int rank, pid_t pid) {
  std::string start(1, ' ');
  start += word(rank);
  for (std::size_t pos = report.find(start); pos != std::string::npos;
       pos = report.find(start, pos + 1)) {
    const std::string row = report.substr(pos, report.find('\n', pos) - pos);
    if (row.find(word(pid)) != std::string::npos) return row;
  }
  return {};
}

void check_cycle_report(int world, const std::string& expected_cycle) {
  BOOST_TEST_CONTEXT(world << " ranks") {
    const CommandResult r = run_command(
        shmrun({"-n", std::to_string(world), "--timeout", "2s", program("fault_rank"), "hang"}),
        clean_options(60s));
    BOOST_TEST_INFO("stderr:\n" << r.err);
    BOOST_TEST(r.exit_code == 124);
    BOOST_TEST(r.elapsed >= 2000ms);
    BOOST_TEST(contains(r.err, "shmrun: the job did not finish within its --timeout of 2000 ms"));
    BOOST_TEST(contains(r.err, "shmrun: state of the job (timeout):"));
    BOOST_TEST(contains(r.err, "deadlock: " + expected_cycle + "\n"));
    const auto ready = lines_starting(r.out, "READY");
    BOOST_TEST(static_cast<int>(ready.size()) == world);
    for (const auto& line : ready) {
      auto f = fields_of(line);
      const int rank = std::stoi(f["rank"]);
      const std::string row = row_of(r.err, rank, std::stoi(f["pid"]));
      BOOST_TEST_CONTEXT("rank " << rank << " row '" << row << "'") {
        BOOST_TEST(contains(row, " running "));
        BOOST_TEST(contains(row, " recv "));
        BOOST_TEST(contains(row, word((rank + 1) % world)));  // peer
        BOOST_TEST(contains(row, " 1.0 KiB "));  // 256 float32
        BOOST_TEST(contains(row, " ms"));        // blocked for
      }
    }
    // The abort reached every rank as PeerFailure, which they caught.
    BOOST_TEST(static_cast<int>(lines_starting(r.out, "PEER_FAILURE").size()) == world, r.out);
    BOOST_TEST(contains(r.err, "shmrun: the job was stopped because it exceeded its --timeout"));
  }
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(hang_report, ShmLeakCheck)

BOOST_AUTO_TEST_CASE(timeout_reports_the_deadlock_cycle) {
  check_cycle_report(2, "rank 0 waits for rank 1 (recv), rank 1 waits for rank 0 (recv)");
  check_cycle_report(3,
                     "rank 0 waits for rank 1 (recv), rank 1 waits for rank 2 (recv), "
                     "rank 2 waits for rank 0 (recv)");
}

BOOST_AUTO_TEST_CASE(sigusr1_prints_the_table_without_stopping_the_job) {
  LiveCommand job(shmrun({"-n", "2", "--timeout", "120s", program("fault_rank"), "hang"}),
                  clean_options(120s));
  BOOST_REQUIRE(job.wait_until([&] { return lines_starting(job.out(), "READY").size() == 2; },
                               30s));
  // The ranks block right after saying READY; ask until the report shows both blocked.
  const std::string cycle = "deadlock: rank 0 waits for rank 1 (recv), rank 1 waits for rank 0";
  bool reported = false;
  for (int attempt = 0; attempt < 40 && !reported; ++attempt) {
    job.signal(SIGUSR1);
    reported = job.wait_until([&] { return contains(job.err(), cycle); }, 500ms);
  }
  BOOST_TEST_INFO("stderr:\n" << job.err());
  BOOST_TEST(reported);
  BOOST_TEST(contains(job.err(), "shmrun: state of the job (SIGUSR1):"));
  BOOST_TEST(contains(job.err(), "rings: all empty"));
  BOOST_TEST(!job.exited());
  BOOST_TEST(lines_starting(job.out(), "PEER_FAILURE").empty());  // nothing was aborted
  job.signal(SIGTERM);
  const CommandResult r = job.finish(30s);
  BOOST_TEST(r.exit_code == 128 + SIGTERM);
}

BOOST_AUTO_TEST_SUITE_END()
