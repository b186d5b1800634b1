// The job's CPU count (lib/base/cpus.hpp), the one answer the spin policy, the engine, the
// world lane and shmrun --bind-to core use: SHMDIST_LOCAL_CPUS first, else the affinity mask.
#include <boost/test/unit_test.hpp>

#include <sched.h>
#include <unistd.h>

#include <optional>
#include <thread>
#include <vector>

#include "base/cpus.hpp"

using namespace shmdist;

namespace {

// Runs `body` on a thread whose affinity mask is `mask` (the calling thread's own mask is
// left alone); false if the mask cannot be set.
template <class Body>
bool with_affinity(const std::vector<int>& mask, Body body) {
  bool set_ok = false;
  std::thread t([&] {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : mask) CPU_SET(c, &set);
    set_ok = sched_setaffinity(0, sizeof set, &set) == 0;
    if (set_ok) body();
  });
  t.join();
  return set_ok;
}

int online_cpus() {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cpus_tests)

BOOST_AUTO_TEST_CASE(shmdist_local_cpus_wins_over_the_affinity) {
  BOOST_TEST(cpus::for_job(3) == 3);
  BOOST_TEST(cpus::for_job(1000) == 1000);
  BOOST_TEST(cpus::for_job(1) == 1);
}

// A thread allowed two CPUs counts two, whatever the host has (std::thread::
// hardware_concurrency, which the world lane used to take, counts every CPU of the host).
BOOST_AUTO_TEST_CASE(the_affinity_mask_is_the_count_without_the_variable) {
  const std::vector<int> all = cpus::allowed();
  BOOST_TEST(!all.empty());
  BOOST_TEST(cpus::for_job(std::nullopt) == (all.size() > 1 ? static_cast<int>(all.size())
                                                             : online_cpus()));
  if (all.size() < 2) return;  // nothing narrower than one CPU to try
  const std::vector<int> two{all[0], all[1]};
  std::vector<int> seen;
  int counted = 0;
  BOOST_TEST_REQUIRE(with_affinity(two, [&] {
    seen = cpus::allowed();
    counted = cpus::for_job(std::nullopt);
  }));
  BOOST_TEST(seen == two, boost::test_tools::per_element());
  BOOST_TEST(counted == 2);
}

// One allowed CPU is a rank pinned to a core (shmrun --bind-to core, mpirun's binding): it
// says nothing about how many CPUs the job shares, so the online ones count.
BOOST_AUTO_TEST_CASE(a_thread_pinned_to_one_cpu_counts_the_online_cpus) {
  const std::vector<int> all = cpus::allowed();
  std::vector<int> seen;
  int counted = 0;
  BOOST_TEST_REQUIRE(with_affinity({all[0]}, [&] {
    seen = cpus::allowed();
    counted = cpus::for_job(std::nullopt);
  }));
  BOOST_TEST(seen == std::vector<int>{all[0]}, boost::test_tools::per_element());
  BOOST_TEST(counted == online_cpus());
  BOOST_TEST(cpus::for_job(2) == 2);
}

BOOST_AUTO_TEST_CASE(oversubscribed_means_more_ranks_than_cpus) {
  BOOST_TEST(!cpus::oversubscribed(1, 1));
  BOOST_TEST(!cpus::oversubscribed(2, 2));
  BOOST_TEST(cpus::oversubscribed(3, 2));
  BOOST_TEST(!cpus::oversubscribed(2, 64));
}

// Hosts emulated on one machine (SHMDIST_HOST_ID apart, one kernel) share its CPUs: each
// host's ranks count their share, so that their waits give the CPU away when they outnumber
// it (bootstrap/join_hosts.cpp). On a thread allowed two CPUs: 2 x host / machine, at least 1.
BOOST_AUTO_TEST_CASE(hosts_sharing_a_machine_count_their_share_of_its_cpus) {
  BOOST_TEST(!cpus::machine_share(2, 2));  // the host has the machine alone
  BOOST_TEST(!cpus::machine_share(4, 3));  // no more ranks on the machine than on the host
  BOOST_TEST(!cpus::machine_share(0, 4));
  const std::vector<int> all = cpus::allowed();
  if (all.size() < 2) return;  // the share of one CPU is all of it
  std::optional<int> two_of_four, one_of_two, three_of_four, one_of_nine;
  BOOST_TEST_REQUIRE(with_affinity({all[0], all[1]}, [&] {
    two_of_four = cpus::machine_share(2, 4);
    one_of_two = cpus::machine_share(1, 2);
    three_of_four = cpus::machine_share(3, 4);
    one_of_nine = cpus::machine_share(1, 9);
  }));
  BOOST_TEST(two_of_four.value_or(0) == 1);
  BOOST_TEST(one_of_two.value_or(0) == 1);
  BOOST_TEST(three_of_four.value_or(0) == 1);  // 1.5 CPUs: counted as one
  BOOST_TEST(one_of_nine.value_or(0) == 1);    // never none
}

BOOST_AUTO_TEST_SUITE_END()
