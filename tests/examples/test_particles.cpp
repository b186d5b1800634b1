// The particles example (all_reduce for the time step and the thermostat's energy): every way
// of running it checks itself bit for bit against a single-process run, and prints the same
// line for the same number of ranks, run after run, as processes or threads.
#include <boost/test/unit_test.hpp>

#include "support/process.hpp"
#include "support/shm_check.hpp"

using shmdist::test::CommandResult;
using shmdist::test::examples_dir;
using shmdist::test::run_command;
using shmdist::test::shmrun_path;

BOOST_FIXTURE_TEST_SUITE(particles, shmdist::test::ShmLeakCheck)

BOOST_AUTO_TEST_CASE(bit_identical_to_a_single_process_run_every_way) {
  const std::string program = examples_dir() + "/particles";
  shmdist::test::CommandOptions options;
  options.timeout = std::chrono::seconds(120);
  const std::vector<std::vector<std::string>> ways = {
      {shmrun_path(), "-n", "4", program},
      {shmrun_path(), "-n", "4", program},
      {program, "--ranks", "4"},
      {program, "--ranks", "4", "--threads"},
  };
  std::string first;
  for (const auto& argv : ways) {
    const CommandResult r = run_command(argv, options);
    BOOST_TEST_CONTEXT(argv.back() << ": " << r.out << r.err) {
      BOOST_TEST(r.exit_code == 0);
      BOOST_TEST(r.err == "");
      BOOST_TEST(r.out.rfind("particles: 4 ranks, 12000 particles, 500 steps, kinetic energy ", 0) == 0u);
      BOOST_TEST(r.out.find(": identical to the single-process run\n") != std::string::npos);
      if (first.empty()) first = r.out;
      BOOST_TEST(r.out == first);  // the same energy, to the last printed digit
    }
  }
  const CommandResult three = run_command({shmrun_path(), "-n", "3", program}, options);
  BOOST_TEST(three.exit_code == 0);
  BOOST_TEST(three.out.find("3 ranks") != std::string::npos);
  BOOST_TEST(three.out.find("identical to the single-process run") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
