// The world lane's "more ranks than CPUs" test counts the job's CPUs as the rest of the
// library does (lib/base/cpus.hpp): SHMDIST_LOCAL_CPUS when set, else the affinity mask. It
// used to count the host's CPUs (std::thread::hardware_concurrency), ignoring both.
#include <cstdlib>
#include <string>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "base/cpus.hpp"
#include "coll/shm_lane.hpp"
#include "coll_support.hpp"
#include "pg/impl.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace std::chrono_literals;

namespace {

// Sets an environment variable for the scope (ranks read it when they join: threads share
// this process's environment, forked ranks inherit it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

int lane_cpus(dist::ProcessGroup& pg) {
  auto& impl = dist::detail::ProcessGroupAccess::impl(pg);
  RANK_REQUIRE(impl.world_lane != nullptr);
  return impl.world_lane->cpus();
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(job_cpus, ShmLeakCheck)

// A count no host here has (more than its CPUs), and one CPU for two ranks (the lane's
// crowded path): the lane sees each, and its collectives still complete.
BOOST_AUTO_TEST_CASE(the_lane_takes_shmdist_local_cpus) {
  const int many = static_cast<int>(std::thread::hardware_concurrency()) + 5;
  for (const int wanted : {many, 1}) {
    for (auto mode : all_modes()) {
      BOOST_TEST_CONTEXT("mode " << mode_name(mode) << ", SHMDIST_LOCAL_CPUS=" << wanted) {
        const ScopedEnv env("SHMDIST_LOCAL_CPUS", std::to_string(wanted));
        JobOptions o = p2p::job_options(mode);
        o.job_timeout = 60s;
        expect_job_ok(2, [&](dist::ProcessGroup& pg) {
          RANK_REQUIRE_EQ(lane_cpus(pg), wanted);
          dist::Tensor t = dist::full({4}, 1.0 + pg.get_rank());
          pg.all_reduce(t, dist::ReduceOp::SUM);
          RANK_REQUIRE(t.equal(dist::full({4}, 3.0)));
        }, o);
      }
    }
  }
}

// Without the variable, the lane counts what the job's processes may run on.
BOOST_AUTO_TEST_CASE(the_lane_counts_the_affinity_without_the_variable) {
  unsetenv("SHMDIST_LOCAL_CPUS");
  const int expected = dist::cpus::for_job(std::nullopt);
  for (auto mode : all_modes()) {
    BOOST_TEST_CONTEXT("mode " << mode_name(mode)) {
      JobOptions o = p2p::job_options(mode);
      o.job_timeout = 60s;
      expect_job_ok(2, [&](dist::ProcessGroup& pg) {
        RANK_REQUIRE_EQ(lane_cpus(pg), expected);
      }, o);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
