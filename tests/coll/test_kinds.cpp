// The collectives' table (lib/coll/kinds.hpp) and what the fingerprint makes of codes past
// this build's tables: a peer built with a newer shmdist is reported as a version mismatch,
// naming it and the code, not as a disagreement or a corrupt peer.
#define BOOST_TEST_MODULE shmdist collective table
#include <boost/test/unit_test.hpp>

#include <set>
#include <string>
#include <vector>

#include <shmdist/distributed.hpp>

#include "coll/fingerprint.hpp"
#include "coll/kinds.hpp"

using namespace shmdist;
using namespace shmdist::coll;

namespace {

CallDescription all_reduce_call(std::uint64_t seq = 1) {
  CallDescription c;
  c.fp.kind = static_cast<std::uint8_t>(Kind::AllReduce);
  c.fp.op = static_cast<std::uint8_t>(ReduceOp::SUM);
  c.fp.dtype = static_cast<std::uint8_t>(kFloat32);
  c.fp.group_size = 3;
  c.fp.seq = seq;
  c.fp.count = 10;
  return c;
}

const std::vector<int> kMembers = {4, 5, 6};  // global ranks of group ranks 0, 1, 2

bool says(const std::optional<std::string>& text, const std::string& words) {
  BOOST_TEST_INFO("verdict: " << text.value_or("(none)"));
  return text && text->find(words) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_row_has_a_unique_code_and_name_found_by_name) {
  std::set<int> codes;
  std::set<std::string> names;
  for (const KindInfo& k : kKinds) {
    BOOST_TEST(codes.insert(static_cast<int>(k.kind)).second);
    BOOST_TEST(names.insert(k.name).second);
    BOOST_TEST((kind_from_name(k.name) == k.kind));
    BOOST_TEST(std::string(kind_name(k.kind)) == k.name);
    BOOST_TEST(std::string(k.schedule).size() > 0u);
  }
  BOOST_TEST(!kind_from_name("all_reduce_coalesced"));
  BOOST_TEST(kind_names(true).find("barrier") == std::string::npos);
  BOOST_TEST(kind_names(false).find("monitored_barrier") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(the_chooser_takes_the_lane_only_for_a_plan_on_the_world_lane) {
  BOOST_TEST((choose_route(Kind::AllReduce, true, true) == Route::Lane));
  BOOST_TEST((choose_route(Kind::AllReduce, false, true) == Route::PointToPoint));  // sub-group
  BOOST_TEST((choose_route(Kind::AllReduce, true, false) == Route::PointToPoint));  // bad args
  BOOST_TEST((choose_route(Kind::Gather, true, true) == Route::PointToPoint));  // no lane plan
  BOOST_TEST((choose_route(Kind::AllToAll, true, true) == Route::PointToPoint));
  BOOST_TEST((choose_route(Kind::Barrier, true, true) == Route::Lane));
}

BOOST_AUTO_TEST_CASE(a_peer_dtype_code_past_the_table_is_a_version_mismatch) {
  std::vector<CallDescription> calls = {all_reduce_call(), all_reduce_call(), all_reduce_call()};
  calls[2].fp.dtype = static_cast<std::uint8_t>(kNumDTypes);  // a newer build's next dtype
  const auto text = verdict(calls, 0, kMembers, "all_reduce (call #1 on the world group)");
  BOOST_TEST(says(text, "peer rank 6 sent dtype code " + std::to_string(kNumDTypes) +
                            " which this build does not know"));
  BOOST_TEST(says(text, "it was built with a newer shmdist; rebuild every rank from the same "
                        "version"));
  BOOST_TEST(!says(text, "disagree"));
  // Described without throwing (the description is also used in hang reports).
  BOOST_TEST(describe_call(calls[2], kMembers).find("dtype code " + std::to_string(kNumDTypes)) !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_peer_collective_code_past_the_table_is_a_version_mismatch) {
  std::vector<CallDescription> calls = {all_reduce_call(), all_reduce_call(), all_reduce_call()};
  calls[1].fp.kind = 200;
  const auto text = verdict(calls, 0, kMembers, "all_reduce (call #1 on the world group)");
  BOOST_TEST(says(text, "peer rank 5 sent collective code 200 which this build does not know"));
  BOOST_TEST(says(text, "rebuild every rank from the same version"));
  BOOST_TEST(describe_call(calls[1], kMembers).find("unknown to this build") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_known_disagreement_is_still_a_disagreement) {
  std::vector<CallDescription> calls = {all_reduce_call(), all_reduce_call(), all_reduce_call()};
  calls[1].fp.dtype = static_cast<std::uint8_t>(kFloat64);
  BOOST_TEST(says(verdict(calls, 0, kMembers, "all_reduce"),
                  "group rank 1 (global rank 5) called all_reduce(op=SUM, torch.float64, 10 "
                  "elements) but group rank 0 (global rank 4) called all_reduce(op=SUM, "
                  "torch.float32, 10 elements)"));
}
