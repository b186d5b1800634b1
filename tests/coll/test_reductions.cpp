// Reductions are bitwise equal to a sequential reference in group-rank order, for every dtype
// and op where the op is defined, at sizes from empty to far beyond the rings; ops without a
// meaning for the dtype throw InvalidArgument on every member and the group goes on.
#include <chrono>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "coll/lane_plans.hpp"
#include "coll_support.hpp"
#include "segment/layout.hpp"
#include "support/shm_check.hpp"

namespace dist = shmdist;
using namespace shmdist::test;
using namespace shmdist::test::coll;
using shmdist::DType;
using shmdist::ReduceOp;
using shmdist::Tensor;
using shmdist::empty;
using shmdist::element_size;
using shmdist::kFloat32;

namespace {
// Sizes: empty, fewer elements than members, uneven slices, and several rings' worth.
const std::vector<std::int64_t> kSizes{0, 1, 2, 5, 1000, p2p::big_payload(70001, 9001)};

void check_reductions(dist::ProcessGroup& pg, const dist::Group& g, std::uint64_t seed) {
  const int n = pg.get_world_size(g);
  const int me = pg.get_rank(g);
  const std::vector<int> members = g.is_world() ? std::vector<int>{} : g.ranks();
  auto global = [&](int r) { return g.is_world() ? r : members[r]; };
  for (DType d : all_dtypes()) {
    for (ReduceOp op : all_ops()) {
      if (!defined_for(op, d)) continue;
      for (std::int64_t size : kSizes) {
        ++seed;
        std::vector<Tensor> inputs;
        for (int r = 0; r < n; ++r) inputs.push_back(make_input(seed, r, size, d, op));
        const Tensor want = reference_reduce(inputs, op, d);

        Tensor t = inputs[me].clone();
        pg.all_reduce(t, op, g);
        require_same(t, want, label("all_reduce", op, d, size));

        const int root = static_cast<int>(seed % n);
        Tensor r = inputs[me].clone();
        pg.reduce(r, global(root), op, g);
        require_same(r, me == root ? want : inputs[me], label("reduce", op, d, size));

        // reduce_scatter_tensor: member j gets part j of the reduction of n*size elements.
        std::vector<Tensor> big;
        for (int k = 0; k < n; ++k) big.push_back(make_input(seed + 77, k, size * n, d, op));
        const Tensor big_want = reference_reduce(big, op, d);
        Tensor part = empty({size}, d);
        pg.reduce_scatter_tensor(part, big[me], op, g);
        const Tensor part_want = Tensor::from_blob(
            static_cast<std::byte*>(const_cast<void*>(big_want.data_ptr())) +
                me * size * element_size(d), {size}, d);
        require_same(part, part_want, label("reduce_scatter_tensor", op, d, size));

        std::vector<Tensor> list;
        for (int k = 0; k < n; ++k)
          list.push_back(Tensor::from_blob(
              static_cast<std::byte*>(const_cast<void*>(big[me].data_ptr())) +
                  k * size * element_size(d), {size}, d));
        Tensor part2 = empty({size}, d);
        pg.reduce_scatter(part2, list, op, g);
        require_same(part2, part_want, label("reduce_scatter", op, d, size));
      }
    }
  }
}
}  // namespace

BOOST_FIXTURE_TEST_SUITE(reductions, ShmLeakCheck)

// 3 members: both all_reduce algorithms of the world lane (direct up to 64 KiB, sliced above).
BOOST_AUTO_TEST_CASE(bitwise_equal_to_the_sequential_reference_on_the_world) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) { check_reductions(pg, {}, 1); },
                  p2p::job_options(mode, 64 * 1024));
  }
}

// 6 members on the world (more than the CPUs here): all_reduce and reduce switch to the
// sliced algorithm above 16 KiB when the group has more than 4 members (64 KiB at 3-4); sizes
// on both sides of that switch and past a slot, each bitwise equal to the sequential reference.
BOOST_AUTO_TEST_CASE(bitwise_equal_across_the_wide_group_switch) {
  for (auto mode : all_modes()) {
    expect_job_ok(6, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      struct Case { DType d; ReduceOp op; std::int64_t numel; };
      const Case cases[] = {{kFloat32, ReduceOp::SUM, 4096},     {kFloat32, ReduceOp::SUM, 4097},
                            {kFloat32, ReduceOp::MAX, 70001},    {dist::kBFloat16, ReduceOp::AVG, 8192},
                            {dist::kBFloat16, ReduceOp::AVG, 8195}, {dist::kInt64, ReduceOp::PRODUCT, 2049}};
      std::uint64_t seed = 700;
      for (const Case& c : cases) {
        ++seed;
        std::vector<Tensor> inputs;
        for (int r = 0; r < 6; ++r) inputs.push_back(make_input(seed, r, c.numel, c.d, c.op));
        const Tensor want = reference_reduce(inputs, c.op, c.d);
        Tensor t = inputs[me].clone();
        pg.all_reduce(t, c.op);
        require_same(t, want, label("all_reduce", c.op, c.d, c.numel));
        const int root = static_cast<int>(seed % 6);
        Tensor r = inputs[me].clone();
        pg.reduce(r, root, c.op);
        require_same(r, me == root ? want : inputs[me], label("reduce", c.op, c.d, c.numel));
      }
    }, p2p::job_options(mode, 64 * 1024));
  }
}

// 2 members: the two-input kernel; the direct algorithm, and the sliced one for float16 and
// bfloat16 from kSlicePairMin bytes up to one window (the 70001-element cases).
BOOST_AUTO_TEST_CASE(bitwise_equal_with_two_members) {
  expect_job_ok(2, [](dist::ProcessGroup& pg) { check_reductions(pg, {}, 300); },
                p2p::job_options(Mode::Processes, 64 * 1024));
}

// 2 members, float16 and bfloat16: both sides of the switch to the sliced algorithm
// (kSlicePairMin bytes direct, one element more sliced, an odd element count), a whole
// window sliced and one element past it direct again (two windows), each bitwise equal to
// the sequential reference.
BOOST_AUTO_TEST_CASE(bitwise_equal_across_the_two_member_switch) {
  expect_job_ok(2, [](dist::ProcessGroup& pg) {
    const int me = pg.get_rank();
    const std::int64_t window = static_cast<std::int64_t>(
        shmdist::segment::default_coll_slot_size(2) / 2);  // elements of 2 bytes
    std::uint64_t seed = 900;
    for (DType d : {dist::kBFloat16, dist::kHalf}) {
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX}) {
        const auto at_switch = static_cast<std::int64_t>(shmdist::coll::kSlicePairMin / 2);
        for (std::int64_t numel : {at_switch, at_switch + 1, window, window + 1}) {
          ++seed;
          std::vector<Tensor> inputs;
          for (int r = 0; r < 2; ++r) inputs.push_back(make_input(seed, r, numel, d, op));
          Tensor t = inputs[me].clone();
          pg.all_reduce(t, op);
          require_same(t, reference_reduce(inputs, op, d), label("all_reduce", op, d, numel));
        }
      }
    }
  }, p2p::job_options(Mode::Processes, 64 * 1024));
}

// A sub-group {3, 1, 2} of 5 (group ranks are the sorted global ranks), and world collectives
// of the other ranks meanwhile.
BOOST_AUTO_TEST_CASE(bitwise_equal_on_a_sub_group) {
  expect_job_ok(5, [](dist::ProcessGroup& pg) {
    dist::Group g = pg.new_group({3, 1, 2});
    if (g.is_member()) check_reductions(pg, g, 500);
    dist::Tensor t = dist::full({4}, pg.get_rank(), dist::kInt32);
    pg.all_reduce(t);
    RANK_REQUIRE(t.equal(dist::full({4}, 10, dist::kInt32)));
  }, p2p::job_options(Mode::Processes, 64 * 1024));
}

// 2^22 float32 elements (16 MiB) through 64 KiB rings, and float16 AVG rounding once.
BOOST_AUTO_TEST_CASE(large_and_rounding_once) {
  for (auto mode : all_modes()) {
    expect_job_ok(4, [](dist::ProcessGroup& pg) {
      const int me = pg.get_rank();
      const std::int64_t n = p2p::big_payload(std::int64_t{1} << 22, 1 << 18);
      std::vector<Tensor> inputs;
      for (int r = 0; r < 4; ++r) inputs.push_back(make_input(9, r, n, kFloat32, ReduceOp::SUM));
      Tensor t = inputs[me].clone();
      pg.all_reduce(t);
      require_same(t, reference_reduce(inputs, ReduceOp::SUM, kFloat32), "16 MiB all_reduce");
      // 2048 + 1 + 1 + 1 in float16 step by step would stay 2048 (ulp 2); in float32 it is
      // 2051, rounded once to 2052.
      Tensor h = dist::full({3}, me == 0 ? 2048.0 : 1.0, dist::kHalf);
      pg.all_reduce(h);
      RANK_REQUIRE(h.equal(dist::full({3}, 2052.0, dist::kHalf)));
      Tensor a = dist::full({2}, me == 0 ? 2048.0 : 1.0, dist::kBFloat16);
      pg.all_reduce(a, ReduceOp::AVG);
      RANK_REQUIRE(a.equal(dist::full({2}, 2051.0 / 4, dist::kBFloat16)));
    }, p2p::job_options(mode, 64 * 1024));
  }
}

// The small blocking all_reduce's straight path (coll/on_lane.cpp small_all_reduce) and its
// hand-overs to the general call: a peer that comes late (the caller's polls run out, the
// engine's waiter finishes the round it published), a call behind an async collective (the
// lane is not idle: the general call queues), a one-element call after a mismatch, and the
// inline limit's both sides (4096 B straight, 4100 B general), each bitwise equal to the
// sequential reference. With 8 CPUs said (SHMDIST_LOCAL_CPUS) the 3 ranks are not crowded
// and take the straight path; with 1 they are, and it hands over right after publishing.
namespace {
void small_all_reduces(dist::ProcessGroup& pg) {
  const int me = pg.get_rank();
  std::uint64_t seed = 700;
  for (int late = 0; late < 3; ++late) {
    std::vector<Tensor> inputs;
    for (int r = 0; r < 3; ++r) inputs.push_back(make_input(++seed, r, 4, kFloat32, ReduceOp::SUM));
    Tensor t = inputs[me].clone();
    if (me == late) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    pg.all_reduce(t);
    require_same(t, reference_reduce(inputs, ReduceOp::SUM, kFloat32), "late peer");
  }
  Tensor a = dist::full({8}, me + 1.0);
  dist::Work w = pg.all_reduce(a, ReduceOp::SUM, {}, /*async_op=*/true);
  Tensor b = dist::full({2}, me + 1.0, dist::kBFloat16);
  pg.all_reduce(b, ReduceOp::MAX);  // queued behind a on the lane
  w.wait();
  RANK_REQUIRE(a.equal(dist::full({8}, 6.0)));
  RANK_REQUIRE(b.equal(dist::full({2}, 3.0, dist::kBFloat16)));
  Tensor c = dist::ones({me == 0 ? 1 : 2});
  p2p::require_throws<dist::InvalidArgument>([&] { pg.all_reduce(c); },
                                             {"group rank 1", "1 elements", "2 elements"}, "count");
  Tensor one = dist::full({1}, me + 1.0);
  pg.all_reduce(one, ReduceOp::PRODUCT);
  RANK_REQUIRE(one.equal(dist::full({1}, 6.0)));
  for (std::int64_t numel : {std::int64_t{1024}, std::int64_t{1025}}) {
    std::vector<Tensor> inputs;
    for (int r = 0; r < 3; ++r) inputs.push_back(make_input(++seed, r, numel, kFloat32, ReduceOp::AVG));
    Tensor t = inputs[me].clone();
    pg.all_reduce(t, ReduceOp::AVG);
    require_same(t, reference_reduce(inputs, ReduceOp::AVG, kFloat32), label("all_reduce", ReduceOp::AVG, kFloat32, numel));
  }
}
}  // namespace

BOOST_AUTO_TEST_CASE(small_all_reduce_late_peers_and_queued_calls) {
  for (const char* cpus : {"8", "1"}) {
    const p2p::ScopedEnv env("SHMDIST_LOCAL_CPUS", std::string(cpus));
    for (auto mode : all_modes()) {
      BOOST_TEST_CONTEXT("mode " << mode_name(mode) << ", SHMDIST_LOCAL_CPUS=" << cpus) {
        expect_job_ok(3, small_all_reduces, p2p::job_options(mode));
      }
    }
  }
}

// Undefined combinations throw on every member, naming the op and dtype; the group goes on.
BOOST_AUTO_TEST_CASE(ops_without_meaning_throw_on_every_member) {
  for (auto mode : all_modes()) {
    expect_job_ok(3, [](dist::ProcessGroup& pg) {
      using IA = dist::InvalidArgument;
      Tensor f = dist::ones({4});
      Tensor i = dist::ones({4}, dist::kInt32);
      Tensor b = dist::ones({4}, dist::kBool);
      p2p::require_throws<IA>([&] { pg.all_reduce(f, ReduceOp::BXOR); }, {"BXOR", "torch.float32"}, "BXOR f32");
      p2p::require_throws<IA>([&] { pg.all_reduce(i, ReduceOp::AVG); }, {"AVG", "torch.int32"}, "AVG i32");
      p2p::require_throws<IA>([&] { pg.all_reduce(b, ReduceOp::AVG); }, {"AVG", "torch.bool"}, "AVG bool");
      p2p::require_throws<IA>([&] { pg.reduce(f, 0, ReduceOp::BAND); }, {"BAND"}, "reduce BAND f32");
      p2p::require_throws<IA>([&] { pg.all_reduce(f, static_cast<ReduceOp>(42)); }, {"42"}, "op 42");
      RANK_REQUIRE(f.equal(dist::ones({4})));  // nothing moved
      pg.all_reduce(f);
      RANK_REQUIRE(f.equal(dist::full({4}, 3.0)));
      pg.all_reduce(b, ReduceOp::BXOR);
      RANK_REQUIRE(b.equal(dist::ones({4}, dist::kBool)));  // 1 ^ 1 ^ 1
    }, p2p::job_options(mode));
  }
}

BOOST_AUTO_TEST_SUITE_END()
