// How every message and report names a group: the world is group 0, new_group's groups are
// numbered 1, 2, ... in creation order (groups.cpp), a runtime's own groups by their ids.
#pragma once

#include <cstdint>
#include <string>

namespace shmdist::engine {

// As a label, e.g. in parentheses: "world group", "group #3".
inline std::string group_label(std::uint32_t id) {
  return id == 0 ? std::string("world group") : "group #" + std::to_string(id);
}

// In a sentence: "the world group", "group #3".
inline std::string group_name(std::uint32_t id) {
  return id == 0 ? "the " + group_label(id) : group_label(id);
}

}  // namespace shmdist::engine
