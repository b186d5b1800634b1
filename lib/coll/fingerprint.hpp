// The fingerprint of one member's collective call: what every other member compares its own
// call against before any data moves. Members disagreeing (another collective, op, dtype,
// element count, root, or a rank that rejected its own arguments) all reach the same verdict,
// because every member sees every member's fingerprint and judges them the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <shmdist/tensor.hpp>

#include "coll/kinds.hpp"

namespace shmdist::coll {

inline constexpr std::uint32_t kFingerprintMagic = 0x434f4c31;  // "COL1"

// Plain bytes on the wire (and, later, in the segment's collective area).
struct Fingerprint {
  std::uint32_t magic = kFingerprintMagic;
  std::uint8_t kind = 0;      // Kind (coll/kinds.hpp)
  std::uint8_t op = 0;        // ReduceOp, 0 when the collective has none
  std::uint8_t dtype = 0;     // DType
  std::uint8_t rejected = 0;  // 1: this member's own arguments were invalid
  std::int32_t root = -1;     // group rank of src/dst, -1 when there is none
  std::uint32_t group_size = 0;
  std::uint64_t seq = 0;      // this call's number among the group's collectives
  std::int64_t count = 0;     // elements that must agree (per member), 0 with splits
};
static_assert(sizeof(Fingerprint) == 32);

// What a member says about its call: the fixed part, and for all_to_all the elements it sends
// to and expects from each group rank.
struct CallDescription {
  Fingerprint fp;
  std::vector<std::int64_t> send_counts;  // has_splits only, one per group rank
  std::vector<std::int64_t> recv_counts;
};

// Wire size for a group of n: the fingerprint plus 2n counts (zero unless has_splits), so that
// every fingerprint of a group has the same size whatever call it describes.
inline std::size_t wire_size(int n) { return sizeof(Fingerprint) + 16 * std::size_t(n); }
void encode(const CallDescription& call, int n, std::byte* wire);
CallDescription decode(const std::byte* wire, int n);

// "all_reduce(op=SUM, torch.float32, 10 elements)"; roots are shown as global ranks.
std::string describe_call(const CallDescription& call, std::span<const int> members);

// The verdict on every member's call (indexed by group rank; `me` is this member): an
// InvalidArgument text when they disagree, naming the first disagreeing group rank and both
// calls, nullopt when they agree. A member that rejected its own arguments is named too,
// except on that member itself (`own_error` is its text, thrown as it is).
std::optional<std::string> verdict(std::span<const CallDescription> calls, int me,
                                   const std::vector<int>& members, const std::string& what);
// The same, naming the call only when there is something to say (`what` is called then): a
// verdict of agreement, every call's, allocates nothing.
std::optional<std::string> verdict(std::span<const CallDescription> calls, int me,
                                   std::span<const int> members,
                                   const std::function<std::string()>& what);

}  // namespace shmdist::coll
