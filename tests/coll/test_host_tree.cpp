// The host tree's agreement (coll/schedule.hpp, Schedule::agree_on_tree) against messages no
// shmdist rank sends: one leader's engine on the fake transport (tests/engine), its peers
// played by the test, so that a corrupt message arrives exactly where the case wants it.
#define BOOST_TEST_MODULE shmdist host tree
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "coll/collectives.hpp"
#include "coll/reduce_schedules.hpp"
#include "coll/schedule.hpp"
#include "engine/engine_rig.hpp"

using namespace shmdist;
using namespace shmdist::coll;
using namespace shmdist::test;
using namespace std::chrono_literals;

namespace {

// A key of the world group's internal channel for step `step` of call `seq`.
MatchKey tree_key(std::uint64_t seq, std::size_t step) {
  return {0, 0, step_tag(seq, step), transport::kInternalChannel};
}

// A byte tensor holding `bytes`.
Tensor byte_tensor(const std::vector<std::byte>& bytes) {
  Tensor t = zeros(static_cast<std::int64_t>(bytes.size()), kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

// Hosts [0, 1] and [2, 3]: call #1 on the world group of 4, as global rank `me` makes it.
const std::vector<int> kMembers{0, 1, 2, 3};
const std::vector<int> kHostOf{0, 0, 1, 1};
CallSetup two_hosts(Rig& rig, int me) {
  CallSetup s;
  s.engine = rig.engine.get();
  s.group.members = kMembers;
  s.group.me = me;
  s.seq = 1;
  s.split = host_split(s.group, kHostOf);
  return s;
}

// The fingerprint a member sends for call #1 as all_reduce SUM of `count` float32.
std::vector<std::byte> sum_wire(std::uint64_t count) {
  CallDescription call;
  call.fp.kind = static_cast<std::uint8_t>(Kind::AllReduce);
  call.fp.op = static_cast<std::uint8_t>(ReduceOp::SUM);
  call.fp.dtype = static_cast<std::uint8_t>(kFloat32);
  call.fp.group_size = 4;
  call.fp.seq = 1;
  call.fp.count = count;
  std::vector<std::byte> wire(wire_size(4));
  encode(call, 4, wire.data());
  return wire;
}
// ... of 4 float32, the leaders' schedule.
std::vector<std::byte> sum_of_four_wire() { return sum_wire(4); }

// Every member's wire, by group rank: what a leader sends down (step 2) with no result.
std::vector<std::byte> wires_down(const std::vector<std::uint64_t>& counts) {
  std::vector<std::byte> down;
  for (std::uint64_t c : counts) {
    const std::vector<std::byte> w = sum_wire(c);
    down.insert(down.end(), w.begin(), w.end());
  }
  return down;
}

// An all_reduce large enough for the columns' schedule (reduce_schedules.hpp): 30,000
// float32, 120,000 bytes; each of a host's two members reduces a slice of 15,000.
constexpr std::int64_t kColumns = 30000;
constexpr std::int64_t kSlice = kColumns / 2;
static_assert(kColumns * 4 >= static_cast<std::int64_t>(kLeadersBelow));

}  // namespace

BOOST_AUTO_TEST_SUITE(host_tree)

// Global rank 0 leads host A (ranks 0, 1); rank 3 leads host B (ranks 2, 3: host 1's leader is
// its member at place 1, HostSplit::leader). Every member's
// fingerprint is the same all_reduce, but rank 1's message carries 4 bytes fewer input than
// that call has: a corrupt peer. Rank 0 must not reduce (it used to take its host's partial
// from memory nobody wrote, return it on host A, while host B raised): it raises naming
// rank 1, sends no partial across and no result down.
BOOST_AUTO_TEST_CASE(a_mate_whose_input_has_another_size_fails_its_leader) {
  Rig rig(0, 4, 5000ms);
  Tensor t = tensor({1.0f, 2.0f, 3.0f, 4.0f});
  const Completion op = all_reduce(two_hosts(rig, 0), t, ReduceOp::SUM);
  const std::size_t w = wire_size(4);
  const std::vector<std::byte> wire = sum_of_four_wire();
  // Rank 1: its wire and 12 bytes of input where the call says 16.
  std::vector<std::byte> up = wire;
  up.resize(w + 12, std::byte{0x7f});
  rig.arrive(1, byte_tensor(up), tree_key(1, 0));
  // Rank 3: host B's wires and a well-formed partial.
  std::vector<std::byte> across = wire;
  across.insert(across.end(), wire.begin(), wire.end());
  across.resize(2 * w + 16, std::byte{0});
  rig.arrive(3, byte_tensor(across), tree_key(1, 1));

  BOOST_CHECK_THROW(rig.engine->wait(*op, 5000ms), Error);
  BOOST_TEST((op->status == detail::Operation::Status::Failed));
  const std::string why = error_text(*op);
  BOOST_TEST(why.find("global rank 1") != std::string::npos, why);
  BOOST_TEST(why.find("12 bytes") != std::string::npos, why);
  // Nothing written: the tensor is the input.
  BOOST_TEST(t.data<float>()[0] == 1.0f);
  BOOST_TEST(t.data<float>()[3] == 4.0f);
  // Host B got this host's wires without a partial, rank 1 every wire without a result.
  BOOST_REQUIRE(rig.wire->outbound[3].size() == 1);
  BOOST_TEST(rig.wire->outbound[3][0].bytes.size() == 2 * w);
  BOOST_REQUIRE(rig.wire->outbound[1].size() == 1);
  BOOST_TEST(rig.wire->outbound[1][0].bytes.size() == 4 * w);
}

// Leaders are spread over the hosts' places (host h: place h mod its size), whatever the
// sizes; the root of a broadcast leads its own host.
BOOST_AUTO_TEST_CASE(leaders_are_spread_over_the_places) {
  const std::vector<int> members{0, 1, 2, 3, 4, 5};
  GroupView g;
  g.members = members;
  g.me = 0;
  const HostSplitPtr two = host_split(g, std::vector<int>{0, 0, 1, 1, 0, 1});
  BOOST_REQUIRE(two);
  BOOST_TEST(two->leaders(-1) == (std::vector<int>{0, 3}));  // hosts [0 1 4], [2 3 5]
  BOOST_TEST(two->leaders(5) == (std::vector<int>{0, 5}));
  BOOST_TEST(two->leaders(4) == (std::vector<int>{4, 3}));
  const HostSplitPtr three = host_split(g, std::vector<int>{0, 1, 1, 2, 2, 2});
  BOOST_REQUIRE(three);
  BOOST_TEST(three->leaders(-1) == (std::vector<int>{0, 2, 5}));  // [0], [1 2], [3 4 5]
  // Every host holds one member: the flat schedule serves (no split).
  BOOST_TEST(!host_split(g, std::vector<int>{0, 1, 2, 3, 4, 5}));
}

// A leader at place 1 of its host (global rank 3 leads host B, ranks 2 and 3): its mate's
// input and its own are reduced in group-rank order with host A's partial after them, the
// result goes down to its mate with every wire, and host A's leader gets this host's wires
// by place and its partial.
BOOST_AUTO_TEST_CASE(a_leader_at_place_one_reduces_in_group_rank_order) {
  Rig rig(3, 4, 5000ms);
  Tensor t = tensor({1.0f, 2.0f, 3.0f, 4.0f});
  const Completion op = all_reduce(two_hosts(rig, 3), t, ReduceOp::SUM);
  const std::size_t w = wire_size(4);
  const std::vector<std::byte> wire = sum_of_four_wire();
  auto with_floats = [&](std::vector<std::byte> head, std::vector<float> values) {
    const std::size_t at = head.size();
    head.resize(at + 4 * values.size());
    std::memcpy(head.data() + at, values.data(), 4 * values.size());
    return head;
  };
  // Rank 2, this host's other member: its wire and input.
  rig.arrive(2, byte_tensor(with_floats(wire, {10.0f, 20.0f, 30.0f, 40.0f})), tree_key(1, 0));
  // Rank 0, host A's leader: host A's two wires and its partial.
  std::vector<std::byte> wires_a = wire;
  wires_a.insert(wires_a.end(), wire.begin(), wire.end());
  rig.arrive(0, byte_tensor(with_floats(wires_a, {100.0f, 200.0f, 300.0f, 400.0f})),
             tree_key(1, 1));

  BOOST_TEST(rig.engine->wait(*op, 5000ms));
  BOOST_TEST(t.data<float>()[0] == 111.0f);
  BOOST_TEST(t.data<float>()[3] == 444.0f);
  // Across to rank 0: host B's wires and its partial (rank 2's input + rank 3's).
  BOOST_REQUIRE(rig.wire->outbound[0].size() == 1);
  const std::vector<std::byte>& across = rig.wire->outbound[0][0].bytes;
  BOOST_REQUIRE(across.size() == 2 * w + 16);
  float partial[4];
  std::memcpy(partial, across.data() + 2 * w, 16);
  BOOST_TEST(partial[0] == 11.0f);
  BOOST_TEST(partial[3] == 44.0f);
  // Down to rank 2: every wire and the result; nothing to rank 1 (host A's leader tells it).
  BOOST_REQUIRE(rig.wire->outbound[2].size() == 1);
  BOOST_TEST(rig.wire->outbound[2][0].bytes.size() == 4 * w + 16);
  BOOST_TEST(rig.wire->outbound[1].empty());
}

// The columns' schedule posts its first data step's receives while the agreement runs
// (Step::receive_early): when the calls turn out to disagree no data comes, and the receives
// must not stay posted (an operation pending for ever, its memory held). Global rank 1 sits
// at place 1 of host A, led by rank 0; rank 2's call has one element more.
BOOST_AUTO_TEST_CASE(the_columns_early_receives_are_withdrawn_when_the_calls_disagree) {
  Rig rig(1, 4, 5000ms);
  Tensor t = full({kColumns}, 1.0f);
  const Completion op = all_reduce(two_hosts(rig, 1), t, ReduceOp::SUM);
  rig.arrive(0, byte_tensor(wires_down({kColumns, kColumns, kColumns + 1, kColumns})),
             tree_key(1, 2));
  BOOST_CHECK_THROW(rig.engine->wait(*op, 5000ms), InvalidArgument);
  BOOST_TEST(error_text(*op).find("group rank 2") != std::string::npos, error_text(*op));
  BOOST_TEST(rig.engine->pending_operations() == 0u);
  BOOST_TEST(t.equal(full({kColumns}, 1.0f)));
  // Only the wire went out: no data before the calls agree.
  BOOST_REQUIRE(rig.wire->outbound[0].size() == 1);
  BOOST_TEST(rig.wire->outbound[2].empty());
  BOOST_TEST(rig.wire->outbound[3].empty());
}

// A step's data may come before this member gets to the step. Global rank 3 leads host B
// (ranks 2, 3) from place 1: its column peer on host A (rank 1) sends host A's partial (step
// B) before rank 3 has even heard its mate, whose slice 1 (step A) comes only once rank 3
// waits for it. Each lands where its step reads it: the stage's parts for step A and step B
// must not overlap (they did, for this member: both at the stage's start, so step A's bytes
// landed over step B's), and the result is reduce_members' order, host A's partial + (x2 +
// x3).
BOOST_AUTO_TEST_CASE(a_column_whose_data_comes_early_reduces_it_in_order) {
  Rig rig(3, 4, 5000ms);
  rig.wire->land_first = true;  // as single copy does inside a host: into step A's stage part
  Tensor t = full({kColumns}, 1.0f);
  const Completion op = all_reduce(two_hosts(rig, 3), t, ReduceOp::SUM);
  const std::vector<std::byte> wire = sum_wire(kColumns);
  rig.arrive(1, full({kSlice}, 40.0f), tree_key(1, 4));  // step B: host A's partial
  rig.arrive(2, byte_tensor(wire), tree_key(1, 0));       // the agreement: rank 2's wire,
  rig.arrive(0, byte_tensor(wires_down({kColumns, kColumns})), tree_key(1, 1));  // host A's
  for (int i = 0; i < 10; ++i) BOOST_TEST(!rig.engine->test(*op));  // on to step A: it waits
  rig.arrive(2, full({kSlice}, 2.0f), tree_key(1, 3));   // step A: rank 2's slice 1
  rig.arrive(2, full({kSlice}, 7.0f), tree_key(1, 5));   // step C: the result's slice 0
  BOOST_TEST(rig.engine->wait(*op, 5000ms));
  BOOST_TEST(rig.engine->pending_operations() == 0u);
  Tensor want = full({kColumns}, 7.0f);
  for (std::int64_t i = kSlice; i < kColumns; ++i) want.data<float>()[i] = 43.0f;
  BOOST_TEST(t.equal(want));
  // Out to rank 2: every wire, slice 0 of the input, the result's slice 1; to rank 1: host
  // B's partial of slice 1 (1 + 2).
  BOOST_REQUIRE(rig.wire->outbound[2].size() == 3);
  BOOST_REQUIRE(rig.wire->outbound[1].size() == 1);
  auto floats = [](const std::vector<std::byte>& b) {
    std::vector<float> f(b.size() / 4);
    std::memcpy(f.data(), b.data(), b.size());
    return f;
  };
  BOOST_TEST(floats(rig.wire->outbound[2][1].bytes) == std::vector<float>(kSlice, 1.0f));
  BOOST_TEST(floats(rig.wire->outbound[2][2].bytes) == std::vector<float>(kSlice, 43.0f));
  BOOST_TEST(floats(rig.wire->outbound[1][0].bytes) == std::vector<float>(kSlice, 3.0f));
}

// A step that fails while a message streams into the next step's receive, posted early:
// the call fails only once that message is in, so that no byte lands in the caller's tensor
// after its Work failed, and no receive is left behind. Global rank 3 (host B's leader, place
// 1): host A's column peer (rank 1) sends a partial one element too long (step B fails), while
// its mate (rank 2), a step ahead, has sent part of the result's slice 0 (step C).
BOOST_AUTO_TEST_CASE(a_failed_step_waits_for_a_message_streaming_into_the_next_one) {
  Rig rig(3, 4, 5000ms);
  Tensor t = full({kColumns}, 1.0f);
  const Completion op = all_reduce(two_hosts(rig, 3), t, ReduceOp::SUM);
  rig.arrive(2, byte_tensor(sum_wire(kColumns)), tree_key(1, 0));
  rig.arrive(0, byte_tensor(wires_down({kColumns, kColumns})), tree_key(1, 1));
  rig.arrive(2, full({kSlice}, 2.0f), tree_key(1, 3));
  rig.arrive(2, full({kSlice}, 7.0f), tree_key(1, 5), 1000);  // 1000 bytes of it so far
  rig.arrive(1, full({kSlice + 1}, 40.0f), tree_key(1, 4));
  BOOST_TEST(!rig.engine->wait(*op, 200ms));  // step B failed; step C's message streams in
  BOOST_TEST(rig.engine->pending_operations() > 0u);
  rig.wire->allow_all(2);
  BOOST_CHECK_THROW(rig.engine->wait(*op, 5000ms), Error);
  BOOST_TEST(error_text(*op).find("from rank 1") != std::string::npos, error_text(*op));
  BOOST_TEST(rig.engine->pending_operations() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
