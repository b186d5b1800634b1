#include "support/job.hpp"

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <string>

namespace shmdist::test {

std::vector<RankOutcome> run_job(int n, const std::function<void(ProcessGroup&)>& fn,
                                 const JobOptions& options) {
  LaunchOptions lo;
  lo.mode = options.mode;
  lo.ring_size = options.ring_size;
  lo.timeout = options.timeout;
  lo.job_timeout = options.job_timeout;
  return launch(n, fn, lo);
}

void expect_job_ok(int n, const std::function<void(ProcessGroup&)>& fn, const JobOptions& options) {
  for (const RankOutcome& r : run_job(n, fn, options)) {
    BOOST_TEST_INFO("mode " << mode_name(options.mode) << ", rank " << r.rank);
    BOOST_CHECK_MESSAGE(r.ok(), "rank " << r.rank << " failed: exit " << r.exit_code << ", signal "
                                        << r.signal << ", error: " << r.error);
  }
}

// SHMDIST_TEST_MODES=threads (or processes) restricts behaviour tests to one mode: the
// ThreadSanitizer stage of CI runs thread mode only, which is the mode TSan can check.
const std::vector<Mode>& all_modes() {
  static const std::vector<Mode> modes = [] {
    const char* only = std::getenv("SHMDIST_TEST_MODES");
    if (only && std::string(only) == "threads") return std::vector<Mode>{Mode::Threads};
    if (only && std::string(only) == "processes") return std::vector<Mode>{Mode::Processes};
    return std::vector<Mode>{Mode::Processes, Mode::Threads};
  }();
  return modes;
}

const char* mode_name(Mode mode) { return mode == Mode::Threads ? "threads" : "processes"; }

}  // namespace shmdist::test
