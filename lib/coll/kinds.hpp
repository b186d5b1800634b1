// The collectives as one table: every kind, its name, what its fingerprint carries (and so
// what the members must agree on), its point-to-point schedule and its lane plan, and the one
// chooser that says which mechanism a call takes. The fingerprint (describe_call, verdict),
// the refusal path (reject_collective: a call's name to its kind), the C++ API (pg/) and the
// torch adapter (by name) read it; no other file lists the kinds.
//
// Adding a collective: one row here (SHMDIST_COLLECTIVE_KINDS, the next code: codes travel in
// fingerprints), its builder in coll/collectives.cpp (argument checks and point-to-point
// schedule, and the call of its lane plan when the row says it has one), its entry point in
// include/shmdist/process_group.hpp + pg/group_collectives.cpp and, for torch, its override in
// python/src/backend_collectives.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shmdist::coll {

// X(Kind, code, name, op, root, data, splits, lane, schedule)
//   op        takes a ReduceOp (agreed on; checked against the dtype, coll/reduce.hpp)
//   root      "src" or "dst" (a group rank agreed on), or nullptr
//   data      carries tensors: a dtype and an element count are agreed on
//   splits    counts differ per pair of members: the verdict checks them as a matrix
//   lane      the world lane has a plan for its data (coll/lane_plans.hpp); otherwise only
//             its agreement goes through the lane and its data move point to point
//   schedule  its point-to-point schedule, in words (coll/collectives.cpp builds it)
#define SHMDIST_COLLECTIVE_KINDS(X)                                                               \
  X(Broadcast, 1, "broadcast", false, "src", true, false, true,                                   \
    "the root sends its tensor to every other member")                                            \
  X(AllReduce, 2, "all_reduce", true, nullptr, true, false, true,                                 \
    "reduce-scatter by slice (member j reduces slice j of every input, in group-rank order), "    \
    "then every member sends its reduced slice to all others")                                    \
  X(Reduce, 3, "reduce", true, "dst", true, false, true,                                          \
    "the same reduce-scatter by slice, then the reduced slices go to the root only")              \
  X(AllGather, 4, "all_gather", false, nullptr, true, false, true,                                \
    "every member sends its input to every other member")                                         \
  X(AllGatherIntoTensor, 5, "all_gather_into_tensor", false, nullptr, true, false, true,          \
    "every member sends its input to every other member")                                         \
  X(Gather, 6, "gather", false, "dst", true, false, false,                                        \
    "every member sends its input to the root")                                                   \
  X(Scatter, 7, "scatter", false, "src", true, false, false,                                      \
    "the root sends part j to member j")                                                          \
  X(ReduceScatter, 8, "reduce_scatter", true, nullptr, true, false, true,                         \
    "member j receives part j from every member and reduces the parts in group-rank order")       \
  X(ReduceScatterTensor, 9, "reduce_scatter_tensor", true, nullptr, true, false, true,            \
    "member j receives part j from every member and reduces the parts in group-rank order")       \
  X(AllToAll, 10, "all_to_all", false, nullptr, true, true, false,                                \
    "member i sends its part j to member j")                                                      \
  X(AllToAllSingle, 11, "all_to_all_single", false, nullptr, true, true, false,                   \
    "member i sends its rows for j to member j")                                                  \
  X(MonitoredBarrier, 12, "monitored_barrier", false, nullptr, false, false, false,               \
    "the agreement alone; group rank 0 names the members missing at its timeout")                 \
  X(Barrier, 13, "barrier", false, nullptr, false, false, true,                                   \
    "the agreement alone (every member hears from every other)")

enum class Kind : std::uint8_t {
#define SHMDIST_COLLECTIVE_ENUMERATOR(kind, code, ...) kind = code,
  SHMDIST_COLLECTIVE_KINDS(SHMDIST_COLLECTIVE_ENUMERATOR)
#undef SHMDIST_COLLECTIVE_ENUMERATOR
};

struct KindInfo {
  Kind kind;
  const char* name;
  bool op;
  const char* root;
  bool data;
  bool splits;
  bool lane;
  const char* schedule;
};

inline constexpr KindInfo kKinds[] = {
#define SHMDIST_COLLECTIVE_ROW(kind, code, name, op, root, data, splits, lane, schedule) \
  {Kind::kind, name, op, root, data, splits, lane, schedule},
    SHMDIST_COLLECTIVE_KINDS(SHMDIST_COLLECTIVE_ROW)
#undef SHMDIST_COLLECTIVE_ROW
};

// The row of `kind`, or nullptr for a code no row has (a fingerprint from a newer build).
constexpr const KindInfo* find_kind(std::uint8_t code) {
  for (const KindInfo& k : kKinds)
    if (static_cast<std::uint8_t>(k.kind) == code) return &k;
  return nullptr;
}
// The row of a kind of this build (always found).
constexpr const KindInfo& kind_info(Kind kind) { return *find_kind(static_cast<std::uint8_t>(kind)); }
// The kind a name ("all_reduce") stands for, if any.
std::optional<Kind> kind_from_name(std::string_view name);
// "all_reduce, broadcast, ...": every name, for error messages (`data_only`: the kinds that
// carry tensors, those a runtime can refuse through reject_collective).
std::string kind_names(bool data_only);

const char* kind_name(Kind kind);
// False for a code no row has (a peer's fingerprint may carry one).
inline bool has_op(Kind k) {
  const KindInfo* row = find_kind(static_cast<std::uint8_t>(k));
  return row && row->op;
}
inline bool has_root(Kind k) {
  const KindInfo* row = find_kind(static_cast<std::uint8_t>(k));
  return row && row->root;
}
inline bool has_splits(Kind k) {
  const KindInfo* row = find_kind(static_cast<std::uint8_t>(k));
  return row && row->splits;
}

// Which mechanism a call takes, decided here only, alike on every member (the inputs are the
// same on all of them: the group, the kind and, through the agreement, the arguments):
//   Lane          the world group, the segment has a collective area and the row has a lane
//                 plan: the data move through the lane's slots (coll/lane_plans.hpp, which
//                 picks all_reduce's and reduce's direct or sliced algorithm by size and
//                 group size); a blocking call runs it in the caller's frame, an async one
//                 (or a blocking one interrupted by Timeout/PeerFailure) as a background
//                 Schedule;
//   PointToPoint  otherwise (sub-groups, no collective area, kinds without a lane plan, a
//                 member whose arguments are invalid): a Schedule of point-to-point steps
//                 (the row's `schedule`), after the fingerprint exchange, or on the world
//                 group after the lane's agreement round.
enum class Route : std::uint8_t { Lane, PointToPoint };
inline Route choose_route(Kind kind, bool world_lane, bool arguments_ok) {
  return world_lane && arguments_ok && kind_info(kind).lane ? Route::Lane : Route::PointToPoint;
}

}  // namespace shmdist::coll
