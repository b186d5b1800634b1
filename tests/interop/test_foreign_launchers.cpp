// Ranks started by another launcher: torchrun-style variables from a plain shell loop, Open
// MPI's mpirun, and the rendezvous rules (separate jobs never collide, stale segments are
// replaced, not joined).
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>

#include "bootstrap/rendezvous.hpp"
#include "segment/named_object.hpp"
#include "segment/segment.hpp"
#include "support/process.hpp"
#include "support/shm_check.hpp"

using shmdist::test::CommandOptions;
using shmdist::test::CommandResult;
using shmdist::test::examples_dir;
using shmdist::test::run_command;

namespace {

int unique_port(int salt) { return 20000 + (getpid() * 7 + salt * 131) % 30000; }

// Starts `n` ranks of an example with torchrun's variables from a shell loop.
CommandResult torchrun_style(const std::string& example, int n, int port) {
  const std::string script =
      "for r in $(seq 0 " + std::to_string(n - 1) + "); do RANK=$r WORLD_SIZE=" +
      std::to_string(n) + " LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
      std::to_string(port) + " '" + examples_dir() + "/" + example +
      "' & done; status=0; for j in $(jobs -p); do wait $j || status=1; done; exit $status";
  CommandOptions options;
  options.timeout = std::chrono::seconds(60);
  options.unset_env = {"SHMDIST_SEGMENT_FD", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                       "PMI_RANK", "PMI_SIZE"};
  return run_command({"bash", "-c", script}, options);
}

std::string find_mpirun() {
  for (const char* p : {"/usr/bin/mpirun", "/usr/local/bin/mpirun"})
    if (access(p, X_OK) == 0) return p;
  return {};
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(foreign, shmdist::test::ShmLeakCheck)

BOOST_AUTO_TEST_CASE(seed_examples_under_torchrun_variables) {
  auto r1 = torchrun_style("seed1_send_recv", 2, unique_port(1));
  BOOST_TEST(r1.exit_code == 0, r1.err);
  BOOST_TEST(r1.out == "Received from 0: tensor([10, 20, 30, 40])\n");

  auto r2 = torchrun_style("seed2_any_source", 3, unique_port(2));
  BOOST_TEST(r2.exit_code == 0, r2.err);
  BOOST_TEST((r2.out == "Received from 0: tensor([1, 2, 3])\n" ||
              r2.out == "Received from 1: tensor([4, 5, 6])\n"),
             r2.out);
  BOOST_TEST(r2.err.find("arrived and was never received") != std::string::npos, r2.err);

  auto r3 = torchrun_style("seed3_subgroup", 2, unique_port(3));
  BOOST_TEST(r3.exit_code == 0, r3.err);
  BOOST_TEST(r3.out == "From 0 in subgroup: tensor([7., 8., 9.])\n");
}

BOOST_AUTO_TEST_CASE(two_jobs_with_different_ports_do_not_collide) {
  const int p1 = unique_port(4), p2 = unique_port(5);
  const std::string loop = [&] {
    std::string s;
    for (int port : {p1, p2})
      for (int r = 0; r < 2; ++r)
        s += "RANK=" + std::to_string(r) + " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
             std::to_string(port) + " '" + examples_dir() + "/seed1_send_recv' & ";
    return s;
  }();
  CommandOptions options;
  options.timeout = std::chrono::seconds(60);
  options.unset_env = {"SHMDIST_SEGMENT_FD"};
  const auto r = run_command(
      {"bash", "-c", loop + "status=0; for j in $(jobs -p); do wait $j || status=1; done; exit $status"},
      options);
  BOOST_TEST(r.exit_code == 0, r.err);
  BOOST_TEST(r.out == "Received from 0: tensor([10, 20, 30, 40])\n"
                      "Received from 0: tensor([10, 20, 30, 40])\n");
}

// A segment left by a crashed job under the same name (its creator is dead) is replaced.
BOOST_AUTO_TEST_CASE(stale_segment_is_replaced_not_joined) {
  const int port = unique_port(6);
  const std::string name =
      shmdist::detail::rendezvous_name("torch:127.0.0.1:" + std::to_string(port), 2);
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  {
    const auto stale = shmdist::segment::create_named_object(name, 2, 64 << 10);
    BOOST_REQUIRE(stale.segment);
    stale.segment->header().creator_pid = dead;
    stale.segment->rank_control(1).state.store(1);  // a rank of the crashed job had joined
    stale.segment->rank_control(1).pid.store(dead);
  }  // unmapped and closed, but its name stays in /dev/shm like a crash's would
  const auto r = torchrun_style("seed1_send_recv", 2, port);
  BOOST_TEST(r.exit_code == 0, r.err);
  BOOST_TEST(r.out == "Received from 0: tensor([10, 20, 30, 40])\n");
  BOOST_TEST(r.err.find("replacing the stale segment") != std::string::npos, r.err);
}

BOOST_AUTO_TEST_CASE(missing_master_port_is_a_setup_error) {
  CommandOptions options;
  options.timeout = std::chrono::seconds(30);
  options.env = {{"RANK", "0"}, {"WORLD_SIZE", "2"}};
  options.unset_env = {"SHMDIST_SEGMENT_FD", "MASTER_ADDR", "MASTER_PORT"};
  const auto r = run_command({examples_dir() + "/seed1_send_recv"}, options);
  BOOST_TEST(r.exit_code != 0);
  BOOST_TEST(r.err.find("MASTER_ADDR/MASTER_PORT") != std::string::npos, r.err);
}

BOOST_AUTO_TEST_CASE(seed_examples_under_mpirun) {
  const std::string mpirun = find_mpirun();
  if (mpirun.empty()) {
#ifdef SHMDIST_TEST_REQUIRE_ALL
    BOOST_FAIL("Open MPI's mpirun is not installed, and this build runs every test "
               "(SHMDIST_REQUIRE_ALL): scripts/install-deps --tests installs it");
#endif
    BOOST_TEST_MESSAGE("skipped: Open MPI's mpirun is not installed");
    return;
  }
  CommandOptions options;
  options.timeout = std::chrono::seconds(120);
  options.unset_env = {"SHMDIST_SEGMENT_FD", "RANK", "WORLD_SIZE"};
  const auto r = run_command({mpirun, "--oversubscribe", "--allow-run-as-root", "-n", "3",
                              examples_dir() + "/seed2_any_source"},
                             options);
  BOOST_TEST(r.exit_code == 0, r.err);
  BOOST_TEST((r.out == "Received from 0: tensor([1, 2, 3])\n" ||
              r.out == "Received from 1: tensor([4, 5, 6])\n"),
             r.out);
  const auto r1 = run_command({mpirun, "--oversubscribe", "--allow-run-as-root", "-n", "2",
                               examples_dir() + "/seed1_send_recv"},
                              options);
  BOOST_TEST(r1.exit_code == 0, r1.err);
  BOOST_TEST(r1.out == "Received from 0: tensor([10, 20, 30, 40])\n");
}

BOOST_AUTO_TEST_SUITE_END()
