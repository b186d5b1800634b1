// Running a job of n ranks inside a test with shmdist::launch, bounded in time, and checking
// that every rank succeeded (each failure is reported with the rank's error).
#pragma once

#include <chrono>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <shmdist/shmdist.hpp>

// Checks inside rank functions. Boost.Test's macros must not be used there: a forked rank's
// BOOST_CHECK is lost with its process, and Boost.Test is not thread-safe. These throw, which
// fails the rank, and expect_job_ok reports the message.
#define RANK_REQUIRE(cond)                                                                  \
  do {                                                                                      \
    if (!(cond))                                                                            \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) +     \
                               ": RANK_REQUIRE(" #cond ") failed");                         \
  } while (0)
#define RANK_REQUIRE_EQ(a, b)                                                               \
  do {                                                                                      \
    const auto& va_ = (a);                                                                  \
    const auto& vb_ = (b);                                                                  \
    if (!(va_ == vb_)) {                                                                    \
      std::ostringstream os_;                                                               \
      os_ << __FILE__ << ":" << __LINE__ << ": RANK_REQUIRE_EQ(" #a ", " #b ") failed: "    \
          << va_ << " != " << vb_;                                                          \
      throw std::runtime_error(os_.str());                                                  \
    }                                                                                       \
  } while (0)

namespace shmdist::test {

using Mode = LaunchOptions::Mode;

struct JobOptions {
  Mode mode = Mode::Processes;
  std::uint64_t ring_size = 0;
  std::chrono::milliseconds timeout{60'000};      // each group's timeout
  std::chrono::milliseconds job_timeout{120'000};  // the whole job
};

// Runs fn on n ranks; returns the outcomes without judging them.
std::vector<RankOutcome> run_job(int n, const std::function<void(ProcessGroup&)>& fn,
                                 const JobOptions& options = {});
// Runs fn on n ranks and fails the current test for every rank that did not succeed.
void expect_job_ok(int n, const std::function<void(ProcessGroup&)>& fn,
                   const JobOptions& options = {});

// The modes a behaviour test runs in: processes and threads (SHMDIST_TEST_MODES may pick one).
const std::vector<Mode>& all_modes();
const char* mode_name(Mode mode);

}  // namespace shmdist::test
