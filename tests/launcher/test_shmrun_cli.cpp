// shmrun's command line: --help, --version, and clear errors (never a started job) for
// options it cannot accept and programs it cannot run.
#include <sys/stat.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <fstream>

#include <shmdist/version.hpp>

#include "launcher/shmrun_helpers.hpp"
#include "support/shm_check.hpp"

using namespace shmdist::test;

BOOST_FIXTURE_TEST_SUITE(shmrun_cli, ShmLeakCheck)

BOOST_AUTO_TEST_CASE(help_lists_every_option) {
  const CommandResult r = run_command(shmrun({"--help"}), clean_options());
  BOOST_TEST(r.exit_code == 0);
  for (const char* option : {"-n,--nproc", "--tag-output", "--bind-to", "--ring-size",
                             "--timeout", "--grace", "--hang-report", "--version", "--help"})
    BOOST_TEST(contains(r.out, option), "--help does not mention " << option);
}

BOOST_AUTO_TEST_CASE(version_names_the_project_version) {
  const CommandResult r = run_command(shmrun({"--version"}), clean_options());
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(r.out == std::string("shmrun (shmdist) ") + shmdist::kVersionString + "\n");
}

// Each bad command line: exit 2 (a usage error, as docs/launcher.md says; bad option values
// included), one message that starts with "shmrun:" and names the problem, and no rank started.
BOOST_AUTO_TEST_CASE(bad_options_give_clear_errors) {
  const std::string probe = program("probe_env");
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"-n", "0", probe}, "--nproc: Value 0 not in range 1 to 1024"},
      {{"-n", "-3", probe}, "--nproc"},
      {{"-n", "abc", probe}, "--nproc"},
      {{"-n", "2000", probe}, "not in range 1 to 1024"},
      {{probe}, "--nproc is required"},
      {{"-n", "2"}, "PROGRAM is missing"},
      {{"-n", "2", "--"}, "PROGRAM is missing"},
      {{"-n"}, "-n"},
      {{"-n", "2", "--ring-size", "3000", probe},
       "--ring-size = 3000 bytes: expected a power of two from 4096"},
      {{"-n", "2", "--ring-size", "0", probe}, "--ring-size = 0 bytes"},
      {{"-n", "2", "--ring-size", "2G", probe}, "--ring-size = 2147483648 bytes"},
      {{"-n", "2", "--ring-size", "64Q", probe}, "--ring-size = '64Q' is not a byte size"},
      {{"-n", "2", "--bind-to", "foo", probe}, "--bind-to: foo not in {none,core}"},
      {{"-n", "2", "--timeout", "abc", probe}, "--timeout = 'abc' is not a duration"},
      {{"-n", "2", "--timeout", "0", probe}, "--timeout = '0' is not a duration"},
      {{"-n", "2", "--timeout", "-5s", probe}, "--timeout = '-5s' is not a duration"},
      {{"-n", "2", "--timeout", "5 parsecs", probe}, "--timeout = '5 parsecs' is not a duration"},
      {{"-n", "2", "--grace", "soon", probe}, "--grace = 'soon' is not a duration"},
      {{"-n", "2", "--grace", "xyz", probe}, "--grace = 'xyz' is not a duration"},
      {{"-n", "2", "--timeout", "garbage", probe}, "--timeout = 'garbage' is not a duration"},
      {{"-n", "2", "--ring-size", "3", probe}, "--ring-size = 3 bytes"},
      // 2^44 + 1 MiB wrapped to 1 MiB, 2^34 GiB to 0 bytes, before the product was checked.
      {{"-n", "2", "--ring-size", "17592186044417M", probe},
       "--ring-size = '17592186044417M' is too large"},
      {{"-n", "2", "--ring-size", "17179869184G", probe}, "--ring-size = '17179869184G' is too large"},
      {{"-n", "2", "--hang-report", "later", probe}, "--hang-report = 'later' is not a duration"},
      {{"-n", "2", "--frobnicate", probe}, "--frobnicate"},
  };
  for (const Case& c : cases) {
    std::string line;
    for (const auto& a : c.args) line += " " + a;
    BOOST_TEST_CONTEXT("shmrun" << line) {
      const CommandResult r = run_command(shmrun(c.args), clean_options());
      BOOST_TEST(r.exit_code == 2);
      BOOST_TEST(r.err.rfind("shmrun: ", 0) == 0, "stderr: " << r.err);
      BOOST_TEST(contains(r.err, c.expected), "stderr: " << r.err);
      BOOST_TEST(r.out.empty(), "a rank ran: " << r.out);
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_ring_size_in_the_environment_is_named) {
  CommandOptions o = clean_options();
  o.env = {{"SHMDIST_RING_SIZE", "5"}};
  const CommandResult r = run_command(shmrun({"-n", "2", program("probe_env")}), o);
  BOOST_TEST(r.exit_code == 1);
  BOOST_TEST(contains(r.err, "shmrun: SHMDIST_RING_SIZE = 5 bytes: expected a power of two"),
             r.err);
  BOOST_TEST(r.out.empty());
}

// Every SHMDIST_* variable the ranks would read is checked by shmrun before any rank starts
// (issue 27, item 9): a bad one is reported once, as "shmrun: ..." like a bad option, and
// shmrun exits 1 (docs/launcher.md), instead of every rank failing at its join (or, for a
// program that never joins, the job running with it). probe_env does not join: before the
// check, these jobs ran and exited 0.
BOOST_AUTO_TEST_CASE(bad_shmdist_variables_are_refused_before_any_rank_starts) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"SHMDIST_SPIN_US", "x"},          {"SHMDIST_LOCAL_CPUS", "0"},
      {"SHMDIST_HEALTH_CHECK_MS", "0"},  {"SHMDIST_HANG_REPORT", "soon"},
      {"SHMDIST_SINGLE_COPY", "1K"},     {"SHMDIST_HOST_ID", ""},
      {"SHMDIST_RING_SIZE", "lots"},
  };
  for (const auto& [name, value] : cases) {
    BOOST_TEST_CONTEXT(name << "='" << value << "'") {
      CommandOptions o = clean_options();
      o.env = {{name, value}};
      const CommandResult r = run_command(shmrun({"-n", "3", program("probe_env")}), o);
      BOOST_TEST(r.exit_code == 1, r.err);
      BOOST_TEST(r.err.rfind("shmrun: ", 0) == 0, "stderr: " << r.err);
      BOOST_TEST(count_of(r.err, name) == 1, "stderr: " << r.err);  // once, not per rank
      BOOST_TEST(count_of(r.err, "\n") == 1, "stderr: " << r.err);
      BOOST_TEST(r.out.empty(), "a rank ran: " << r.out);
    }
  }
  // The variables of the launch protocol are shmrun's to set: an inherited value (a shmrun
  // started by a rank of another job) is replaced, not refused.
  CommandOptions o = clean_options();
  o.env = {{"SHMDIST_SEGMENT_FD", "nonsense"}, {"SHMDIST_JOB_KEY", "nonsense"}};
  const CommandResult r = run_command(shmrun({"-n", "2", program("probe_env"), "join"}), o);
  BOOST_TEST(r.exit_code == 0, r.err);
  BOOST_TEST(count_of(r.out, "JOINED") == 2, r.out);
}

// A segment larger than the machine can hold is refused before anything starts, saying how
// much it needs (64 ranks x 63 rings x 1 GiB is far beyond any memory), and leaves nothing.
// (shmrun's segment is a memfd: memory, not /dev/shm space.)
BOOST_AUTO_TEST_CASE(segment_too_large_for_memory_says_how_much_it_needs) {
  const auto objects_before = shm_objects();
  const CommandResult r =
      run_command(shmrun({"-n", "64", "--ring-size", "1G", program("probe_env")}), clean_options());
  BOOST_TEST(r.exit_code == 1);
  BOOST_TEST(contains(r.err, "the shared segment needs 41287"), r.err);  // 4032 GiB in MiB
  BOOST_TEST(contains(r.err, "MiB of memory but only"), r.err);
  BOOST_TEST(r.out.empty());
  BOOST_TEST(shm_objects() == objects_before);
}

// The launcher says once why the program cannot run (not once per rank) and exits as a
// shell would: 127 for a missing program, 126 for one that exists but cannot be executed.
BOOST_AUTO_TEST_CASE(program_that_cannot_run) {
  char dir_template[] = "/tmp/shmrun-test-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string not_executable = dir + "/data.txt";
  std::ofstream(not_executable) << "just text\n";
  chmod(not_executable.c_str(), 0644);
  struct Case {
    std::string program;
    int code;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {dir + "/missing", 127, "cannot run '" + dir + "/missing': No such file or directory"},
      {"shmdist-no-such-program", 127, "not found in PATH"},
      {not_executable, 126, "Permission denied"},
      {dir, 126, "Permission denied"},
  };
  for (const Case& c : cases) {
    BOOST_TEST_CONTEXT("program " << c.program) {
      const CommandResult r = run_command(shmrun({"-n", "3", c.program}), clean_options());
      BOOST_TEST(r.exit_code == c.code);
      BOOST_TEST(count_of(r.err, "cannot run") == 1, "stderr: " << r.err);
      BOOST_TEST(contains(r.err, c.expected), "stderr: " << r.err);
    }
  }
  std::remove(not_executable.c_str());
  rmdir(dir.c_str());
}

// Everything from PROGRAM on is the program's, in order: its options are not shmrun's, even
// when they look like them (-n), and "--" after PROGRAM is passed on too.
BOOST_AUTO_TEST_CASE(program_arguments_pass_through_unchanged) {
  const std::vector<std::string> args = {"a", "-c", "--x", "-n", "5", "--", "--timeout", "b c"};
  std::string expected;
  for (const auto& a : args) expected += a + "|";
  for (const bool dashdash : {false, true}) {
    std::vector<std::string> argv = {"-n", "2", "--tag-output"};
    if (dashdash) argv.push_back("--");
    argv.push_back("printf");
    argv.push_back("%s|");
    argv.insert(argv.end(), args.begin(), args.end());
    const CommandResult r = run_command(shmrun(argv), clean_options());
    BOOST_TEST_CONTEXT("with -- before PROGRAM: " << dashdash) {
      BOOST_TEST(r.exit_code == 0, r.err);
      BOOST_TEST(contains(r.out, "[0] " + expected + "\n"), r.out);
      BOOST_TEST(contains(r.out, "[1] " + expected + "\n"), r.out);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
