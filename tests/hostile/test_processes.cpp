// shmrun and its processes: SIGCHLD ignored by whoever started it (issue 12, finding 2),
// processes the ranks leave behind (issue 11, bug 6), a signal during start-up (issue 12,
// finding 4), a rank writing without newlines under --tag-output (issue 12, smaller).
#include <signal.h>

#include <boost/test/unit_test.hpp>

#include "hostile/hostile_helpers.hpp"

using namespace shmdist::test;
using namespace std::chrono_literals;

BOOST_FIXTURE_TEST_SUITE(processes, ShmLeakCheck)

// An ignored SIGCHLD survives exec; the kernel would reap the ranks behind shmrun's back.
// (Before: shmrun spun forever at 100% CPU.)
BOOST_AUTO_TEST_CASE(sigchld_ignored_by_the_parent) {
  for (const char* program_text : {"true", "false"}) {
    BOOST_TEST_CONTEXT(program_text) {
      const CommandResult r = run_command(
          {"perl", "-e", "$SIG{CHLD}='IGNORE'; exec @ARGV", shmrun_path(), "-n", "2", "--",
           program_text},
          clean_options(30s));
      BOOST_TEST(!r.timed_out);
      BOOST_TEST(r.exit_code == (std::string(program_text) == "true" ? 0 : 1), r.err);
    }
  }
}

// A process a rank started (`sleep 77`), with or without setsid, does not outlive the job.
BOOST_AUTO_TEST_CASE(processes_left_by_ranks_are_ended_with_the_job) {
  for (const char* setsid : {"0", "1"}) {
    BOOST_TEST_CONTEXT("setsid " << setsid) {
      const CommandResult r = run_command(
          shmrun({"-n", "2", "--grace", "1s", program("hostile_rank"), "spawn", setsid}),
          clean_options(60s));
      BOOST_TEST_INFO("stdout:\n" << r.out << "stderr:\n" << r.err);
      BOOST_TEST(r.exit_code == 0);
      const auto pids = pids_on(r.out, "CHILD");
      BOOST_TEST(pids.size() == 2u);
      for (pid_t pid : pids) {
        const bool alive = process_running(pid);
        BOOST_TEST(!alive, "pid " << pid << " (sleep 77) outlived the job");
        if (alive) {
          kill(pid, SIGKILL);  // a pid our own test program printed
          reap_within(pid, 5s);
        }
        BOOST_TEST(contains(r.err, "shmrun: ending pid " + std::to_string(pid) + " (sleep)"), r.err);
      }
    }
  }
}

namespace {
// Whether `pid` holds a descriptor of a named /dev/shm object (one not yet unlinked): read
// from /proc/<pid>/fd, so other jobs on the machine cannot be mistaken for it.
bool holds_shm_name(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  for (int fd = 0; fd < 64; ++fd) {
    char target[512];
    const std::string link = dir + "/" + std::to_string(fd);
    const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    const std::string t(target, static_cast<std::size_t>(n));
    if (t.rfind("/dev/shm/", 0) == 0 && t.find("(deleted)") == std::string::npos) return true;
  }
  return false;
}
}  // namespace

// shmrun's segment has no name: a SIGTERM during the preallocation of a large segment leaves
// nothing in /dev/shm, and shmrun never holds a named object while it starts. (Before: the
// name existed from shm_open until after posix_fallocate, and stayed if the signal came
// meanwhile.)
BOOST_AUTO_TEST_CASE(signal_during_startup_leaves_nothing) {
  const auto objects_before = shm_objects();
  bool seen = false;
  CommandOptions o = clean_options(60s);
  o.on_start = [&](pid_t pid) {
    for (int i = 0; i < 300 && !seen; ++i) {
      seen |= holds_shm_name(pid);
      usleep(500);
    }
    kill(pid, SIGTERM);  // the pid run_command just started
  };
  run_command(shmrun({"-n", "4", "--ring-size", "64M", program("probe_env")}), o);
  BOOST_TEST(!seen, "shmrun held a named /dev/shm object during start-up");
  BOOST_TEST(no_new_shm_objects(objects_before));
}

// --tag-output cuts a line without newline at 64 KiB instead of buffering it all.
BOOST_AUTO_TEST_CASE(tag_output_caps_a_line) {
  const CommandResult r = run_command(
      shmrun({"-n", "1", "--tag-output", program("hostile_rank"), "chatter", "200"}),
      clean_options(60s));
  BOOST_TEST(r.exit_code == 0, r.err);
  std::size_t lines = 0, bytes = 0, longest = 0;
  for (std::size_t pos = 0; pos < r.out.size();) {
    const std::size_t nl = r.out.find('\n', pos);
    const std::string line = r.out.substr(pos, nl == std::string::npos ? nl : nl - pos);
    BOOST_TEST(line.rfind("[0] ", 0) == 0u);
    longest = std::max(longest, line.size() - 4);
    bytes += line.size() - 4;
    ++lines;
    pos = nl == std::string::npos ? r.out.size() : nl + 1;
  }
  BOOST_TEST(bytes == 200u * 1024u);  // nothing lost
  BOOST_TEST(longest == 64u * 1024u);
  BOOST_TEST(lines == 4u);  // 64 + 64 + 64 + 8 KiB
}

BOOST_AUTO_TEST_SUITE_END()
