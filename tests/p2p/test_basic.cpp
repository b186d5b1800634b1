// Basic blocking send/recv between ranks, in both launch modes.
#include <boost/test/unit_test.hpp>

#include "support/job.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using shmdist::test::all_modes;
using shmdist::test::expect_job_ok;
using shmdist::test::JobOptions;

BOOST_FIXTURE_TEST_SUITE(basic, shmdist::test::ShmLeakCheck)

BOOST_AUTO_TEST_CASE(ping_pong_returns_sender_and_data) {
  for (auto mode : all_modes()) {
    JobOptions o;
    o.mode = mode;
    expect_job_ok(2, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      dist::Tensor t = dist::zeros(4, dist::kLong);
      for (int i = 0; i < 100; ++i) {
        if (me == 0) {
          t.data<std::int64_t>()[0] = i;
          pg.send(t, 1);
          RANK_REQUIRE_EQ(pg.recv(t, 1), 1);
          RANK_REQUIRE_EQ(t.data<std::int64_t>()[0], i + 1);
        } else {
          RANK_REQUIRE_EQ(pg.recv(t, 0), 0);
          t.data<std::int64_t>()[0] += 1;
          pg.send(t, 0);
        }
      }
    }, o);
  }
}

BOOST_AUTO_TEST_SUITE_END()
