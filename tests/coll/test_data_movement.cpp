// broadcast, all_gather (list and into a tensor), gather, scatter, all_to_all (lists, equal and
// unequal splits): what each member receives, what is left untouched, on the world, on
// sub-groups and on overlapping groups.
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <functional>
#include <thread>

#include "coll_support.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::coll;
using shmdist::Tensor;

namespace {
// Member r's payload in call `seed`: n int64 values that say who made them.
Tensor payload(std::uint64_t seed, int r, std::int64_t n, shmdist::DType d = dist::kInt64) {
  return make_input(seed, r, n, d, dist::ReduceOp::SUM);
}

void check_movement(dist::ProcessGroup& pg, const dist::Group& g, std::uint64_t seed) {
  const int n = pg.get_world_size(g);
  const int me = pg.get_rank(g);
  const std::vector<int> members = pg.get_process_group_ranks(g);
  for (std::int64_t size : {std::int64_t{0}, std::int64_t{3}, p2p::big_payload(40000, 5000)}) {
    for (auto d : {dist::kInt64, dist::kBFloat16, dist::kBool}) {
      ++seed;
      // broadcast from every root in turn
      for (int root = 0; root < n; ++root) {
        Tensor t = me == root ? payload(seed, root, size, d) : dist::zeros({size}, d);
        pg.broadcast(t, members[root], g);
        require_same(t, payload(seed, root, size, d), "broadcast");
      }
      // all_gather and all_gather_into_tensor
      std::vector<Tensor> list;
      for (int r = 0; r < n; ++r) list.push_back(dist::zeros({size}, d));
      const Tensor mine = payload(seed, me, size, d);
      pg.all_gather(list, mine, g);
      for (int r = 0; r < n; ++r) require_same(list[r], payload(seed, r, size, d), "all_gather");
      Tensor flat = dist::zeros({size * n}, d);
      pg.all_gather_into_tensor(flat, mine, g);
      for (int r = 0; r < n; ++r)
        require_same(Tensor::from_blob(static_cast<std::byte*>(flat.data_ptr()) +
                                           r * size * dist::element_size(d), {size}, d),
                     payload(seed, r, size, d), "all_gather_into_tensor");
      // gather: only dst's list is written
      const int root = static_cast<int>(seed % n);
      std::vector<Tensor> glist;
      for (int r = 0; r < n; ++r) glist.push_back(dist::zeros({size}, d));
      pg.gather(mine, glist, members[root], g);
      for (int r = 0; r < n; ++r)
        require_same(glist[r], me == root ? payload(seed, r, size, d) : dist::zeros({size}, d),
                     "gather");
      // scatter: the list is read on src only (others pass an empty one)
      std::vector<Tensor> slist;
      if (me == root)
        for (int r = 0; r < n; ++r) slist.push_back(payload(seed + 1, r, size, d));
      Tensor got = dist::zeros({size}, d);
      pg.scatter(got, slist, members[root], g);
      require_same(got, payload(seed + 1, me, size, d), "scatter");
      // all_to_all: member r sends piece (r -> j) to j
      std::vector<Tensor> in, out;
      for (int j = 0; j < n; ++j) {
        in.push_back(payload(seed * 100 + me * 10 + j, 0, size + j, d));
        out.push_back(dist::zeros({size + me}, d));
      }
      pg.all_to_all(out, in, g);
      for (int j = 0; j < n; ++j)
        require_same(out[j], payload(seed * 100 + j * 10 + me, 0, size + me, d), "all_to_all");
    }
  }
  // all_to_all_single, equal splits: rows of 2 elements, 2 rows per member.
  Tensor in = dist::empty({2 * n, 2}, dist::kInt32);
  for (int i = 0; i < 4 * n; ++i) in.data<std::int32_t>()[i] = me * 1000 + i;
  Tensor out = dist::zeros({2 * n, 2}, dist::kInt32);
  pg.all_to_all_single(out, in, {}, {}, g);
  for (int j = 0; j < n; ++j)
    for (int k = 0; k < 4; ++k)
      RANK_REQUIRE_EQ(out.data<std::int32_t>()[4 * j + k], j * 1000 + 4 * me + k);
  // unequal splits: member i sends i + j + 1 rows of 3 to member j.
  std::vector<std::int64_t> in_splits, out_splits;
  std::int64_t in_rows = 0, out_rows = 0;
  for (int j = 0; j < n; ++j) {
    in_splits.push_back(me + j + 1);
    out_splits.push_back(j + me + 1);
    in_rows += me + j + 1;
    out_rows += j + me + 1;
  }
  Tensor uin = dist::empty({in_rows, 3}, dist::kFloat64);
  for (std::int64_t i = 0; i < in_rows * 3; ++i) uin.data<double>()[i] = me * 1e6 + i;
  Tensor uout = dist::zeros({out_rows, 3}, dist::kFloat64);
  pg.all_to_all_single(uout, uin, out_splits, in_splits, g);
  std::int64_t at = 0;
  for (int j = 0; j < n; ++j) {
    std::int64_t offset_in_j = 0;  // where j's piece for me starts in j's input
    for (int k = 0; k < me; ++k) offset_in_j += (j + k + 1) * 3;
    for (std::int64_t e = 0; e < (j + me + 1) * 3; ++e)
      RANK_REQUIRE_EQ(uout.data<double>()[at++], j * 1e6 + offset_in_j + e);
  }
}
}  // namespace

BOOST_FIXTURE_TEST_SUITE(data_movement, ShmLeakCheck)

BOOST_AUTO_TEST_CASE(every_collective_on_the_world) {
  for (auto mode : all_modes())
    expect_job_ok(4, [](dist::ProcessGroup& pg) { check_movement(pg, {}, 1); },
                  p2p::job_options(mode, 64 * 1024));
}

// Overlapping groups {0,1,2} and {1,2,3} used alternately: each keeps its own order.
BOOST_AUTO_TEST_CASE(sub_groups_and_overlapping_groups) {
  expect_job_ok(4, [](dist::ProcessGroup& pg) {
    const int me = pg.get_rank();
    dist::Group a = pg.new_group({0, 1, 2});
    dist::Group b = pg.new_group({1, 2, 3});
    for (int round = 0; round < 3; ++round) {
      if (a.is_member()) check_movement(pg, a, 10 + round);
      if (b.is_member()) check_movement(pg, b, 20 + round);
      Tensor t = dist::full({5}, me + 1, dist::kInt64);
      if (a.is_member()) {
        pg.all_reduce(t, dist::ReduceOp::PRODUCT, a);
        RANK_REQUIRE(t.equal(dist::full({5}, 6, dist::kInt64)));
      }
    }
  }, p2p::job_options(Mode::Processes, 64 * 1024));
}

BOOST_AUTO_TEST_CASE(a_group_of_one) {
  expect_job_ok(2, [](dist::ProcessGroup& pg) {
    dist::Group g0 = pg.new_group({0});
    dist::Group g1 = pg.new_group({1});
    dist::Group mine = pg.get_rank() == 0 ? g0 : g1;
    Tensor t = dist::full({3}, 5.0, dist::kHalf);
    pg.all_reduce(t, dist::ReduceOp::AVG, mine);
    RANK_REQUIRE(t.equal(dist::full({3}, 5.0, dist::kHalf)));
    std::vector<Tensor> list{dist::zeros({3}, dist::kHalf)};
    pg.all_gather(list, t, mine);
    RANK_REQUIRE(list[0].equal(t));
  });
}

// Invalid arguments on one member: every member throws (that member its own reason, the
// others naming it), nothing is written, and the group goes on.
BOOST_AUTO_TEST_CASE(invalid_arguments_on_one_member) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      using IA = dist::InvalidArgument;
      const int me = pg.get_rank();
      Tensor t = dist::full({4}, me, dist::kInt32);
      std::vector<Tensor> list(me == 1 ? 2 : 3, dist::zeros({4}, dist::kInt32));
      if (me == 1)
        p2p::require_throws<IA>([&] { pg.all_gather(list, t); }, {"tensor_list has 2", "3"}, "own");
      else
        p2p::require_throws<IA>([&] { pg.all_gather(list, t); },
                                {"group rank 1", "rejected its arguments"}, "others");
      for (const Tensor& e : list) RANK_REQUIRE(e.equal(dist::zeros({4}, dist::kInt32)));
      Tensor undefined;
      if (me == 2)
        p2p::require_throws<IA>([&] { pg.broadcast(undefined, 0); }, {"undefined"}, "own");
      else
        p2p::require_throws<IA>([&] { pg.broadcast(t, 0); }, {"group rank 2"}, "others");
      p2p::require_throws<IA>([&] { pg.broadcast(t, 7); }, {"src rank 7", "not a member"}, "root");
      dist::Group pair = pg.new_group({0, 1});
      if (me == 2)
        p2p::require_throws<IA>([&] { pg.all_reduce(t, dist::ReduceOp::SUM, pair); },
                                {"not a member"}, "non-member");
      pg.all_reduce(t);
      RANK_REQUIRE(t.equal(dist::full({4}, 3, dist::kInt32)));
    }, p2p::job_options(mode));
  }
}

// Issue 27.8: a tensor list whose entries have the element count of the call's tensor but
// another shape is refused as gloo refuses it (before: accepted, the rows landing where the
// user meant columns), on the member that passed it, naming its global rank and both
// shapes; the others fail at once naming it; nothing is written; the group goes on.
// all_to_all's lists have no shape to match (each pair's count is checked across members).
BOOST_AUTO_TEST_CASE(list_entries_of_another_shape_are_refused) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      using IA = dist::InvalidArgument;
      const int me = pg.get_rank();
      const std::string gloo_words = "invalid tensor size at index 1 (expected (3, 2), got (2, 3))";
      const Tensor zeros = dist::zeros({3, 2}, dist::kFloat32);
      // Rank 1's list has (2, 3) at index 1; every list has the right count and dtype.
      auto list_of = [&](int rank) {
        std::vector<Tensor> list;
        for (int j = 0; j < 3; ++j)
          list.push_back(dist::zeros(rank == 1 && j == 1 ? std::vector<std::int64_t>{2, 3}
                                                         : std::vector<std::int64_t>{3, 2},
                                     dist::kFloat32));
        return list;
      };
      auto expect_refused = [&](const char* call, const std::function<void()>& fn) {
        if (me == 1)
          p2p::require_throws<IA>(fn, {call, "on rank 1, ", gloo_words, "shape of"}, "own");
        else
          p2p::require_throws<IA>(fn, {call, "group rank 1", "rejected its arguments"}, "others");
      };
      Tensor t = dist::full({3, 2}, me + 1, dist::kFloat32);
      std::vector<Tensor> out = list_of(me);
      expect_refused("all_gather", [&] { pg.all_gather(out, t); });
      for (const Tensor& e : out) RANK_REQUIRE(e.equal(dist::zeros(e.sizes(), dist::kFloat32)));
      std::vector<Tensor> gathered = list_of(me);
      expect_refused("gather", [&] { pg.gather(t, gathered, 1); });
      std::vector<Tensor> parts = list_of(me);
      Tensor received = dist::zeros({3, 2}, dist::kFloat32);
      expect_refused("scatter", [&] { pg.scatter(received, parts, 1); });
      RANK_REQUIRE(received.equal(zeros));
      expect_refused("reduce_scatter", [&] { pg.reduce_scatter(received, parts); });
      RANK_REQUIRE(received.equal(zeros));
      // The right shapes still work, and a list on a non-root is not looked at.
      std::vector<Tensor> good = list_of(0);
      pg.all_gather(good, t);
      for (int j = 0; j < 3; ++j)
        RANK_REQUIRE(good[j].equal(dist::full({3, 2}, j + 1, dist::kFloat32)));
      std::vector<Tensor> root_list = me == 0 ? list_of(0) : list_of(1);
      pg.gather(t, root_list, 0);
      if (me == 0)
        for (int j = 0; j < 3; ++j)
          RANK_REQUIRE(root_list[j].equal(dist::full({3, 2}, j + 1, dist::kFloat32)));
    }, p2p::job_options(mode));
  }
}

// The world lane reuses each rank's two slots every other round, with no "released" flag:
// back-to-back calls of one and of many rounds (direct and sliced all_reduce, windows far
// beyond a slot), with a different member lagging each time, must never let a fast member
// overwrite a slot a slow one still reads. Every result is checked exactly.
BOOST_AUTO_TEST_CASE(back_to_back_lane_calls_with_members_lagging_in_turn) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      const std::int64_t sizes[] = {1, 3000, 20000, 150000};  // float32: 4 B .. 600 KB
      for (int it = 0; it < 24; ++it) {
        const std::int64_t n = sizes[it % 4];
        if (it % 3 == me) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        Tensor t = dist::empty({n}, dist::kFloat32);
        float* p = t.data<float>();
        for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<float>((i % 101) * 4 + me + it);
        pg.all_reduce(t);
        for (std::int64_t i = 0; i < n; ++i)
          RANK_REQUIRE_EQ(p[i], static_cast<float>((i % 101) * 12 + 3 + 3 * it));
        Tensor b = dist::full({n}, me == it % 3 ? it : -1, dist::kInt32);
        pg.broadcast(b, it % 3);
        RANK_REQUIRE(b.equal(dist::full({n}, it, dist::kInt32)));
      }
    }, p2p::job_options(mode));
  }
}

// Two members take their own paths on the lane: data inline in the slot header up to 4 KiB
// per slot, 32 KiB broadcast windows pipelined through the two slots, reduce_scatter parts
// packed side by side, all_gather's own part copied while waiting. Sizes just below, at and
// above each switch and beyond a slot (256 KiB), with each member lagging in turn, back to
// back, every result checked exactly.
BOOST_AUTO_TEST_CASE(two_members_across_every_lane_switch) {
  for (auto mode : all_modes()) {
    expect_job_ok(2, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      // float32 elements: 4 B, the header's 88 inline bytes, 4 KiB, 32 KiB, beyond a slot.
      const std::int64_t sizes[] = {1, 22, 23, 1023, 1024, 1025, 8191, 8192, 8193, 70001};
      std::uint64_t seed = 0;
      for (int lag = 0; lag < 2; ++lag) {
        for (std::int64_t n : sizes) {
          ++seed;
          if (me == lag) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          for (int root = 0; root < 2; ++root) {
            Tensor b = me == root ? payload(seed, root, n, dist::kFloat32)
                                  : dist::zeros({n}, dist::kFloat32);
            pg.broadcast(b, root);
            require_same(b, payload(seed, root, n, dist::kFloat32), "broadcast");
          }
          std::vector<Tensor> list{dist::zeros({n}, dist::kFloat32), dist::zeros({n}, dist::kFloat32)};
          pg.all_gather(list, payload(seed, me, n, dist::kFloat32));
          for (int r = 0; r < 2; ++r) require_same(list[r], payload(seed, r, n, dist::kFloat32), "all_gather");
          Tensor flat = dist::zeros({2 * n}, dist::kFloat32);
          pg.all_gather_into_tensor(flat, payload(seed, me, n, dist::kFloat32));
          for (int r = 0; r < 2; ++r)
            require_same(Tensor::from_blob(static_cast<std::byte*>(flat.data_ptr()) + r * n * 4, {n},
                                           dist::kFloat32),
                         payload(seed, r, n, dist::kFloat32), "all_gather_into_tensor");

          std::vector<Tensor> inputs{make_input(seed, 0, 2 * n, dist::kFloat32, dist::ReduceOp::SUM),
                                     make_input(seed, 1, 2 * n, dist::kFloat32, dist::ReduceOp::SUM)};
          Tensor sum = reference_reduce(inputs, dist::ReduceOp::SUM, dist::kFloat32);
          Tensor t = inputs[me].clone();
          pg.all_reduce(t);
          require_same(t, sum, "all_reduce");
          Tensor out = dist::zeros({n}, dist::kFloat32);
          const Tensor want = Tensor::from_blob(static_cast<std::byte*>(sum.data_ptr()) + me * n * 4,
                                                {n}, dist::kFloat32).clone();
          pg.reduce_scatter_tensor(out, inputs[me]);
          require_same(out, want, "reduce_scatter_tensor");
          std::vector<Tensor> parts;
          for (int j = 0; j < 2; ++j)
            parts.push_back(Tensor::from_blob(static_cast<std::byte*>(inputs[me].data_ptr()) + j * n * 4,
                                              {n}, dist::kFloat32));
          Tensor out2 = dist::zeros({n}, dist::kFloat32);
          pg.reduce_scatter(out2, parts);
          require_same(out2, want, "reduce_scatter");
        }
      }
    }, p2p::job_options(mode));
  }
}

BOOST_AUTO_TEST_SUITE_END()
