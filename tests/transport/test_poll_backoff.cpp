// PollBackoff: how long a rank waiting with remote peers sleeps before it looks at MPI again.
// MPI cannot ring our doorbell, so every such sleep is a wake-up; idle waits must back off
// far (bystanders share CPUs with ranks that work), yet a sleeper must never sleep much
// longer than it has already waited, nor long while its own sends need MPI's progress.
#include <boost/test/unit_test.hpp>

#include <chrono>

#include "transport/mpi_transport.hpp"

using shmdist::transport::PollBackoff;
using namespace std::chrono_literals;

BOOST_AUTO_TEST_CASE(an_idle_wait_doubles_from_10_us_to_10_ms) {
  PollBackoff b;
  std::chrono::nanoseconds expected = 10us;
  while (expected < 10ms) {
    BOOST_TEST(b.next(false).count() == expected.count());
    expected *= 2;
  }
  for (int i = 0; i < 100; ++i)
    BOOST_TEST(b.next(false).count() == std::chrono::nanoseconds(10ms).count());
}

// Doubling: the next sleep is never longer than the time already slept plus the first
// interval, so a remote wake-up costs at most about the time the rank had already waited.
BOOST_AUTO_TEST_CASE(a_sleep_is_never_longer_than_the_sleeps_before_it) {
  PollBackoff b;
  std::chrono::nanoseconds slept{0};
  for (int i = 0; i < 40; ++i) {
    const auto next = b.next(false);
    BOOST_TEST(next <= slept + PollBackoff::kMin);
    BOOST_TEST(next <= PollBackoff::kMax);
    slept += next;
  }
}

BOOST_AUTO_TEST_CASE(an_arrival_starts_over_at_10_us) {
  PollBackoff b;
  for (int i = 0; i < 30; ++i) b.next(false);
  b.reset();
  BOOST_TEST(b.next(false).count() == std::chrono::nanoseconds(10us).count());
  BOOST_TEST(b.next(false).count() == std::chrono::nanoseconds(20us).count());
}

// While sends wait for MPI (a large message moves only when its sender polls), sleeps stay at
// most 100 us and do not grow; the back-off resumes where it was afterwards.
BOOST_AUTO_TEST_CASE(sends_in_flight_keep_sleeps_at_most_100_us) {
  PollBackoff b;
  for (int i = 0; i < 30; ++i) b.next(false);
  for (int i = 0; i < 10; ++i)
    BOOST_TEST(b.next(true).count() == std::chrono::nanoseconds(100us).count());
  BOOST_TEST(b.next(false).count() == std::chrono::nanoseconds(10ms).count());
  PollBackoff fresh;
  BOOST_TEST(fresh.next(true).count() == std::chrono::nanoseconds(10us).count());
  BOOST_TEST(fresh.next(false).count() == std::chrono::nanoseconds(10us).count());
}
