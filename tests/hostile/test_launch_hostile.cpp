// shmdist::launch() under hostile hosts and arguments (issue 11 bugs 6-8, issue 12 finding 2
// and the part-way start-up failure), and what dropping an irecv's Work does.
#include <signal.h>

#include <boost/test/unit_test.hpp>

#include <shmdist/shmdist.hpp>

#include "hostile/hostile_helpers.hpp"
#include "support/job.hpp"

using namespace shmdist::test;
using namespace std::chrono_literals;
namespace dist = shmdist;

namespace {
std::string run_hostile_launch(const std::string& mode, const std::string& key) {
  const CommandResult r = run_command({program("hostile_launch"), mode}, clean_options(60s));
  BOOST_TEST_INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
  BOOST_TEST(!r.timed_out);
  BOOST_TEST(r.exit_code == 0);
  const auto lines = lines_starting(r.out, key);
  BOOST_REQUIRE(lines.size() == 1u);
  return lines[0];
}
}  // namespace

BOOST_FIXTURE_TEST_SUITE(launch_hostile, ShmLeakCheck)

// The host ignores SIGCHLD (the kernel reaps the ranks) or another thread reaps with
// waitpid(-1): launch() still returns, with each rank's outcome. (Before: it never returned.)
BOOST_AUTO_TEST_CASE(ranks_reaped_by_someone_else) {
  for (const char* mode : {"sigchld_ignored", "reaper_thread"}) {
    BOOST_TEST_CONTEXT(mode) {
      auto f = fields_of(run_hostile_launch(mode, "OUTCOMES"));
      BOOST_TEST(f["clean"] == "11");
      BOOST_TEST(f["failed"] == "00");
      BOOST_TEST(f["rank1_code"] == "1");
      BOOST_TEST(contains(f["what"] + f["rank0_error"], "PeerFailure"));
    }
  }
}

// Descriptors run out after a few ranks started: SetupError, the started ranks are stopped and
// reaped, and no descriptor is left open. (Before: the ranks stayed, blocked, and fds leaked.)
BOOST_AUTO_TEST_CASE(startup_failing_part_way_cleans_up) {
  auto f = fields_of(run_hostile_launch("fd_limit", "CLEANUP"));
  BOOST_TEST(contains(f["what"], "SetupError"));
  BOOST_TEST(f["children"] == "0");
  BOOST_TEST(f["fds_before"] == f["fds_after"]);
}

// What a rank started and left running is ended with the rank (its process group).
BOOST_AUTO_TEST_CASE(processes_left_by_a_rank_end_with_it) {
  auto f = fields_of(run_hostile_launch("pgroup", "CHILD"));
  BOOST_TEST(f["ok"] == "1");
  BOOST_TEST((f["state"] == "gone" || f["state"] == "Z"), "sleep 77 is in state " << f["state"]);
  // Orphaned, it was re-parented to this test process (a subreaper): reap it by its pid.
  const pid_t pid = std::stoi(f["pid"]);
  if (process_running(pid)) kill(pid, SIGKILL);
  reap_within(pid, 5s);
}

// launch() watches for hangs as shmrun does, in both modes: the report comes once, before
// the job timeout ends the job.
BOOST_AUTO_TEST_CASE(launch_reports_a_hang) {
  for (const char* mode : {"threads", "processes"}) {
    BOOST_TEST_CONTEXT(mode) {
      const CommandResult r = run_command({program("hostile_launch"), "hang", mode}, clean_options(60s));
      BOOST_TEST_INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
      BOOST_TEST(r.exit_code == 0);
      BOOST_TEST(contains(r.out, "DONE errors=11"));
      BOOST_TEST(count_of(r.err, "shmdist::launch: the job looks hung: ") == 1);
      BOOST_TEST(contains(r.err, "shmdist::launch: state of the job (no progress):"));
      BOOST_TEST(contains(r.err, "deadlock: rank 0 waits for rank 1 (recv)"));
      BOOST_TEST(contains(r.err, "LaunchOptions::job_timeout of 5000 ms"));
      BOOST_TEST(r.err.find("looks hung") < r.err.find("(timeout):"));
    }
  }
}

BOOST_AUTO_TEST_CASE(timeouts_are_validated) {
  for (Mode mode : all_modes()) {
    BOOST_TEST_CONTEXT(mode_name(mode)) {
      for (auto bad : {std::chrono::milliseconds(-5), std::chrono::milliseconds(0)}) {
        dist::LaunchOptions o;
        o.mode = mode;
        o.timeout = bad;
        bool ran = false;
        try {
          dist::launch(2, [&](dist::ProcessGroup&) { ran = true; }, o);
          BOOST_ERROR("accepted LaunchOptions::timeout = " << bad.count() << " ms");
        } catch (const dist::InvalidArgument& e) {
          BOOST_TEST(contains(e.what(), "LaunchOptions::timeout must be positive"), e.what());
        }
        BOOST_TEST(!ran);
      }
      dist::LaunchOptions o;
      o.mode = mode;
      o.job_timeout = std::chrono::milliseconds(-1);
      BOOST_CHECK_THROW(dist::launch(1, [](dist::ProcessGroup&) {}, o), dist::InvalidArgument);
    }
  }
}

// The job timeout's PeerFailure names the option that set it.
BOOST_AUTO_TEST_CASE(job_timeout_names_launch_options) {
  for (Mode mode : all_modes()) {
    BOOST_TEST_CONTEXT(mode_name(mode)) {
      dist::LaunchOptions o;
      o.mode = mode;
      o.job_timeout = 500ms;
      o.hang_report = std::chrono::milliseconds(0);
      auto out = dist::launch(2, [](dist::ProcessGroup& pg) {
        dist::Tensor t = dist::zeros(1, dist::kInt);
        pg.recv(t, 1 - pg.get_rank());  // a deadlock
      }, o);
      for (const auto& r : out) {
        BOOST_TEST(contains(r.error, "LaunchOptions::job_timeout"), r.error);
        BOOST_TEST(!contains(r.error, "shmrun --timeout"), r.error);
      }
    }
  }
}

// Dropping an irecv's Work keeps the receive posted (as in torch.distributed, and as
// MPI_Request_free does): the message it matches still lands in its tensor, and the next
// receive gets the next message.
BOOST_AUTO_TEST_CASE(dropped_irecv_work_stays_posted) {
  for (Mode mode : all_modes()) {
    BOOST_TEST_CONTEXT(mode_name(mode)) {
      expect_job_ok(2, [](dist::ProcessGroup& pg) {
        if (pg.get_rank() == 1) {
          dist::Tensor first = dist::zeros(1, dist::kInt);
          { (void)pg.irecv(first, 0); }  // the Work is dropped at once
          dist::Tensor second = dist::zeros(1, dist::kInt);
          pg.recv(second, 0);
          RANK_REQUIRE_EQ(second.data<int>()[0], 22);
          RANK_REQUIRE_EQ(first.data<int>()[0], 11);
        } else {
          for (int v : {11, 22}) {
            dist::Tensor t = dist::zeros(1, dist::kInt);
            t.data<int>()[0] = v;
            pg.send(t, 1);
          }
        }
      });
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
