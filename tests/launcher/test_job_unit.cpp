// lib/job's pure parts: duration parsing, the wait-for cycle search, the hang report built
// from a crafted segment, the watchdog on a crafted segment, and the words used for how a
// rank ended.
#include <signal.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <fstream>
#include <sstream>
#include <thread>

#include <shmdist/errors.hpp>

#include "base/duration.hpp"
#include "job/diagnosis.hpp"
#include "job/spawn.hpp"
#include "job/supervisor.hpp"
#include "job/watchdog.hpp"
#include "segment/job_state.hpp"

using namespace shmdist;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_SUITE(job_units)

BOOST_AUTO_TEST_CASE(durations) {
  BOOST_TEST(env::parse_duration("30s", "--timeout").count() == 30'000);
  BOOST_TEST(env::parse_duration("30", "--timeout").count() == 30'000);
  BOOST_TEST(env::parse_duration("500ms", "--timeout").count() == 500);
  BOOST_TEST(env::parse_duration("1.5s", "--timeout").count() == 1'500);
  BOOST_TEST(env::parse_duration("5m", "--timeout").count() == 300'000);
  BOOST_TEST(env::parse_duration("2h", "--timeout").count() == 7'200'000);
  for (const char* bad : {"", "abc", "0", "-1s", "5x", "s", "nan", "inf", "1e300", "10 s"}) {
    BOOST_TEST_CONTEXT("'" << bad << "'") {
      BOOST_CHECK_EXCEPTION(env::parse_duration(bad, "--timeout"), InvalidArgument,
                            [&](const InvalidArgument& e) {
                              return std::string(e.what()).find("--timeout = '") == 0;
                            });
    }
  }
}

namespace {
job::RankSnapshot blocked(int rank, int peer, std::uint32_t op = segment::kBlockedRecv) {
  job::RankSnapshot s;
  s.rank = rank;
  s.state = static_cast<std::uint32_t>(segment::RankState::Running);
  s.op = op;
  s.peer = peer;
  return s;
}
job::RankSnapshot idle(int rank) { return blocked(rank, -1, 0); }
}  // namespace

BOOST_AUTO_TEST_CASE(wait_for_cycles) {
  using Cycle = std::vector<int>;
  BOOST_TEST(*job::find_wait_cycle({blocked(0, 1), blocked(1, 0)}) == Cycle({0, 1}));
  BOOST_TEST(*job::find_wait_cycle({blocked(0, 1), blocked(1, 2), blocked(2, 0)}) ==
             Cycle({0, 1, 2}));
  // A chain into a cycle reports the cycle only.
  BOOST_TEST(*job::find_wait_cycle({blocked(0, 2), blocked(1, 3), blocked(2, 3), blocked(3, 2)}) ==
             Cycle({2, 3}));
  BOOST_TEST(!job::find_wait_cycle({blocked(0, 1), idle(1)}));
  BOOST_TEST(!job::find_wait_cycle({blocked(0, -1), blocked(1, 0)}));  // any source: no edge
  BOOST_TEST(!job::find_wait_cycle({}));
  // A rank that is not running (ended, finalized) waits for nothing.
  auto ended = blocked(1, 0);
  ended.state = static_cast<std::uint32_t>(segment::RankState::Ended);
  BOOST_TEST(!job::find_wait_cycle({blocked(0, 1), ended}));
  // Out-of-range peers (a torn or corrupt record) are ignored, not followed.
  BOOST_TEST(!job::find_wait_cycle({blocked(0, 7), blocked(1, -5)}));
}

BOOST_AUTO_TEST_CASE(hang_report_from_a_crafted_segment) {
  auto seg = segment::Segment::create_anonymous(3, 4096);
  for (int r = 0; r < 3; ++r) {
    auto& rc = seg.rank_control(r);
    rc.pid.store(1000 + r);
    rc.state.store(static_cast<std::uint32_t>(segment::RankState::Running));
  }
  auto block = [&](int rank, std::uint32_t op, int peer, int tag, std::uint64_t bytes) {
    auto& b = seg.rank_control(rank).blocked;
    b.op.store(op);
    b.peer.store(peer);
    b.tag.store(tag);
    b.bytes.store(bytes);
    b.since_ns.store(segment::wall_clock_ns() - 1'500'000'000);
  };
  block(0, segment::kBlockedRecv, 1, 5, 1024);
  block(1, segment::kBlockedSend, 0, 6, 3 << 20);
  seg.ring_control(1, 0).head_hint.store(2048);  // 2 KiB unread from rank 1 to rank 0
  std::ostringstream report;
  job::print_hang_report(seg, report, "shmrun", "SIGUSR1");
  const std::string text = report.str();
  BOOST_TEST_INFO(text);
  BOOST_TEST(text.find("shmrun: state of the job (SIGUSR1):") == 0);
  BOOST_TEST(text.find("1000 ") != std::string::npos);
  BOOST_TEST(text.find("recv") != std::string::npos);
  BOOST_TEST(text.find("3.0 MiB") != std::string::npos);
  BOOST_TEST(text.find("1.0 KiB") != std::string::npos);
  BOOST_TEST(text.find("not in a blocking call") != std::string::npos);  // rank 2
  BOOST_TEST(text.find("1 -> 0: 2.0 KiB of 4.0 KiB") != std::string::npos);
  BOOST_TEST(text.find("deadlock: rank 0 waits for rank 1 (recv), "
                       "rank 1 waits for rank 0 (send)") != std::string::npos);
}

namespace {
// What `fn` writes to standard error (the watchdog's messages and reports go there).
std::string stderr_of(const std::function<void()>& fn) {
  std::fflush(stderr);
  std::FILE* file = std::tmpfile();
  BOOST_TEST_REQUIRE(file != nullptr);
  const int saved = dup(STDERR_FILENO);
  dup2(fileno(file), STDERR_FILENO);
  try {
    fn();
  } catch (...) {
    dup2(saved, STDERR_FILENO);
    close(saved);
    std::fclose(file);
    throw;
  }
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::string text;
  std::rewind(file);
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file)) > 0;) text.append(buf, n);
  std::fclose(file);
  return text;
}
}  // namespace

// The one watchdog of shmrun and launch(), on a crafted deadlock and with the times given to
// it (no clock in the verdicts): it samples at start and every quarter of the hang interval,
// reports the stall once when it has lasted the interval, and says once that the job timeout
// has passed. SIGUSR1 is offered only by an owner that handles it (shmrun).
BOOST_AUTO_TEST_CASE(watchdog_reports_a_stall_once_and_the_timeout_once) {
  for (const bool sigusr1 : {false, true}) {
    BOOST_TEST_CONTEXT("sigusr1_reports " << sigusr1) {
      auto seg = segment::Segment::create_anonymous(2, 4096);
      for (int r = 0; r < 2; ++r) {
        auto& rc = seg.rank_control(r);
        rc.pid.store(getpid());
        rc.state.store(static_cast<std::uint32_t>(segment::RankState::Running));
        rc.blocked.op.store(segment::kBlockedRecv);
        rc.blocked.peer.store(1 - r);
        rc.blocked.since_ns.store(segment::wall_clock_ns());
      }
      job::WatchdogOptions o;
      o.name = "dog";
      o.job_timeout = 10s;
      o.hang_report = 1s;
      o.timeout_setting = "--timeout";
      o.hang_report_setting = "--hang-report";
      o.sigusr1_reports = sigusr1;
      job::Watchdog dog(seg, o);
      job::JobView ranks;
      ranks.pids = {getpid(), getpid()};
      ranks.ended = {"", ""};
      const auto t0 = job::Watchdog::Clock::now();
      BOOST_TEST((dog.next_check() == job::Watchdog::Clock::time_point::max()));  // not started
      dog.start(t0);
      BOOST_TEST((dog.next_check() == t0));
      std::string quiet = stderr_of([&] {
        BOOST_TEST(!dog.check(t0, ranks));
        BOOST_TEST((dog.next_check() == t0 + 250ms));
        BOOST_TEST(!dog.check(t0 + 250ms, ranks));  // still for 250 ms of 1 s
      });
      BOOST_TEST(quiet.empty(), quiet);
      const std::string hung = stderr_of([&] { BOOST_TEST(!dog.check(t0 + 1500ms, ranks)); });
      BOOST_TEST_INFO(hung);
      BOOST_TEST(hung.find("dog: the job looks hung: ") == 0);
      BOOST_TEST(hung.find("--hang-report sets the interval") != std::string::npos);
      BOOST_TEST((hung.find("SIGUSR1") != std::string::npos) == sigusr1);
      BOOST_TEST(hung.find("dog: state of the job (no progress):") != std::string::npos);
      BOOST_TEST(hung.find("deadlock: rank 0 waits for rank 1 (recv)") != std::string::npos);
      quiet = stderr_of([&] { BOOST_TEST(!dog.check(t0 + 3s, ranks)); });  // reported already
      BOOST_TEST(quiet.empty(), quiet);
      const std::string timeout = stderr_of([&] { BOOST_TEST(dog.check(t0 + 10s, ranks)); });
      BOOST_TEST_INFO(timeout);
      BOOST_TEST(timeout.find("dog: the job did not finish within its --timeout of 10000 ms") !=
                 std::string::npos);
      BOOST_TEST(timeout.find("dog: state of the job (timeout):") != std::string::npos);
      BOOST_TEST(timeout.find("looks hung") == std::string::npos);
      quiet = stderr_of([&] { BOOST_TEST(!dog.check(t0 + 11s, ranks)); });  // once
      BOOST_TEST(quiet.empty(), quiet);
    }
  }
}

// Without a job timeout or a hang interval the watchdog has nothing to do.
BOOST_AUTO_TEST_CASE(watchdog_off) {
  auto seg = segment::Segment::create_anonymous(2, 4096);
  job::Watchdog dog(seg, job::WatchdogOptions{});
  dog.start(job::Watchdog::Clock::now());
  BOOST_TEST((dog.next_check() == job::Watchdog::Clock::time_point::max()));
}

BOOST_AUTO_TEST_CASE(how_ranks_end_in_words) {
  BOOST_TEST(segment::describe_end(segment::EndKind::Exited, 3) == "exited with code 3");
  BOOST_TEST(segment::describe_end(segment::EndKind::Signaled, 9) ==
             "was killed by signal 9 (SIGKILL)");
  BOOST_TEST(segment::signal_name(11) == "SIGSEGV");
  BOOST_TEST(segment::signal_name(200) == "signal 200");
  job::RankResult r;
  r.kind = segment::EndKind::Signaled;
  r.code = 15;
  BOOST_TEST(r.exit_status() == 143);
  BOOST_TEST(r.failed());
  r.kind = segment::EndKind::Exited;
  r.code = 0;
  BOOST_TEST(!r.failed());
}

// The first failure wins; a "gone" record is completed with the exact end once known, and a
// peer reporting a death the launcher already recorded uses the launcher's words.
BOOST_AUTO_TEST_CASE(failure_records_keep_the_best_knowledge) {
  auto seg = segment::Segment::create_anonymous(3, 4096);
  seg.rank_control(1).pid.store(4242);
  BOOST_TEST(segment::record_job_failure(seg, 1, segment::EndKind::Vanished, 0));
  BOOST_TEST(segment::describe_job_failure(seg).find("rank 1 (pid 4242) is gone") !=
             std::string::npos);
  BOOST_TEST(!segment::record_job_failure(seg, 2, segment::EndKind::Exited, 7));  // later: ignored
  BOOST_TEST(!segment::record_job_failure(seg, 1, segment::EndKind::Signaled, 9));  // refines
  BOOST_TEST(segment::describe_job_failure(seg).find(
                 "rank 1 (pid 4242) was killed by signal 9 (SIGKILL)") != std::string::npos);

  auto seg2 = segment::Segment::create_anonymous(2, 4096);
  segment::record_rank_end(seg2, 0, segment::EndKind::Exited, 3);
  segment::record_job_failure(seg2, 0, segment::EndKind::Vanished, 0);
  BOOST_TEST(segment::describe_job_failure(seg2).find("rank 0 exited with code 3") !=
             std::string::npos, segment::describe_job_failure(seg2));

  auto seg3 = segment::Segment::create_anonymous(2, 4096);
  segment::record_job_failure(seg3, -1, segment::EndKind::None, 0);  // launcher abort
  BOOST_TEST(seg3.header().failed_rank.load() == segment::kAbortedFirst);
  BOOST_TEST(segment::describe_job_failure(seg3).find("aborted") != std::string::npos);
}

// An abort without a rank (a shared identity, a launcher's time limit) is the first cause: a
// rank that ended because of it and that a peer then saw vanish is not named instead. (CI, on
// two jobs started at once with one identity: the identity's holder aborted the job, raised
// PeerFailure and exited; the other job's rank 1 saw it gone before it read the abort, and
// every later reader was told "rank 0 is gone without finalizing".) A rank that failed before
// the abort stays the cause, and so does the first of two aborts' reasons.
BOOST_AUTO_TEST_CASE(an_abort_stays_the_cause_of_the_ends_after_it) {
  for (const auto reason : {segment::AbortReason::SharedIdentity, segment::AbortReason::Timeout}) {
    auto seg = segment::Segment::create_anonymous(2, 4096);
    segment::record_job_abort(seg, reason);
    BOOST_TEST(!segment::record_job_failure(seg, 0, segment::EndKind::Vanished, 0));
    BOOST_TEST(!segment::record_job_failure(seg, 1, segment::EndKind::Exited, 1));
    const std::string why = segment::describe_job_failure(seg);
    BOOST_TEST(why.find(reason == segment::AbortReason::SharedIdentity
                            ? "a second job was started with the same identity"
                            : "time limit") != std::string::npos, why);
    BOOST_TEST(why.find("peer failure") == std::string::npos, why);  // names no rank's end
  }
  auto twice = segment::Segment::create_anonymous(2, 4096);  // the first reason stands
  segment::record_job_abort(twice, segment::AbortReason::SharedIdentity);
  segment::record_job_abort(twice, segment::AbortReason::Timeout);
  BOOST_TEST(segment::describe_job_failure(twice).find("same identity") != std::string::npos,
             segment::describe_job_failure(twice));
  auto seg = segment::Segment::create_anonymous(2, 4096);
  segment::record_rank_end(seg, 1, segment::EndKind::Signaled, 9);
  BOOST_TEST(segment::record_job_failure(seg, 1, segment::EndKind::Signaled, 9));
  segment::record_job_abort(seg, segment::AbortReason::Timeout);
  BOOST_TEST(seg.header().failed_rank.load() == 1);
  BOOST_TEST(segment::describe_job_failure(seg).find("rank 1 was killed by signal 9") !=
             std::string::npos, segment::describe_job_failure(seg));
}

namespace {
char process_state(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ? '?' : line[paren + 2];
}
}  // namespace

// Ranks reaped in one batch are handled in rank order. Rank 0 exits 42 because rank 1 died
// (a peer recorded rank 1 as failed in the segment first); rank 1 was killed. The job's
// failure is rank 1's, with its exact end, not rank 0's exit 42.
BOOST_AUTO_TEST_CASE(supervisor_blames_the_rank_the_segment_names) {
  auto seg = segment::Segment::create_anonymous(3, 4096);
  std::vector<pid_t> pids;
  job::SpawnSpec spec;
  pids.push_back(job::spawn_function(spec, [] { return 42; }));
  pids.push_back(job::spawn_function(spec, [&] {
    segment::record_job_failure(seg, 1, segment::EndKind::Vanished, 0);
    raise(SIGKILL);
    return 1;
  }));
  pids.push_back(job::spawn_function(spec, [] { return 0; }));
  // Let all three end before supervising, so that one poll() reaps them together: the case
  // is about that batch, so it checks that every child is a zombie before it supervises.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (pid_t pid : pids)
    while (process_state(pid) != 'Z' && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
  for (pid_t pid : pids)
    BOOST_REQUIRE_MESSAGE(process_state(pid) == 'Z',
                          "child " << pid << " had not ended within 30 s (state '"
                                   << process_state(pid) << "'), so the batch premise fails");
  job::SupervisorOptions options;
  options.name = "test";
  job::JobSupervisor supervisor(seg, options);
  for (int r = 0; r < 3; ++r) supervisor.add_rank(r, pids[static_cast<std::size_t>(r)]);
  BOOST_TEST(supervisor.run() == 128 + SIGKILL);
  BOOST_TEST(supervisor.results()[0].code == 42);
  BOOST_TEST((supervisor.results()[1].kind == segment::EndKind::Signaled));
  const std::string failure = segment::describe_job_failure(seg);
  BOOST_TEST(failure.find("rank 1") != std::string::npos, failure);
  BOOST_TEST(failure.find("was killed by signal 9 (SIGKILL)") != std::string::npos, failure);
}

BOOST_AUTO_TEST_SUITE_END()
