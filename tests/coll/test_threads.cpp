// Several threads of a rank, each calling on its own group (MPI_THREAD_MULTIPLE): calls on
// different groups proceed independently, whatever order the ranks' threads start them in,
// and a call that cannot complete still ends with Timeout after its group's timeout while
// the other group's calls go on (issue 27.1). Both groups have the same members, as in the
// report (two torch groups of ranks [0, 1]); one pair puts the world group (its lane) beside
// a sub-group.
#include <exception>
#include <functional>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "coll_support.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::coll;
using namespace std::chrono_literals;
using shmdist::Tensor;

namespace {

// Runs `first` on a thread, then (once it has started) `second` on another; joins both and
// rethrows the first failure, so that it fails the rank.
void run_two_threads(const std::function<void()>& first, const std::function<void()>& second) {
  std::exception_ptr errors[2];
  std::atomic<bool> first_started{false};
  std::thread a([&] {
    try {
      first_started.store(true, std::memory_order_release);
      first();
    } catch (...) {
      errors[0] = std::current_exception();
    }
  });
  while (!first_started.load(std::memory_order_acquire)) std::this_thread::yield();
  std::thread b([&] {
    try {
      second();
    } catch (...) {
      errors[1] = std::current_exception();
    }
  });
  a.join();
  b.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// `rounds` rounds of an all_reduce, a blocking exchange and a barrier on `group`, checked.
// `salt` tells the two groups' values apart, so that a message taken by the wrong group's
// call would show.
void traffic(dist::ProcessGroup& pg, const dist::Group& group, int rounds, double salt) {
  const int me = pg.get_rank(group);
  const int peer = pg.get_global_rank(group, 1 - me);
  for (int i = 0; i < rounds; ++i) {
    Tensor t = dist::full({4}, salt + i + me);
    pg.all_reduce(t, dist::ReduceOp::SUM, group);
    RANK_REQUIRE(t.equal(dist::full({4}, 2 * (salt + i) + 1)));
    Tensor out = dist::full({3}, salt * 1000 + i * 2 + me);
    Tensor in = dist::zeros({3});
    if (me == 0) {
      pg.send(out, peer, group, 7);
      pg.recv(in, peer, group, 7);
    } else {
      pg.recv(in, peer, group, 7);
      pg.send(out, peer, group, 7);
    }
    RANK_REQUIRE(in.equal(dist::full({3}, salt * 1000 + i * 2 + (1 - me))));
    if (i % 16 == 0) pg.barrier(group);
  }
}

}  // namespace

BOOST_FIXTURE_TEST_SUITE(threads, ShmLeakCheck)

// Rank 0 starts its group-A thread first, rank 1 its group-B thread first: each rank's first
// thread waits for a call its peer makes only from its second thread. A wait that kept the
// rank to itself (a lock held while asleep) hung here for good.
BOOST_AUTO_TEST_CASE(two_threads_on_two_groups_in_opposite_orders_complete) {
  for (auto mode : all_modes()) {
    for (bool with_world : {false, true}) {
      BOOST_TEST_CONTEXT("mode " << mode_name(mode) << (with_world ? ", world + group" : ", two groups")) {
        JobOptions o = p2p::job_options(mode);
        o.timeout = 30s;
        o.job_timeout = 90s;
        expect_job_ok(2, [&](dist::ProcessGroup& pg) {
          const dist::Group g1 = pg.new_group({0, 1});
          const dist::Group g2 = pg.new_group({0, 1});
          const dist::Group a = with_world ? dist::Group{} : g1;
          const dist::Group& b = g2;
          auto on_a = [&] { traffic(pg, a, 200, 1.0); };
          auto on_b = [&] { traffic(pg, b, 200, 5.0); };
          if (pg.get_rank() == 0) run_two_threads(on_a, on_b);
          else run_two_threads(on_b, on_a);
          // Both groups still agree afterwards.
          traffic(pg, a, 2, 9.0);
          traffic(pg, b, 2, 11.0);
        }, o);
      }
    }
  }
}

// A call that its peer never makes times out after its group's timeout, naming what it
// waited for, while the other thread's calls on another group keep completing; the group
// stays usable once the late member calls.
BOOST_AUTO_TEST_CASE(a_timeout_on_one_group_leaves_the_other_groups_thread_running) {
  for (auto mode : all_modes()) {
    BOOST_TEST_CONTEXT("mode " << mode_name(mode)) {
      p2p::SharedCounters gave_up(1);
      JobOptions o = p2p::job_options(mode);
      o.timeout = 1500ms;
      o.job_timeout = 90s;
      expect_job_ok(2, [&](dist::ProcessGroup& pg) {
        const dist::Group g1 = pg.new_group({0, 1});
        const dist::Group g2 = pg.new_group({0, 1});
        if (pg.get_rank() == 0) {
          run_two_threads(
              [&] {
                Tensor t = dist::ones({2});
                p2p::require_throws<dist::Timeout>(
                    [&] { pg.all_reduce(t, dist::ReduceOp::SUM, g1); },
                    {"all_reduce (call #1 on group #1)", "rank 1 has not arrived"},
                    "all_reduce on group 1 without rank 1");
                gave_up[0].fetch_add(1);
              },
              [&] { traffic(pg, g2, 50, 3.0); });
        } else {
          traffic(pg, g2, 50, 3.0);
          gave_up.wait_at_least(0, 1);
          Tensor t = dist::ones({2});
          pg.all_reduce(t, dist::ReduceOp::SUM, g1);  // completes rank 0's call in the background
          RANK_REQUIRE(t.equal(dist::full({2}, 2.0)));
        }
        pg.barrier(g1);
        traffic(pg, g1, 2, 7.0);
      }, o);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
