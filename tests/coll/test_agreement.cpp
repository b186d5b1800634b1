// Mismatched calls are caught on every member before data moves, and the group stays usable;
// async collectives progress while their rank blocks elsewhere and interleave with
// point-to-point traffic.
#include <algorithm>

#include <boost/test/unit_test.hpp>

#include "coll_support.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::coll;
using shmdist::ReduceOp;
using shmdist::Tensor;
using IA = shmdist::InvalidArgument;

BOOST_FIXTURE_TEST_SUITE(agreement, ShmLeakCheck)

BOOST_AUTO_TEST_CASE(mismatched_calls_throw_on_every_member_and_the_group_goes_on) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      const Tensor original = dist::full({6}, me + 1.0);
      Tensor t = original.clone();
      // Different op on rank 2: every member names group rank 2 and both calls.
      p2p::require_throws<IA>([&] { pg.all_reduce(t, me == 2 ? ReduceOp::MAX : ReduceOp::SUM); },
                              {"group rank 2", "all_reduce(op=MAX, torch.float32, 6 elements)",
                               "all_reduce(op=SUM, torch.float32, 6 elements)"}, "op");
      RANK_REQUIRE(t.equal(original));
      // Different dtype.
      Tensor d = me == 1 ? dist::ones({6}, dist::kFloat64) : dist::ones({6});
      p2p::require_throws<IA>([&] { pg.all_reduce(d); }, {"group rank 1", "torch.float64"}, "dtype");
      // Different count.
      Tensor c = dist::ones({me == 0 ? 5 : 6});
      p2p::require_throws<IA>([&] { pg.all_reduce(c); }, {"group rank 1", "5 elements", "6 elements"},
                              "count");
      // Different root.
      p2p::require_throws<IA>([&] { pg.broadcast(t, me == 2 ? 1 : 0); },
                              {"group rank 2", "broadcast(src=1", "broadcast(src=0"}, "root");
      RANK_REQUIRE(t.equal(original));
      // A different collective.
      std::vector<Tensor> list(3, dist::zeros({6}));
      if (me == 0)
        p2p::require_throws<IA>([&] { pg.all_gather(list, t); }, {"all_gather(", "all_reduce("}, "kind");
      else
        p2p::require_throws<IA>([&] { pg.all_reduce(t); }, {"group rank 1", "all_gather("}, "kind");
      // all_to_all_single splits that do not fit together.
      Tensor in = dist::zeros({3});
      Tensor out = dist::zeros({3});
      std::vector<std::int64_t> wrong{1, 1, 1};
      if (me == 1) wrong = {2, 0, 1};
      p2p::require_throws<IA>([&] { pg.all_to_all_single(out, in, {1, 1, 1}, wrong); },
                              {"splits disagree", "sends 2 elements"}, "splits");
      // The group is fine afterwards.
      pg.all_reduce(t);
      RANK_REQUIRE(t.equal(dist::full({6}, 6.0)));
    }, p2p::job_options(mode));
  }
}

// A rank that skips a collective is matched against the next one it calls: the others see a
// different call and everybody throws, then calls line up again.
BOOST_AUTO_TEST_CASE(a_skipped_call_is_caught) {
  expect_job_ok(3, [](dist::ProcessGroup& pg) {
    const int me = pg.get_rank();
    Tensor t = dist::ones({4});
    std::vector<Tensor> list(3, dist::zeros({4}));
    if (me != 1) {
      p2p::require_throws<IA>([&] { pg.all_reduce(t); }, {"group rank 1", "all_gather("}, "others");
      pg.all_gather(list, t);
    } else {
      p2p::require_throws<IA>([&] { pg.all_gather(list, t); }, {"group rank 1"}, "skipper");
      pg.all_gather(list, t);
    }
    for (const Tensor& e : list) RANK_REQUIRE(e.equal(dist::ones({4})));
  });
}

// barrier and monitored_barrier take part in the agreement like every collective (issue
// 27.2, 27.4): on `g` (members in group-rank order `members`), the first member makes
// `odd(g)` while the others make `usual(g, t)`; every member must throw InvalidArgument at
// once naming both calls (`parts`), nothing moves, and the group's calls line up again. The
// group's timeout is long: a mismatch that waits for it has missed the promise.
namespace {
template <class Odd, class Usual>
void mismatch_then_line_up(dist::ProcessGroup& pg, const dist::Group& g,
                           const std::vector<int>& members, Odd&& odd, Usual&& usual,
                           std::initializer_list<std::string> parts, const std::string& what) {
  const int me = pg.get_rank();
  const int rank_in_group =
      static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  Tensor t = dist::full({4}, 1.0);
  const Tensor original = t.clone();
  p2p::require_throws<IA>([&] { rank_in_group == 0 ? odd(g) : usual(g, t); }, parts, what);
  RANK_REQUIRE(t.equal(original));  // nothing moved
  const double sum = static_cast<double>(members.size() * (members.size() + 1) / 2);
  for (int k = 0; k < 3; ++k) {  // every call meets its own
    Tensor u = dist::full({4}, rank_in_group + 1.0);
    pg.all_reduce(u, ReduceOp::SUM, g);
    RANK_REQUIRE(u.equal(dist::full({4}, sum)));
    pg.barrier(g);
  }
  pg.monitored_barrier(g, std::chrono::seconds(20));
}

JobOptions patient(Mode mode) {
  JobOptions o = p2p::job_options(mode);
  o.timeout = std::chrono::seconds(20);
  o.job_timeout = std::chrono::seconds(120);
  return o;
}
}  // namespace

// Before: the all_reduce returned without error, paired with the barrier caller's next
// all_reduce (which got [2.0]x4 where [3.0]x4 is right), every later call stayed shifted by
// one, and the barrier caller waited out the whole timeout.
BOOST_AUTO_TEST_CASE(barrier_against_another_collective_throws_on_every_member) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      const dist::Group sub = pg.new_group({1, 2});
      auto odd = [&](const dist::Group& g) { pg.barrier(g); };
      auto usual = [&](const dist::Group& g, Tensor& t) { pg.all_reduce(t, ReduceOp::SUM, g); };
      const std::initializer_list<std::string> parts{
          "the members' calls disagree", "barrier()",
          "all_reduce(op=SUM, torch.float32, 4 elements)"};
      mismatch_then_line_up(pg, {}, {0, 1, 2}, odd, usual, parts, "world group");
      if (sub.is_member()) mismatch_then_line_up(pg, sub, {1, 2}, odd, usual, parts, "sub-group");
      pg.barrier();
    }, patient(mode));
  }
}

// Before: monitored_barrier met a plain barrier only after the timeout (twice it, in torch).
BOOST_AUTO_TEST_CASE(monitored_barrier_against_barrier_throws_on_every_member) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      const dist::Group sub = pg.new_group({1, 2});
      auto odd = [&](const dist::Group& g) { pg.monitored_barrier(g, std::chrono::seconds(20)); };
      auto usual = [&](const dist::Group& g, Tensor&) { pg.barrier(g); };
      const std::initializer_list<std::string> parts{"the members' calls disagree",
                                                     "monitored_barrier()", "barrier()"};
      mismatch_then_line_up(pg, {}, {0, 1, 2}, odd, usual, parts, "world group");
      if (sub.is_member()) mismatch_then_line_up(pg, sub, {1, 2}, odd, usual, parts, "sub-group");
      pg.barrier();
    }, patient(mode));
  }
}

// Rank 0 starts an async all_reduce and then blocks in a recv from rank 1; rank 1 only sends
// after its own (blocking) all_reduce returned, which needs rank 0's part: rank 0's collective
// must progress inside its recv.
BOOST_AUTO_TEST_CASE(async_collectives_progress_while_the_rank_blocks_elsewhere) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      const std::int64_t n = p2p::big_payload(300000, 30000);  // several ring passes
      Tensor t = dist::full({n}, me + 1.0, dist::kFloat64);
      Tensor msg = dist::zeros({2});
      if (me == 0) {
        dist::Work w = pg.all_reduce(t, ReduceOp::SUM, {}, true);
        RANK_REQUIRE_EQ(pg.recv(msg, 1, {}, 5), 1);
        RANK_REQUIRE(w.is_completed() || (w.wait(), true));
        w.wait();
        RANK_REQUIRE(t.equal(dist::full({n}, 6.0, dist::kFloat64)));
        RANK_REQUIRE(msg.equal(dist::full({2}, 9.0)));
      } else {
        pg.all_reduce(t);
        RANK_REQUIRE(t.equal(dist::full({n}, 6.0, dist::kFloat64)));
        if (me == 1) pg.send(dist::full({2}, 9.0), 0, {}, 5);
      }
      // Several async collectives in flight on two groups at once, waited in reverse order,
      // with point-to-point traffic on the same tags in between.
      dist::Group g = pg.new_group({0, 2});
      std::vector<Tensor> ts;
      std::vector<dist::Work> ws;
      for (int k = 0; k < 6; ++k) {
        ts.push_back(dist::full({1000 * (k + 1)}, me * 10 + k, dist::kInt64));
        ws.push_back(pg.all_reduce(ts.back(), ReduceOp::SUM, {}, true));
        if (g.is_member()) {
          ts.push_back(dist::full({7}, me + k, dist::kInt64));
          ws.push_back(pg.all_reduce(ts.back(), ReduceOp::MAX, g, true));
        }
        const int next = (me + 1) % 3, prev = (me + 2) % 3;
        pg.send(dist::full({1}, k), next, {}, 0);
        Tensor r = dist::zeros({1});
        RANK_REQUIRE_EQ(pg.recv(r, prev, {}, 0), prev);
        RANK_REQUIRE(r.equal(dist::full({1}, k)));
      }
      for (auto it = ws.rbegin(); it != ws.rend(); ++it) it->wait();
      std::size_t at = 0;
      for (int k = 0; k < 6; ++k) {
        RANK_REQUIRE(ts[at++].equal(dist::full({1000 * (k + 1)}, 30 + 3 * k, dist::kInt64)));
        if (g.is_member()) RANK_REQUIRE(ts[at++].equal(dist::full({7}, 2 + k, dist::kInt64)));
      }
      
      bool threw = false;
      try {
        (void)ws[0].source_rank();
      } catch (const IA&) {
        threw = true;
      }
      RANK_REQUIRE(threw);
    }, p2p::job_options(mode, 64 * 1024));
  }
}

BOOST_AUTO_TEST_SUITE_END()
