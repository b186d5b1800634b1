// What a Group handle refers to.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace shmdist::detail {

// A hash of a group's member list, never 0 (which is the world's): part of every match key,
// so that groups with different members never match each other's messages.
inline std::uint32_t members_signature(const std::vector<int>& members) {
  std::uint32_t h = 2166136261u;  // FNV-1a over the member list
  for (int m : members) {
    for (int i = 0; i < 4; ++i) {
      h ^= static_cast<std::uint32_t>(m >> (8 * i)) & 0xffu;
      h *= 16777619u;
    }
  }
  return h | 1u;
}

struct GroupInfo {
  const void* owner = nullptr;  // the ProcessGroup::Impl that created it
  std::uint32_t id = 0;         // 0 = world; then creation order
  std::uint32_t sig = 0;        // hash of `members` (0 for the world)
  std::vector<int> members;     // global ranks, sorted: group rank = index
  int my_rank = -1;             // this rank's group rank, -1 if not a member

  int group_rank_of(int global_rank) const {
    auto it = std::lower_bound(members.begin(), members.end(), global_rank);
    return it != members.end() && *it == global_rank ? static_cast<int>(it - members.begin()) : -1;
  }
};

}  // namespace shmdist::detail
